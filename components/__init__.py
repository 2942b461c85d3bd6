"""Custom TFX components and the module code that the standard components load.

Importing this package selects Keras 2 (components/compat.py) before anything imports TensorFlow.
"""
from components.compat import select_legacy_keras

select_legacy_keras()
