"""Runs N training workers as local processes on 127.0.0.1, each with its own TF_CONFIG.

Each worker runs in its own process group and is ended with its group, on success, failure or Ctrl-C. A worker
that is killed (a signal, or an exit code of 128 and above, which is what a worker that lost a peer returns) makes
the launcher restart the whole group: MultiWorkerMirroredStrategy's collective ops cannot continue with a new
peer, and every worker resumes from the BackupAndRestore backup. Exit codes 1 to 127 are errors that a restart
would repeat (the same policy as the TFJob `ExitCode` restart policy); they fail the launch with the log tail.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from components.distributed.cluster import free_ports, tf_config
from settings.errors import UserError

HOST = "127.0.0.1"
TAIL_LINES = 40
# Seconds a worker gets to end after SIGTERM before SIGKILL.
TERMINATE_GRACE_SECONDS = 5.0

# Called with (worker index, one line of its output) for every line a worker prints.
LineSink = Callable[[int, str], None]


class WorkerFailedError(UserError, RuntimeError):
    """A worker failed in a way a restart would not fix, or the restarts ran out; the message has its log tail."""

    exit_code = 1
    prefix = "training failed"


@dataclass
class LaunchResult:
    workers: int
    attempts: int
    seconds: float
    log_dir: str
    # Log file of each worker, per attempt: log_files[attempt][index].
    log_files: list[list[str]] = field(default_factory=list)


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen
    log_path: str
    tail: collections.deque
    reader: threading.Thread


def retryable(returncode: int) -> bool:
    """True for a worker that was killed (a signal) or lost a peer (exit code 128 and above)."""
    return returncode < 0 or returncode >= 128


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def _pump(stream, index: int, log_path: str, header: str, tail: collections.deque, sink: LineSink) -> None:
    with open(log_path, "w", buffering=1) as log:
        log.write(f"{time.strftime('%H:%M:%S')} [launcher] {header}\n")
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            # Python's own logging in the worker has no time stamps; the log file gets them here.
            log.write(f"{time.strftime('%H:%M:%S')} {line}\n")
            tail.append(line)
            try:
                sink(index, line)
            except Exception as error:  # noqa: BLE001  (a broken sink must not stop draining the pipe)
                log.write(f"{time.strftime('%H:%M:%S')} [launcher] could not pass this line on: {error!r}\n")
    stream.close()


def _print_line(index: int, line: str) -> None:
    print(f"[worker {index}] {line}", flush=True)


def _end_group(process: subprocess.Popen) -> None:
    """SIGTERM to the worker's process group, SIGKILL after the grace period."""
    if process.poll() is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything the worker left in its group
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(TERMINATE_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def _worker_group(
    spec_path: str, workers: int, repo_root: str, log_dir: str, sink: LineSink
) -> Iterator[list[_Worker]]:
    ports = free_ports(workers, HOST)
    addresses = [f"{HOST}:{port}" for port in ports]
    os.makedirs(log_dir, exist_ok=True)
    group: list[_Worker] = []
    try:
        for index in range(workers):
            env = dict(os.environ)
            env["TF_CONFIG"] = json.dumps(tf_config(addresses, index))
            # The worker imports this checkout's `components`, whatever else is installed.
            env["PYTHONPATH"] = os.pathsep.join([repo_root, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else repo_root
            process = subprocess.Popen(
                [sys.executable, "-m", "components.distributed.worker", spec_path, "--parent-pid", str(os.getpid())],
                cwd=repo_root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            log_path = os.path.join(log_dir, f"worker-{index}.log")
            tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
            header = f"worker {index} is pid {process.pid} with TF_CONFIG {env['TF_CONFIG']}"
            reader = threading.Thread(
                target=_pump, args=(process.stdout, index, log_path, header, tail, sink), name=f"worker-{index}-log",
                daemon=True,
            )
            reader.start()
            group.append(_Worker(index, process, log_path, tail, reader))
        yield group
    finally:
        for worker in group:
            _end_group(worker.process)
        for worker in group:
            worker.reader.join(timeout=10)


def _wait(group: list[_Worker], deadline: float | None, poll_seconds: float) -> _Worker | None:
    """Waits until all workers succeeded (returns None) or one failed (returns it, preferring a killed one)."""
    while True:
        codes = [w.process.poll() for w in group]
        failed = [w for w, code in zip(group, codes, strict=True) if code not in (None, 0)]
        if failed:
            return next((w for w in failed if retryable(w.process.returncode)), failed[0])
        if all(code == 0 for code in codes):
            return None
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("the workers did not finish in time")
        time.sleep(poll_seconds)


def _failure_message(worker: _Worker, attempt: int, attempts: int, reason: str) -> str:
    worker.reader.join(timeout=10)
    tail = "\n".join(f"    {line}" for line in worker.tail)
    return (
        f"worker {worker.index} {describe_exit(worker.process.returncode)} on attempt {attempt + 1} of {attempts}"
        f"{reason}; fix what its log shows and run again. Last lines of {worker.log_path}:\n{tail}"
    )


def launch_local_workers(
    spec_path: str,
    workers: int,
    repo_root: str,
    log_dir: str,
    max_restarts: int = 2,
    on_line: LineSink = _print_line,
    timeout_seconds: float | None = None,
    poll_seconds: float = 0.2,
) -> LaunchResult:
    """Runs `python -m components.distributed.worker spec_path` as `workers` processes until all succeed.

    Logs go to `log_dir/attempt-<k>/worker-<i>.log` and, line by line, to `on_line`. Raises WorkerFailedError
    (with the failing worker's log tail) when a worker fails for good or after `max_restarts` restarts.
    """
    if workers < 1:
        raise ValueError("workers must be at least 1.")
    started = time.monotonic()
    deadline = started + timeout_seconds if timeout_seconds else None
    attempts = max_restarts + 1
    result = LaunchResult(workers=workers, attempts=0, seconds=0.0, log_dir=log_dir)
    for attempt in range(attempts):
        attempt_dir = str(Path(log_dir, f"attempt-{attempt}"))
        result.attempts = attempt + 1
        with _worker_group(spec_path, workers, repo_root, attempt_dir, on_line) as group:
            result.log_files.append([w.log_path for w in group])
            try:
                failed = _wait(group, deadline, poll_seconds)
            except TimeoutError:
                raise WorkerFailedError(
                    f"the {workers} workers did not finish within {timeout_seconds:.0f}s; their logs are in "
                    f"{attempt_dir}. Raise the timeout or lower training.train_steps."
                ) from None
            if failed is None:
                result.seconds = time.monotonic() - started
                return result
            if not retryable(failed.process.returncode):
                raise WorkerFailedError(_failure_message(failed, attempt, attempts, ""))
            if attempt + 1 == attempts:
                raise WorkerFailedError(_failure_message(failed, attempt, attempts, ", and no restart is left"))
            on_line(failed.index, f"{describe_exit(failed.process.returncode)}; restarting all {workers} workers "
                                  f"from the last backup (attempt {attempt + 2} of {attempts})")
    raise AssertionError("unreachable")  # the loop returns or raises
