"""Custom TFX components and the module code that the standard components load.

TFX 1.16's Trainer, tensorflow-model-optimization and the converters need Keras 2: this is the one
place that selects it, before anything imports TensorFlow.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
