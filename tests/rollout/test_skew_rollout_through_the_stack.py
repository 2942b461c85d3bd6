"""The rollout's skew check through real servers: `mlops deploy local`'s stack (two `mlops serve` processes that log
what they answer, Envoy, Prometheus) serves two versions that carry the training data of a real pipeline run; a
client sends the eval split's rows with fare x 3 and a payment type training never saw, unversioned, through the
router. The candidate's error rate and latency pass every window, yet its own logged traffic is skewed against its
training statistics: the rollout rolls back at the first step with traffic, naming exactly fare and payment_type."""
from __future__ import annotations

import threading
import time

import pytest

from components.publisher.publish import publish_model
from rollout import local_stack
from rollout.factory import build_backend, build_controller
from serving.clients import RestClient
from serving.repository.local import ModelRepository
from settings.config import load_config
from tests.monitoring.conftest import MODEL, taxi_run  # noqa: F401 - the fixture: a real run's training data
from tests.monitoring.test_monitor import shifted
from tests.rollout.conftest import BIAS, GOLDEN_CSV
from tests.serving.conftest import save_tiny_model

pytestmark = pytest.mark.timeout(600)
SCRAPE_S = 0.25
ROWS_PER_REQUEST = 4


class Traffic(threading.Thread):
    """Users' requests through the router, naming no version, until stopped."""

    def __init__(self, url: str, rows: list[dict]) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.rows = [{k: (v.decode() if isinstance(v, bytes) else v) for k, v in row.items()} for row in rows]
        self.stop_event = threading.Event()
        self.answered = 0
        self.errors: list[str] = []

    def run(self) -> None:
        client = RestClient(self.url, retries=0)
        while not self.stop_event.is_set():
            for start in range(0, len(self.rows), ROWS_PER_REQUEST):
                if self.stop_event.is_set():
                    return
                try:
                    client.predict(self.rows[start:start + ROWS_PER_REQUEST], MODEL, drop_unknown_features=True)
                    self.answered += 1
                except Exception as e:  # noqa: BLE001 - every failure is reported by the test
                    self.errors.append(f"{type(e).__name__}: {e}")


def test_skewed_traffic_on_the_canary_is_rolled_back_whatever_its_error_rate(taxi_run, tmp_path):  # noqa: F811
    try:
        local_stack.binaries()
    except local_stack.StackError as e:
        pytest.fail(str(e))
    base = tmp_path / "serving"
    for version in (1, 2):
        export = save_tiny_model(tmp_path / f"export-{version}", BIAS[version])
        (export / "export_report.json").write_text('{"passed": true}')
        assert publish_model(str(export), str(base), MODEL, {"blessed": True}, taxi_run.training).version == version
    ModelRepository.for_track(base, "stable").serve(MODEL, [1], {"stable": 1})
    ModelRepository.for_track(base, "canary").serve(MODEL, [1], {"canary": 1})
    (tmp_path / "golden.csv").write_text(GOLDEN_CSV)
    overrides = [f"output_root={tmp_path}", f"model_name={MODEL}", f"rollout.golden_data={tmp_path / 'golden.csv'}",
                 "rollout.golden_rows=24", "rollout.steps=[50,100]", "rollout.window_seconds=2",
                 # Latency and errors are the gate's tests' subject; here they must pass, so only skew can fail.
                 "rollout.max_p99_ms=5000", "rollout.max_p99_ratio=100", "rollout.max_error_rate=0.5",
                 "rollout.shadow.max_latency_ratio=100",
                 "rollout.max_error_rate_increase=0.4", "rollout.min_error_rate_regression=0.45",
                 "rollout.load_timeout_seconds=60",
                 "rollout.keep_previous_seconds=1", "rollout.poll_seconds=0.05",
                 f"rollout.prometheus.scrape_interval_seconds={SCRAPE_S}",
                 "rollout.skew_check=true", "rollout.skew_min_requests=40",
                 "serving.request_log.enabled=true", "serving.request_log.max_file_seconds=1"]
    config = load_config(None, overrides)
    stack = local_stack.start(base, MODEL, scrape_interval_s=SCRAPE_S,
                              config_args=[flag for o in overrides for flag in ("--set", o)])
    traffic = Traffic(stack.router_rest, shifted(taxi_run.splits["eval"]))
    try:
        assert all(s.request_log.startswith("logging 1 of predictions under ") for s in stack.servers)
        lines: list[str] = []
        controller = build_controller(config, build_backend(config), log=lines.append)
        traffic.start()
        # Users were there before the rollout: stable's answers open the model's log folder, which the check
        # refuses to start without (a wrong serving.request_log.directory is the likelier cause).
        logs = tmp_path / "request_logs" / MODEL
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(logs.glob("*.tfrecord")):
            time.sleep(0.2)
        record = controller.start(2)
    finally:
        traffic.stop_event.set()
        traffic.join(timeout=30)
        local_stack.stop(base)
    print("\n".join(lines))
    assert traffic.errors == [] and traffic.answered > 0
    assert record["outcome"] == "rolled_back", record.get("reason")
    reason = record["reason"]
    assert reason.startswith("verification at 50% failed: "), reason
    assert "fare (Jensen-Shannon divergence " in reason and "payment_type (L-infinity distance 1.0000 > 0.1" in reason
    assert "trip_start_hour (" not in reason, "the one feature left as training had it is not named"
    skew = [e["figures"]["skew"] for e in record["events"] if (e.get("figures") or {}).get("skew")]
    assert skew and skew[-1]["requests"] >= 40, "judged on the canary's own logged user requests"
    window = [e["figures"]["window"] for e in record["events"] if (e.get("figures") or {}).get("window")]
    assert window and not window[-1].get("error"), "the window itself passed: skew alone rolled it back"
