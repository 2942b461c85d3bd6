"""Where a rollout's state lives: not in the controller. One JSON document per model, {"current": the rollout in
progress or null, "history": finished rollouts with their outcome and figures, "revision": n}, written as a whole
with the revision it was read at, so that a stale writer fails instead of overwriting (a file under a lock here, a
ConfigMap on a cluster). A running controller also holds the store's lock (`exclusive`): a file lock here, a Lease
on a cluster."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from settings.errors import UserError

EMPTY = {"current": None, "history": []}


class StateConflictError(UserError, RuntimeError):
    """Someone else wrote the rollout state since it was read; read it again."""

    exit_code = 2


class Holding:
    """What a controller holds while it runs; `lost` says why it no longer does (its lease was taken over, or not
    renewed in time). `valid_until` (monotonic seconds, None for a lock that cannot expire) is when the holding ends
    unless renewed: every write checks it first (`check`), so a controller that stalled stops before it writes."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.lost = ""
        self.valid_until: float | None = None
        self.monotonic = monotonic

    def expired(self) -> bool:
        """Whether the holding is lost or has run out (then `lost` says why)."""
        if not self.lost and self.valid_until is not None and self.monotonic() > self.valid_until:
            self.lost = "it was not renewed within its renew deadline"
        return bool(self.lost)

    def check(self) -> None:
        """The fence before each write: raises StateConflictError once the holding is lost or has run out."""
        if self.expired():
            raise StateConflictError(f"this controller lost its lease ({self.lost}); it stopped before its next "
                                     "write; see `mlops rollout status`.")


class StateStore(ABC):
    @abstractmethod
    def load(self) -> tuple[dict[str, Any], str]:
        """The state document and a token naming this revision of it."""

    @abstractmethod
    def save(self, document: dict[str, Any], token: str) -> str:
        """Writes `document` if the stored revision is still `token`; returns the new token or raises
        StateConflictError."""

    def fence(self) -> None:  # noqa: B027 (a file lock cannot be lost: nothing to check)
        """Raises StateConflictError when the lock this store holds for a controller is lost (a Lease can be; a file
        lock cannot), so that every write stops first."""

    @abstractmethod
    def exclusive(self, wait_s: float = 0.0) -> contextlib.AbstractContextManager[Holding]:
        """Held by a running controller for the whole command; a second one waits up to `wait_s` seconds, then
        raises ControllerBusyError naming the holder and since when it holds the lock."""


class ControllerBusyError(UserError, RuntimeError):
    """Another controller is running this model's rollout."""

    exit_code = 2


def busy_message(holder: str, held_s: float, waited_s: float) -> str:
    waited = f" after waiting {waited_s:.1f}s" if waited_s > 0 else ""
    return (f"another rollout controller ({holder}) has held this model's rollout for {held_s:.0f}s{waited}; wait "
            "for it to finish or stop it, then run the command again (`--set rollout.lease_wait_seconds=N` waits up "
            "to N seconds).")


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

    def _exclusive(self, wait_s: float = 0.0) -> Iterator[Holding]:
        self.folder.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + wait_s
        with open(self.lock_path, "a+") as lock:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() < deadline:
                        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                        continue
                    lock.seek(0)
                    holder, _, since = lock.read().strip().partition(" since ")
                    held_s = max(0.0, time.time() - float(since)) if since else 0.0
                    raise ControllerBusyError(busy_message(holder or "another process", held_s, wait_s)) from None
            lock.seek(0)
            lock.truncate()
            lock.write(f"pid {os.getpid()} since {time.time():.3f}")
            lock.flush()
            try:
                yield Holding()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # Decorated apart from its body: mutmut makes no mutant of a decorated function.
    exclusive = contextlib.contextmanager(_exclusive)
