"""Real `mlops serve` processes (a stable and a canary track) over a repository of tiny SavedModels, a client thread
that keeps calling the stable servers, and the rollout config pointing at them."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from serving.repository.local import ModelRepository
from tests.serving.conftest import save_tiny_model

MODEL = "tiny"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Version -> bias. 1, 2, 5 and 6 agree within the rollout tolerance (|diff| <= 5e-4 < 1e-3), yet every answer
# still tells which version gave it; 3 disagrees; 4 is not a SavedModel TF can load.
BIAS = {1: -3.0, 2: -2.998, 3: 3.0, 5: -2.999, 6: -2.997}
GOLDEN_CSV = "fare,trip_start_hour,payment_type,tips\n" + "".join(
    f"{1.5 * i},{i % 24},{'Cash' if i % 3 else 'Credit Card'},{i % 5}\n" for i in range(24))
ROW = {"fare": 2.5, "trip_start_hour": 7, "payment_type": "Cash"}
READY = re.compile(r"serving REST on (\S+) and gRPC on (\S+)")


def probability(row: dict, version: int) -> float:
    cash = 1.0 if row["payment_type"] == "Cash" else 0.0
    logit = BIAS[version] + 0.1 * row["fare"] + 0.01 * row["trip_start_hour"] - cash
    return 1.0 / (1.0 + math.exp(-logit))


def answering_version(value: float) -> int | None:
    for version in BIAS:
        if abs(probability(ROW, version) - value) < 1e-6:
            return version
    return None


class ServeProcess:
    """`python -m serving.cli serve --model-config FILE` on free loopback ports (or the REST port and address given)."""

    def __init__(self, config_path: Path, log_path: Path, host: str = "127.0.0.1", rest_port: int = 0) -> None:
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "serve", "--model-config", str(config_path), "--host", host,
             "--rest-port", str(rest_port), "--grpc-port", "0", "--poll-seconds", "0.1",
             # A broken version is retried once, quickly, so its failure reaches the controller in a test's time.
             "--max_num_load_retries", "1", "--load_retry_interval_micros", "200000"],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"mlops serve exited with {self.process.wait()}; see {self.log.name}")
            match = READY.search(line)
            if match:
                self.rest, self.grpc = match.group(1), match.group(2)
                return
        raise TimeoutError("mlops serve did not print its ready line")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class StableClient(threading.Thread):
    """Calls the stable servers (label `stable` and unversioned, REST and gRPC in turn, ~40 requests a second) and
    counts failures and which version answered each unversioned request."""

    def __init__(self, rest: str, grpc: str) -> None:
        super().__init__(daemon=True)
        self.rest, self.grpc = rest, grpc
        self.stop_event = threading.Event()
        self.requests = 0
        self.failures: list[str] = []
        self.unversioned_answers: list[int | None] = []
        self.labelled_answers: list[int | None] = []

    def run(self) -> None:
        from serving.clients import GrpcClient, RestClient

        with RestClient(self.rest, retries=0) as rest, GrpcClient(self.grpc, retries=0) as grpc:
            while not self.stop_event.is_set():
                client = rest if self.requests % 2 == 0 else grpc
                label = "stable" if self.requests % 4 < 2 else None
                try:
                    [value] = client.predict(ROW, MODEL, label=label, timeout=5.0)
                    (self.labelled_answers if label else self.unversioned_answers).append(answering_version(value))
                except Exception as e:  # noqa: BLE001 - every failure counts, whatever its kind
                    self.failures.append(f"{type(e).__name__}: {e}")
                self.requests += 1
                self.stop_event.wait(0.025)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)


@pytest.fixture(scope="session")
def tiny_versions(tmp_path_factory) -> dict[int, Path]:
    folder = tmp_path_factory.mktemp("rollout_exports")
    return {version: save_tiny_model(folder / str(version), bias) for version, bias in BIAS.items()}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_versions):
    """Versions 1-6 published (1 stable on both tracks), one stable and one canary `mlops serve` process, and a client
    thread on the stable server for the whole module."""
    root = tmp_path_factory.mktemp("rollout")
    base = root / "serving"
    repository = ModelRepository(base)
    for version in range(1, 7):
        if version == 4:
            with repository.staged_version(MODEL, 4) as staged:
                (staged.path / "saved_model.pb").write_bytes(b"this is not a SavedModel")
        else:
            repository.add_version(MODEL, tiny_versions[version], version=version)
    ModelRepository.for_track(base, "stable").serve(MODEL, [1], {"stable": 1})
    ModelRepository.for_track(base, "canary").serve(MODEL, [1], {"canary": 1})
    (root / "golden.csv").write_text(GOLDEN_CSV)
    servers = {track: ServeProcess(base / name, root / f"{track}.log")
               for track, name in (("stable", "models.config"), ("canary", "models.canary.config"))}
    try:
        for server in servers.values():
            server.wait_ready()
        client = StableClient(servers["stable"].rest, servers["stable"].grpc)
        client.start()
        yield {"root": root, "base": base, "servers": servers, "client": client}
        client.stop()
    finally:
        for server in servers.values():
            server.stop()


def overrides(fleet, *extra: str) -> list[str]:
    servers = fleet["servers"]
    return [
        f"output_root={fleet['root']}",
        f"model_name={MODEL}",
        f"rollout.golden_data={fleet['root'] / 'golden.csv'}",
        "rollout.golden_rows=24",
        "rollout.steps=[50,100]",
        "rollout.window_seconds=0.5",
        "rollout.window_requests_per_second=40",
        "rollout.max_p99_ms=2000",
        "rollout.load_timeout_seconds=60",
        "rollout.keep_previous_seconds=1",
        "rollout.poll_seconds=0.05",
        f"rollout.local.stable_rest=['{servers['stable'].rest}']",
        f"rollout.local.stable_grpc=['{servers['stable'].grpc}']",
        f"rollout.local.canary_rest=['{servers['canary'].rest}']",
        f"rollout.local.canary_grpc=['{servers['canary'].grpc}']",
        *extra,
    ]
