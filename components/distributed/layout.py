"""Where multi-worker training keeps its files, all below the Trainer's model_run folder (the pipeline root)."""
from __future__ import annotations

import os


def workers_dir(model_run_dir: str) -> str:
    """The worker spec and the per-attempt worker logs."""
    return os.path.join(model_run_dir, "workers")


def scratch_dir(model_run_dir: str, index: int) -> str:
    """A non-chief worker's SavedModel and TensorBoard logs, which nobody reads; removed after training."""
    return os.path.join(workers_dir(model_run_dir), "scratch", f"worker-{index}")


def backup_dir(model_run_dir: str) -> str:
    """BackupAndRestore's state at the last epoch end; removed when training ends normally."""
    return os.path.join(model_run_dir, "backup")
