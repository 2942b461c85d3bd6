"""The pipeline definition, its typed config, the runners and the `mlops` command line."""
import time

# When `mlops` began (this package is its first import): the run time it prints includes the start-up.
STARTED = time.monotonic()

import components  # noqa: E402, F401  (selects Keras 2 before TensorFlow is imported; timed from STARTED)
