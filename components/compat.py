"""The switches this project sets inside TensorFlow and TFX, in one place, each fenced against upgrades.

- Keras 2: TFX 1.16's Trainer, tensorflow-model-optimization and the converters need `tf_keras`; TensorFlow reads
  TF_USE_LEGACY_KERAS once, at its import, so `select_legacy_keras` runs before anything imports TensorFlow
  (components/__init__.py calls it).
- TensorFlow's C++ log: TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, at its import, and worker processes inherit it.
  The `mlops` command calls `select_native_log_level` before any import of TensorFlow; `mlops run` points fd 2,
  where those lines go, at its log (pipeline/runner.py).
- AutoGraph: TF 2.16 tells AutoGraph to leave `keras` alone but not `tf_keras`, so every first `model.fit`
  re-transpiles Keras' own training loop (about a minute on 2 cores). The rule that skips it lives in a private
  module; when that module changes, training still works, only slower, and a warning says so.
- Beam's DoFn introspection: building and translating a pipeline asks `userstate.get_dofn_specs` about the same DoFn
  instance again and again (about 8,000 calls for the taxi job's Beam stages), each one `inspect.signature` over
  all of its methods. `cache_dofn_specs` remembers the answer per instance; where Beam's function is not the one
  this was written for, nothing changes (only slower).
"""
from __future__ import annotations

import logging
import os

LEGACY_KERAS_VARIABLE = "TF_USE_LEGACY_KERAS"
NATIVE_LOG_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"


def select_legacy_keras() -> None:
    """Makes `tf.keras` mean tf_keras (Keras 2) for this process and the processes it starts."""
    os.environ.setdefault(LEGACY_KERAS_VARIABLE, "1")


def select_native_log_level(into_log: bool) -> None:
    """Sets the level of TensorFlow's C++ log for this process and the processes it starts (a user's own wins):
    warnings and errors where they go to a log (INFO is oneDNN and CPU-feature notices at every import), nothing
    where they would reach the console (CUDA plug-in registration errors on every machine without a GPU)."""
    os.environ.setdefault(NATIVE_LOG_LEVEL_VARIABLE, "1" if into_log else "3")


def skip_autograph_for_tf_keras() -> bool:
    """Adds a do-not-convert rule for `tf_keras` to AutoGraph; returns whether the rule is in place."""
    try:
        from tensorflow.python.autograph.core import config as autograph_config

        rules = autograph_config.CONVERSION_RULES
        if not any(getattr(rule, "module_prefix", None) == "tf_keras" for rule in rules):
            autograph_config.CONVERSION_RULES = (autograph_config.DoNotConvert("tf_keras"), *rules)
        return True
    except (ImportError, AttributeError, TypeError) as error:
        logging.getLogger(__name__).warning(
            "could not tell AutoGraph to skip tf_keras (%s); training works, but the first fit is slower", error)
        return False


def cache_dofn_specs() -> bool:
    """Makes Beam's `get_dofn_specs` remember its answer per DoFn instance; returns whether the cache is in place.
    A DoFn's methods are fixed once it is built, and the answer is the same sets each time."""
    import weakref

    from apache_beam.transforms import userstate

    original = userstate.get_dofn_specs
    if getattr(original, "cached_per_instance", False):
        return True
    if original.__module__ != "apache_beam.transforms.userstate" or original.__code__.co_argcount != 1:
        logging.getLogger(__name__).warning("Beam's get_dofn_specs is not the one expected; it is left uncached")
        return False
    answers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_dofn_specs(dofn):  # noqa: ANN001, ANN202  (Beam's own signature)
        try:
            return answers[dofn]
        except KeyError:
            pass
        except TypeError:  # an unhashable or non-weak-referenceable DoFn: asked every time, as before
            return original(dofn)
        answer = original(dofn)
        try:
            answers[dofn] = answer
        except TypeError:
            pass
        return answer

    get_dofn_specs.cached_per_instance = True
    userstate.get_dofn_specs = get_dofn_specs
    return True
