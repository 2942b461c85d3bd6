"""Custom TFX components and the module code that the standard components load.

TFX 1.16's Trainer, tensorflow-model-optimization and the converters need Keras 2: this is the one
place that selects it, before anything imports TensorFlow.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tensorflow.python.autograph.core import config as _autograph_config  # noqa: E402

# TF 2.16 tells AutoGraph to leave `keras` alone but not `tf_keras`: without this rule every first
# model.fit re-transpiles Keras' own training loop, about a minute on a 2-core machine.
if not any(getattr(rule, "module_prefix", None) == "tf_keras" for rule in _autograph_config.CONVERSION_RULES):
    _autograph_config.CONVERSION_RULES = (
        _autograph_config.DoNotConvert("tf_keras"),
    ) + _autograph_config.CONVERSION_RULES
