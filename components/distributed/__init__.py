"""Multi-worker training: the worker spec and entry point, the local launcher, the TFJob backend, and the
Trainer executor that picks one of them (`training.workers`, `training.backend`)."""
