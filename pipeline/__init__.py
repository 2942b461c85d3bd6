"""The pipeline definition, its typed config, the runners and the `mlops` command line."""
import components  # noqa: F401  (selects Keras 2 before TensorFlow is imported)
