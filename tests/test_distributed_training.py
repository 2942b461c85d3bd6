"""Multi-worker training on 127.0.0.1 with real worker processes: a pipeline run whose worker is SIGKILLed
mid-training and resumes from the backup, one worker against two, a worker that fails for good, and no process
left behind when the launcher is interrupted or killed.

One pipeline run (two workers) provides the Transform output that the other tests train from directly.
"""
import glob
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import tensorflow as tf

from components.distributed.executor import REPO_ROOT
from components.distributed.launcher import WorkerFailedError
from pipeline.runner import run_local
from pipeline.training import latest_transform_output, train, training_spec
from tests.conftest import small_config

WORKER_MODULE = "components.distributed.worker"
# Four short epochs, so that a worker can be killed after the first backup with epochs left to resume. Dropout is
# off: each replica would draw its own mask, the one difference between one and two workers beyond float sums.
FAST = ["training.train_steps=40", "training.steps_per_epoch=10", "training.eval_steps=5", "training.dropout=0.0"]
EPOCH_LINE = re.compile(r"Epoch (\d+)/(\d+)")


def worker_processes(marker: str = WORKER_MODULE) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if marker in " ".join(process.info["cmdline"] or []) and WORKER_MODULE in " ".join(process.info["cmdline"]):
            found.append(process)
    return found


def worker_index(process: psutil.Process) -> int | None:
    try:
        return json.loads(process.environ().get("TF_CONFIG", "{}"))["task"]["index"]
    except (psutil.Error, KeyError, ValueError):
        return None


def epochs_started(log: Path) -> list[int]:
    return [int(m.group(1)) for m in EPOCH_LINE.finditer(log.read_text(errors="replace"))] if log.exists() else []


class KillWorkerAfterFirstBackup(threading.Thread):
    """SIGKILLs worker `index` of the first attempt once its log shows epoch 2 beginning, i.e. after the epoch-1
    backup was written (tf_keras prints the epoch line after every callback of the previous epoch has run)."""

    def __init__(self, model_run_root: str, index: int = 1):
        super().__init__(daemon=True)
        self.model_run_root, self.index = model_run_root, index
        self.stop, self.killed_pid = threading.Event(), None

    def run(self) -> None:
        while not self.stop.wait(0.3):
            for log in glob.glob(f"{self.model_run_root}/*/workers/attempt-0/worker-{self.index}.log"):
                if any(epoch >= 2 for epoch in epochs_started(Path(log))):
                    for process in worker_processes(os.path.dirname(os.path.dirname(os.path.dirname(log)))):
                        if worker_index(process) == self.index:
                            process.send_signal(signal.SIGKILL)
                            self.killed_pid = process.pid
                            return


@pytest.fixture(scope="module")
def two_worker_run(taxi_slice, tmp_path_factory):
    # Optimizer and Exporter have their own tests; here they pass the model through as it is.
    config = small_config(taxi_slice, tmp_path_factory.mktemp("outputs"), "training.workers=2", *FAST,
                          "optimize.prune=false", "export.formats=[saved_model]")
    killer = KillWorkerAfterFirstBackup(os.path.abspath(os.path.join(config.pipeline_root, "Trainer", "model_run")))
    killer.start()
    try:
        summary = run_local(config, out=io.StringIO())
    finally:
        killer.stop.set()
        killer.join()
    return config, summary, killer


def eval_auc(model_dir: str, config) -> float:
    """AUC of a SavedModel on the eval split's raw tf.Examples (what TFMA scores), labels from its Transform graph."""
    files = glob.glob(os.path.join(config.pipeline_root, "CsvExampleGen", "examples", "*", "Split-eval", "*"))
    model = tf.saved_model.load(model_dir)
    auc = tf.keras.metrics.AUC()
    for batch in tf.data.TFRecordDataset(files, compression_type="GZIP").batch(256):
        labels = model.signatures["transform_features"](examples=batch)[config.label.name]
        probabilities = model.signatures["serving_examples"](examples=batch)["probabilities"]
        auc.update_state(tf.reshape(labels, [-1]), probabilities)
    return float(auc.result())


def test_pipeline_survives_a_killed_worker_and_resumes_from_the_backup(two_worker_run):
    config, summary, killer = two_worker_run
    assert killer.killed_pid, "worker 1 should have been killed during the first attempt"
    assert summary.blessed and summary.pushed_path, "the run succeeds and pushes despite the killed worker"
    (model_run,) = glob.glob(os.path.join(config.pipeline_root, "Trainer", "model_run", "*"))
    attempts = sorted(name for name in os.listdir(os.path.join(model_run, "workers")) if name.startswith("attempt"))
    assert attempts == ["attempt-0", "attempt-1"], "one restart of the whole group"
    for index in (0, 1):
        before = epochs_started(Path(model_run, "workers", "attempt-0", f"worker-{index}.log"))
        after = epochs_started(Path(model_run, "workers", "attempt-1", f"worker-{index}.log"))
        assert max(before) >= 2
        assert after and after[0] >= 2, f"worker {index} restarted at epoch {after[:1]}, not from the backup"
        assert after[-1] == 4, "and trained to the last epoch"
    assert not os.path.exists(os.path.join(model_run, "backup")), "the backup is removed after a normal end"
    # Workers are found by this run's folder: other runs on the machine (a parallel suite) have their own.
    assert not worker_processes(str(config.output_root)), "no worker process is left"


def test_only_the_chief_writes_the_model_and_the_tensorboard_logs(two_worker_run):
    config, summary, _ = two_worker_run
    (model_run,) = glob.glob(os.path.join(config.pipeline_root, "Trainer", "model_run", "*"))
    assert sorted(os.listdir(model_run)) == ["train", "validation", "workers"]
    assert sorted(os.listdir(os.path.join(model_run, "workers"))) == ["attempt-0", "attempt-1", "spec.json"], \
        "the other worker's scratch folder (its SavedModel and TensorBoard logs) is gone"
    chief_pids = {re.search(r"worker 0 is pid (\d+)", Path(log).read_text()).group(1)
                  for log in glob.glob(os.path.join(model_run, "workers", "attempt-*", "worker-0.log"))}
    writers = {re.search(r"\.(\d+)\.\d+\.v2$", event).group(1)
               for event in glob.glob(os.path.join(model_run, "*", "events.out.tfevents.*"))}
    assert writers and writers <= chief_pids, "TensorBoard events come from the chief of each attempt only"
    (model,) = glob.glob(os.path.join(config.pipeline_root, "Trainer", "model", "*"))
    # The SavedModel, for the Optimizer and Exporter the Keras model beside it, and for the run report the per-epoch
    # history: the chief's only.
    assert sorted(os.listdir(model)) == ["Format-Serving", "keras", "training_history.json"]
    assert summary.training["epochs"]["loss"] and summary.training["epochs"]["val_loss"]
    assert (Path(summary.pushed_path) / "saved_model.pb").exists()
    assert len(os.listdir(config.serving_dir)) == 1


def test_two_workers_reach_the_auc_of_one_worker(two_worker_run):
    """Same global batch (the config's batch_size, split between the workers) and the same steps."""
    config, _, _ = two_worker_run
    results = {}
    for workers in (1, 2):
        one_config = small_config(Path(config.data.path), Path(config.output_root), f"training.workers={workers}",
                                  *FAST)
        results[workers] = train(one_config, out=io.StringIO())
        time.sleep(1)  # train() names its folder by the second
    aucs = {workers: eval_auc(result.serving_model_dir, config) for workers, result in results.items()}
    assert aucs[1] > 0.8
    # The issue asks for 0.01. With one seed, the same examples in every step and no dropout, the two runs differ
    # only in the order of float sums (they agreed to 4 decimals on this machine), so the tighter bound leaves a
    # mistake in how the workers split the data little room to hide.
    assert abs(aucs[1] - aucs[2]) < 0.002, aucs
    worker_1_log = Path(results[2].logs, "attempt-0", "worker-1.log").read_text()
    assert "worker 1 of 2 (chief: False): 2 replicas, global batch 64, 32 per replica" in worker_1_log


def test_a_worker_failing_for_good_fails_with_its_log_tail(two_worker_run):
    config, _, _ = two_worker_run
    bad = small_config(Path(config.data.path), Path(config.output_root), "training.workers=2",
                       "training.activation=relux", *FAST)
    runs_before = set(glob.glob(os.path.join(config.output_root, "train", "*")))
    started = time.monotonic()
    with pytest.raises(WorkerFailedError) as error:
        train(bad, out=io.StringIO())
    message = str(error.value)
    assert re.search(r"^worker [01] exited with code 1 on attempt 1 of 3; fix what its log shows", message), message
    assert "relux" in message, "the tail of the failing worker's log is in the error"
    assert not worker_processes(str(config.output_root)), "the other worker was ended too"
    (bad_run,) = set(glob.glob(os.path.join(config.output_root, "train", "*"))) - runs_before
    assert not os.path.exists(os.path.join(bad_run, "model")), "no model"
    assert len(os.listdir(config.serving_dir)) == 1, "nothing new is pushed"
    assert time.monotonic() - started < 120, "a permanent failure is not restarted"


def _start_launcher(spec_path: str, log_dir: str) -> subprocess.Popen:
    code = ("import components, sys; from components.distributed.launcher import launch_local_workers; "
            f"launch_local_workers({spec_path!r}, 2, {REPO_ROOT!r}, {log_dir!r}, on_line=lambda i, l: None)")
    # A shell that started the tests in the background ignores SIGINT, and children inherit that: the launcher gets
    # the default disposition back, as a terminal's ctrl-c would find it.
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "launcher-killed"])
def test_no_worker_outlives_an_interrupted_launcher(two_worker_run, tmp_path, stop_signal):
    config, _, _ = two_worker_run
    spec = training_spec(config, latest_transform_output(config), str(tmp_path / "run"))
    spec_path = spec.save(str(tmp_path / "run" / "spec.json"))
    launcher = _start_launcher(spec_path, str(tmp_path / "logs"))
    try:
        deadline = time.monotonic() + 60
        while len(worker_processes(spec_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(worker_processes(spec_path)) == 2
        time.sleep(2)
        launcher.send_signal(stop_signal)
        launcher.wait(30)
        # A killed launcher cannot end its workers: they notice within a second of loading TensorFlow.
        deadline = time.monotonic() + 60
        while worker_processes(spec_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not worker_processes(spec_path)
    finally:
        for process in worker_processes(spec_path):
            process.kill()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
