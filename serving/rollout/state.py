"""Where a rollout's state lives: not in the controller. One JSON document per model, {"current": the rollout in
progress or null, "history": finished rollouts with their outcome and figures}, written as a whole with a version
token so that a stale writer fails instead of overwriting (a file under a lock here, a ConfigMap on a cluster)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EMPTY = {"current": None, "history": []}


class StateConflictError(RuntimeError):
    """Someone else wrote the rollout state since it was read; read it again."""


class StateStore(ABC):
    @abstractmethod
    def load(self) -> tuple[dict[str, Any], str]:
        """The state document and a token naming this revision of it."""

    @abstractmethod
    def save(self, document: dict[str, Any], token: str) -> str:
        """Writes `document` if the stored revision is still `token`; returns the new token or raises
        StateConflictError."""

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held by a running controller; a second one waits for nothing and fails (see LocalStateStore)."""
        yield


class ControllerBusyError(RuntimeError):
    """Another controller is running this model's rollout."""


class LocalStateStore(StateStore):
    """`<repository>/.rollouts/<model>.json`, replaced atomically; a lock file marks the running controller (the
    kernel drops the lock when its process dies, SIGKILL included)."""

    def __init__(self, base_dir: str | Path, model: str) -> None:
        self.folder = Path(base_dir) / ".rollouts"
        self.path = self.folder / f"{model}.json"
        self.lock_path = self.folder / f"{model}.lock"

    def load(self) -> tuple[dict[str, Any], str]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return json.loads(json.dumps(EMPTY)), "0"
        document = json.loads(text)
        return document, str(document.get("revision", 0))

    def save(self, document: dict[str, Any], token: str) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".state.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _, current = self.load()
            if current != token:
                raise StateConflictError(f"the rollout state in {self.path} changed (revision {current}, expected "
                                         f"{token}); another controller is running.")
            document = {**document, "revision": int(token) + 1}
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.folder)
            with os.fdopen(fd, "w") as f:
                json.dump(document, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        return str(document["revision"])

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                holder = lock.read().strip() or "another process"
                raise ControllerBusyError(f"a rollout controller ({holder}) is already running for this model; wait "
                                          "for it or stop it, then run the command again.") from None
            lock.seek(0)
            lock.truncate()
            lock.write(f"pid {os.getpid()}")
            lock.flush()
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
