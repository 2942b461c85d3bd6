"""The local stack for real (`mlops deploy local`): `mlops serve` processes behind Envoy, measured by Prometheus. A
client sends requests through the router (REST and gRPC in turn) for the whole of each rollout; at every step the
share of them that reached the canary matches the step's weight (binomial tolerance), no request fails through a
promotion, and every snapshot the verifier took from Prometheus equals what the servers counted. At the shadow step
Envoy copies the requests to the candidate, whose answers no client gets: a candidate that fails them, or decides
otherwise than stable on them, is rolled back before any user sees it."""
from __future__ import annotations

import json
import math
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import tensorflow as tf

from rollout import local_stack
from rollout.envoy import RouterError
from rollout.factory import build_backend, build_controller
from rollout.metrics import MetricsSource, Snapshot, model_counters, parse_prometheus_text, window_figures
from rollout.prometheus import PrometheusError, PrometheusSource
from rollout.report import _seconds, traffic_of, write_report
from serving.repository.local import ModelRepository
from settings.config import load_config
from tests.browser import render
from tests.rollout.conftest import GOLDEN_CSV, MODEL, ROW, answering_version, probability
from tests.serving.conftest import TinyTaxiModel, _signature_spec

pytestmark = pytest.mark.timeout(600)
SCRAPE_S = 0.25
SIGMAS = 4.0
# Version 3 agrees with versions 1 and 2 on every golden row (fares 0, 1.5, 3, ...) and fails every request with
# fare 2.5, which is what the client sends: a canary that answers errors (INTERNAL, HTTP 500) to real traffic only.
FAILING_BIAS = -2.9985
REFUSED_FARE = 2.5
# Version 4 answers the golden rows as version 1 does, and the client's row (fare 2.5) with 0.9: above the 0.5
# threshold where stable answers 0.025, so every copied request's decision differs.
DISAGREEING_BIAS = -3.0


def save_failing_model(export_dir, bias: float):
    module = TinyTaxiModel(bias)

    @tf.function(input_signature=_signature_spec())
    def serve(fare, trip_start_hour, payment_type):
        # A NotFoundError, not a failed assert: that would be INVALID_ARGUMENT, which the client retries once.
        failure = tf.cond(tf.reduce_any(tf.equal(fare, REFUSED_FARE)),
                          lambda: tf.io.read_file("/nonexistent/this canary refuses 2.5"), lambda: tf.constant(""))
        with tf.control_dependencies([failure]):
            return {"probabilities": tf.sigmoid(module.logits(fare, trip_start_hour, payment_type))}

    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": serve})
    return export_dir


def save_disagreeing_model(export_dir, bias: float):
    module = TinyTaxiModel(bias)

    @tf.function(input_signature=_signature_spec())
    def serve(fare, trip_start_hour, payment_type):
        probabilities = tf.sigmoid(module.logits(fare, trip_start_hour, payment_type))
        return {"probabilities": tf.where(tf.equal(fare, REFUSED_FARE), tf.fill(tf.shape(fare), 0.9),
                                          probabilities)}

    tf.saved_model.save(module, str(export_dir), signatures={"serving_default": serve})
    return export_dir


class RouterClient(threading.Thread):
    """Unversioned requests through the router, REST and gRPC in turn (~40 a second). Each request is bracketed by
    the canary's weight as Envoy reports it before and after, so it counts for a step only when the weight held."""

    def __init__(self, stack: local_stack.Stack) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.router = stack.router()
        self.stop_event = threading.Event()
        self.gate = threading.Lock()  # held during each request: pause() waits for the one in flight
        # (canary weight before, after, transport, answering version, error)
        self.results: list[tuple[int | None, int | None, str, int | None, str]] = []
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            self.send()
        except BaseException as e:  # noqa: BLE001 - stop() raises it in the test's thread
            self.crash = e

    def send(self) -> None:
        from serving.clients import GrpcClient, RestClient

        with RestClient(self.stack.router_rest, retries=0) as rest, \
                GrpcClient(self.stack.router_grpc, retries=0) as grpc:
            while not self.stop_event.is_set():
                transport = "rest" if len(self.results) % 2 == 0 else "grpc"
                with self.gate:
                    before = self.weight()
                    version, error = None, ""
                    try:
                        [value] = (rest if transport == "rest" else grpc).predict(ROW, MODEL, timeout=5.0)
                        version = answering_version(value)
                    except Exception as e:  # noqa: BLE001 - every failure counts, whatever its kind
                        error = f"{type(e).__name__}: {e}"
                    after = self.weight()
                self.results.append((before, after, transport, version, error))
                self.stop_event.wait(0.025)

    def weight(self) -> int | None:
        """The canary's weight, or None where Envoy's admin interface could not say (the request counts for no
        step); the traffic goes on either way."""
        try:
            return self.router.canary_weight()
        except RouterError:
            return None

    def pause(self) -> None:
        self.gate.acquire()

    def resume(self) -> None:
        self.gate.release()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)
        if self.crash is not None:
            raise AssertionError("the client stopped sending") from self.crash


def direct_counters(stack: local_stack.Stack) -> dict[str, dict]:
    """Every server's own counters, read from its metrics page."""
    counters: dict[str, dict] = {}
    for server in stack.servers:
        with urllib.request.urlopen(f"{server.rest}/monitoring/prometheus/metrics", timeout=5) as response:
            text = response.read().decode()
        counters.setdefault(server.track, {})[server.rest.split("://", 1)[1]] = model_counters(
            parse_prometheus_text(text), MODEL)
    return counters


class CheckedMetrics(MetricsSource):
    """The stack's Prometheus, with the client paused around each snapshot: the servers are then still, so what
    Prometheus reports must equal what each server's own page says, before and after."""

    name = "prometheus"

    def __init__(self, inner: MetricsSource, stack: local_stack.Stack, client: RouterClient) -> None:
        self.inner, self.stack, self.client = inner, stack, client
        self.checks: list[tuple[Snapshot, dict]] = []

    def snapshot(self, model: str, fresh_after: float | None = None) -> Snapshot:
        self.client.pause()
        try:
            direct = direct_counters(self.stack)
            snapshot = self.inner.snapshot(model, fresh_after=time.time())
            assert direct_counters(self.stack) == direct, "nothing reached the servers while paused"
            self.checks.append((snapshot, direct))
            return snapshot
        finally:
            self.client.resume()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_versions):
    try:
        local_stack.binaries()
    except local_stack.StackError as e:
        pytest.fail(str(e))
    root = tmp_path_factory.mktemp("local_stack")
    base = root / "serving"
    repository = ModelRepository(base)
    repository.add_version(MODEL, tiny_versions[1], version=1)
    repository.add_version(MODEL, tiny_versions[2], version=2)
    repository.add_version(MODEL, save_failing_model(root / "failing", FAILING_BIAS), version=3)
    repository.add_version(MODEL, save_disagreeing_model(root / "disagreeing", DISAGREEING_BIAS), version=4)
    ModelRepository.for_track(base, "stable").serve(MODEL, [1], {"stable": 1})
    ModelRepository.for_track(base, "canary").serve(MODEL, [1], {"canary": 1})
    (root / "golden.csv").write_text(GOLDEN_CSV)
    # Every server logs what it answers, as `mlops deploy local --set serving.request_log.enabled=true` has them do.
    logging = ["--set", f"output_root={root}", "--set", "serving.request_log.enabled=true",
               "--set", "serving.request_log.max_file_seconds=1"]
    started = local_stack.start(base, MODEL, scrape_interval_s=SCRAPE_S, config_args=logging)
    try:
        yield {"root": root, "base": base, "stack": started}
    finally:
        stopped = local_stack.stop(base)
        assert len(stopped) == 4, stopped
        assert local_stack.running_stack(base) is None


def overrides(fleet, *extra: str) -> list[str]:
    return [f"output_root={fleet['root']}", f"model_name={MODEL}",
            f"rollout.golden_data={fleet['root'] / 'golden.csv'}", "rollout.golden_rows=24",
            "rollout.steps=[10,50,100]", "rollout.window_seconds=2",
            # Latency is the gate's tests' subject (tests/rollout/test_verify_gate.py); here, on a shared machine, a few
            # milliseconds of p99 either way are noise, so only a canary gone very slow would fail.
            "rollout.window_requests_per_second=20", "rollout.max_p99_ms=2000", "rollout.max_p99_ratio=50",
            "rollout.shadow.max_latency_ratio=50",
            # Catching a canary failing 30% more than stable, not 5%: 24 canary requests a step, not ~150 (the gate's
            # power at the defaults is tests/rollout/test_evidence.py's subject).
            "rollout.min_error_rate_regression=0.3",
            # ~80 requests a 2 s window: the shadow step decides on 40 copies answered by both versions, not 200.
            "rollout.shadow.min_requests=40",
            # A busy machine halves the client's rate: a window watches up to 30 s for its requests, and decides as
            # soon as it has them.
            "rollout.max_window_extensions=14",
            "rollout.load_timeout_seconds=60",
            "rollout.keep_previous_seconds=1", "rollout.poll_seconds=0.05",
            f"rollout.prometheus.scrape_interval_seconds={SCRAPE_S}", *extra]


def rollout_with_traffic(fleet, version: int, *extra: str, retry: bool = False):
    stack = fleet["stack"]
    config = load_config(None, overrides(fleet, *extra))
    backend = build_backend(config)
    assert backend.router is not None and isinstance(backend.metrics, PrometheusSource), "the stack is picked up"
    client = RouterClient(stack)
    backend.metrics = CheckedMetrics(backend.metrics, stack, client)
    lines: list[str] = []
    controller = build_controller(config, backend, log=lines.append)
    client.start()
    time.sleep(0.5)
    try:
        record = controller.start(version, retry=retry)
    finally:
        time.sleep(0.5)
        client.stop()
    print("\n".join(lines))
    return record, client.results, backend


def shares(results) -> dict[int, tuple[int, int]]:
    """weight -> (requests that held that weight, of which the canary answered), for versions told apart."""
    counted: dict[int, list[int]] = {}
    for before, after, _, version, error in results:
        if before == after and before is not None and not error:
            entry = counted.setdefault(before, [0, 0])
            entry[0] += 1
            entry[1] += version != 1
    return {weight: (n, k) for weight, (n, k) in counted.items()}


def assert_exact_windows(backend, record, first: str = "shadow") -> None:
    checks = backend.metrics.checks
    assert checks, "the verifier read Prometheus"
    for snapshot, direct in checks:
        assert snapshot.missing == {}
        assert snapshot.counters == direct, "Prometheus's figures are the servers' own"
    windows = [e["figures"]["window"] for e in record["events"] if (e.get("figures") or {}).get("window")]
    # A window runs from its first snapshot to the look that decided it.
    deltas = [window_figures(Snapshot(a[1]), Snapshot(b[1]), "canary")["requests"]
              for i, a in enumerate(checks) for b in checks[i + 1:]]
    # At 0% no user reaches the canary: the shadow step's copies of their requests, or the verifier's own window.
    assert windows[0]["source"] == first
    for window in windows[1:]:
        assert (window.get("source"), window.get("traffic")) == ("prometheus", "users")
        if "requests" in window:
            assert window["requests"] in deltas, (window, deltas)


def test_a_good_version_moves_real_traffic_step_by_step_and_is_promoted(stack):
    record, results, backend = rollout_with_traffic(stack, 2)
    assert record["outcome"] == "promoted", record.get("reason")
    failures = [r for r in results if r[4]]
    assert failures == [], "no request fails through a promotion"
    observed = shares(results)
    print("weight -> (requests, canary answers):", dict(sorted(observed.items())))
    for weight in (10, 50):
        n, k = observed[weight]
        sigma = math.sqrt(n * weight / 100 * (1 - weight / 100))
        assert n >= 20 and abs(k - n * weight / 100) <= SIGMAS * sigma + 1, (weight, n, k)
    assert observed[100][1] == observed[100][0], "at 100% every request reaches the canary"
    assert {r[2] for r in results} == {"rest", "grpc"}
    assert (backend.canary_weight(), backend.shadow_percent()) == (0, 0)
    assert all(weights == {"tfserving-stable": 100} for weights in stack["stack"].router().weights().values())
    # The shadow step: copies of the users' requests, answered by both versions and joined by request id.
    shadow = [e["figures"]["window"] for e in record["events"] if (e.get("figures") or {}).get("weight") == 0]
    assert shadow and shadow[-1]["source"] == "shadow" and shadow[-1]["verdict"] == "passed", shadow
    print("shadow step:", {k: v for k, v in shadow[-1]["shadow"].items() if k != "examples"})
    assert shadow[-1]["shadow"]["pairs"] >= 40 and shadow[-1]["shadow"]["disagreements"] == 0
    # The promoted version's first users, on the stable servers after all traffic moved there.
    [watch] = [e["watch"] for e in record["events"] if "watch" in e]
    assert (watch["after"], watch["window"]["traffic"], watch["window"]["version"]) == ("promotion", "users", 2)
    assert watch["window"]["verdict"] == "passed" and watch["window"]["predictions"] >= 20, watch
    assert_exact_windows(backend, record)
    # The report charts the traffic Prometheus saw, and loads in a browser with nothing from the network.
    time.sleep(1.0)
    page = write_report(stack["root"] / "reports", record, metrics=backend.metrics.inner)
    rendered = render(Path(page))
    assert rendered.console == []
    assert rendered.charts == {"traffic-user_requests_per_second": 1, "traffic-error_rate": 1,
                               "traffic-verifier_requests_per_second": 1, "traffic-p99_ms": 1}
    traffic = traffic_of(record, backend.metrics.inner)
    canary = traffic["tracks"]["canary"]
    canary_rate = [v for v in canary["user_requests_per_second"] if v]
    # The verifier's requests apart: during the shadow step its golden rows reach the canary beside the copies of
    # every user's request, which the canary counts as users' requests as stable counts the originals; the golden
    # rows are charted on their own, not as users'.
    [shadow_from] = [_seconds(e["at"]) for e in record["events"] if e.get("phase") == "label"]
    [shadow_to] = [_seconds(e["at"]) for e in record["events"] if e["message"].startswith("verified at 0%")]
    stable_users = traffic["tracks"]["stable"]["user_requests_per_second"]
    during = [(u, s, v) for t, u, s, v in zip(traffic["times"], canary["user_requests_per_second"], stable_users,
                                              canary["verifier_requests_per_second"], strict=True)
              if shadow_from + 1 < t < shadow_to and u is not None and s is not None and s > 5]
    print(f"during the shadow step (canary users, stable users, verifier): {during}")
    # At its end (the first points are before the mirror was set): as many copies as stable answered originals.
    u, s, _ = during[-1]
    assert abs(u - s) <= 0.2 * s + 1, "the canary's users' requests at the shadow step are the copies"
    assert max(v or 0 for v in canary["verifier_requests_per_second"]) > 0, "the golden rows charted apart"
    errors = [v for figures in traffic["tracks"].values() for v in figures["error_rate"] if v is not None]
    print(f"traffic chart: {len(traffic['times'])} points, canary peak {max(canary_rate):.1f} requests/s, "
          f"highest error rate {max(errors):.3f} (the controller's status polls for a version still loading)")
    assert canary_rate and max(canary_rate) > 10 and errors and all(0 <= v <= 1 for v in errors)
    assert rendered.dom.count("verified, to ") == 12 and rendered.dom.count("verified, promote</text>") == 4
    assert rendered.dom.count("PROMOTED</text>") == 4


def test_a_canary_that_answers_errors_is_rolled_back_and_only_its_answers_fail(stack):
    # Without the shadow step, the failing canary's first users are what catches it.
    record, results, backend = rollout_with_traffic(stack, 3, "rollout.shadow.percent=0")
    assert record["outcome"] == "rolled_back"
    assert record["reason"].startswith("verification at 10% failed: the canary failed "), record["reason"]
    assert "above rollout.max_error_rate 0.01 (exact binomial test" in record["reason"]
    failures = [r for r in results if r[4]]
    print(f"{len(results)} requests through the router, {len(failures)} failed; first: "
          f"{failures[0][4] if failures else '-'}")
    assert failures, "the canary's errors reached the client"
    for before, after, _, _, error in failures:
        assert max(before, after) > 0, "a request failed while the canary had no traffic"
        assert "Internal error: Graph execution error" in error, error
    [failed] = [e["figures"] for e in record["events"] if (e.get("figures") or {}).get("error")]
    causes = failed["window"]["causes"]
    print("causes:", causes)
    # Named from what the canary's servers kept of the failed requests: the model's message and the fare it refuses.
    assert causes["failed_requests"] >= 1 and "unread" not in causes, causes
    assert all("this canary refuses 2.5" in m["message"] for m in causes["messages"]), causes
    if causes["failed_requests"] >= 2:
        assert {"feature": "fare", "value": REFUSED_FARE, "count": causes["failed_requests"]} in causes["values"]
    assert backend.canary_weight() == 0
    last_weight_change = max(i for i, r in enumerate(results) if r[0] != 0 or r[1] != 0)
    assert all(not r[4] for r in results[last_weight_change + 1:]), "nothing fails after the rollback"
    assert_exact_windows(backend, record, first="verifier")
    time.sleep(1.0)
    rendered = render(Path(write_report(stack["root"] / "reports", record, metrics=backend.metrics.inner)))
    assert rendered.console == [] and len(rendered.charts) == 4
    assert rendered.dom.count("10% failed</text>") == 4 and rendered.dom.count("ROLLED BACK</text>") == 4
    traffic = traffic_of(record, backend.metrics.inner)
    canary_errors = [v for v in traffic["tracks"]["canary"]["error_rate"] if v]
    assert canary_errors and max(canary_errors) > 0.05, "the chart shows the canary's errors"
    # Stable's recovery: a window on the stable servers once all traffic was back, which the chart runs on past.
    [watch] = [e["watch"] for e in record["events"] if "watch" in e]
    assert (watch["after"], watch["window"]["traffic"], watch["window"]["version"]) == ("rollback", "users",
                                                                                       record["stable"])
    assert watch["window"]["errors"] == 0 and watch["window"]["predictions"] >= 20, watch
    [routed_back] = [_seconds(e["at"]) for e in record["events"] if e.get("next") == "rollback_canary_load"]
    after = [v for t, v in zip(traffic["times"], traffic["tracks"]["stable"]["user_requests_per_second"], strict=True)
             if t > routed_back + 1 and v]
    assert after, "the chart shows stable's traffic after the rollback"


def test_a_candidate_failing_copies_of_the_users_requests_is_rolled_back_before_any_user_sees_it(stack):
    # The same candidate as above, rolled out again, now with the shadow step.
    record, results, backend = rollout_with_traffic(stack, 3, retry=True)
    assert record["outcome"] == "rolled_back"
    assert record["reason"].startswith("verification at 0% failed: the candidate failed "), record["reason"]
    assert "requests copied to it" in record["reason"] and "rollout.max_error_rate 0.01" in record["reason"]
    assert [r for r in results if r[4]] == [], "no user request failed: the candidate answered only copies"
    assert {r[3] for r in results} == {record["stable"]}, "every user got stable's answer"
    [failed] = [e["figures"] for e in record["events"] if (e.get("figures") or {}).get("error")]
    window = failed["window"]
    assert (window["source"], window["percent"]) == ("shadow", 100)
    assert window["errors"] == window["requests"] >= 1 and window["stable"]["errors"] == 0, window
    causes = window["causes"]
    assert all("this canary refuses 2.5" in m["message"] for m in causes["messages"]), causes
    if causes["failed_requests"] >= 2:
        assert {"feature": "fare", "value": REFUSED_FARE, "count": causes["failed_requests"]} in causes["values"]
    assert (backend.canary_weight(), backend.shadow_percent()) == (0, 0)


def test_a_candidate_deciding_otherwise_than_stable_on_live_requests_is_caught_at_the_shadow_step(stack):
    record, results, backend = rollout_with_traffic(stack, 4)
    assert record["outcome"] == "rolled_back"
    [golden] = [e["figures"]["golden"] for e in record["events"] if (e.get("figures") or {}).get("golden")]
    assert "error" not in golden and golden["rest_max_abs_diff"] <= 0.001, "the golden rows pass"
    assert record["reason"].startswith("verification at 0% failed: the candidate's decisions disagree with "
                                       "stable's on "), record["reason"]
    assert [r for r in results if r[4]] == [] and {r[3] for r in results} == {record["stable"]}
    [failed] = [e["figures"]["window"] for e in record["events"] if (e.get("figures") or {}).get("error")]
    shadow = failed["shadow"]
    assert shadow["disagreements"] == shadow["rows"] >= 1 and shadow["thresholds"] == {"stable": 0.5,
                                                                                        "candidate": 0.5}
    [example, *_] = shadow["examples"]
    assert example["disagree"] and example["candidate"] == pytest.approx(0.9)
    assert example["stable"] == pytest.approx(probability(ROW, record["stable"]), abs=1e-6)
    assert example["inputs"]["fare"] == REFUSED_FARE
    time.sleep(1.0)
    rendered = render(Path(write_report(stack["root"] / "reports", record, metrics=backend.metrics.inner)))
    assert rendered.console == [] and "Copies of the users' requests" in rendered.dom


def test_the_cli_reports_the_stack_and_refuses_a_second_one(stack, capsys):
    from pipeline.cli import build_parser
    from settings.arguments import run_command

    args = build_parser().parse_args(["deploy", "local", "--status", *[a for o in overrides(stack)
                                                                       for a in ("--set", o)]])
    assert run_command(args) == 0
    out = capsys.readouterr().out
    assert "router" in out and "canary 0%" in out and out.count(" up ") == 2, out
    args = build_parser().parse_args(["deploy", "local", *[a for o in overrides(stack) for a in ("--set", o)]])
    assert run_command(args) == 2
    assert "already runs" in capsys.readouterr().err


def test_the_stacks_servers_log_what_they_answer_through_the_router(stack):
    from serving.clients import GrpcClient, RestClient
    from tests.serving.test_request_log import records as logged

    started = stack["stack"]
    folder = stack["root"] / "request_logs"
    assert [s.request_log for s in started.servers] == [f"logging 1 of predictions under {folder}"] * 2
    with RestClient(started.router_rest, retries=0) as rest, GrpcClient(started.router_grpc, retries=0) as grpc:
        for client in (rest, grpc) * 3:
            client.predict(ROW, MODEL, timeout=5.0)
    deadline, records = time.monotonic() + 20, []
    while time.monotonic() < deadline and len(records) < 6:
        time.sleep(0.5)
        records = logged(folder)
    assert len(records) >= 6, "each answered prediction is a record of the model's folder"
    assert {record.predict_log.request.model_spec.name for record in records} == {MODEL}


def test_missing_binaries_are_one_sentence_that_says_what_installs_them(monkeypatch, tmp_path):
    from rollout import envoy

    monkeypatch.setattr(envoy, "EGCTL", tmp_path / "egctl")
    with pytest.raises(local_stack.StackError) as caught:
        local_stack.binaries()
    assert str(caught.value) == (f"{tmp_path / 'egctl'} is missing: the router's routes are translated with it; run "
                                 "`make envoy-gateway`.")
    monkeypatch.setattr(local_stack.shutil, "which", lambda name: None)
    monkeypatch.setattr(local_stack.os, "access", lambda path, mode: False)
    with pytest.raises(local_stack.StackError) as caught:
        local_stack.binaries()
    assert str(caught.value).startswith("prometheus is not installed; install it with `make deploy-deps`")


def test_an_unreachable_prometheus_is_one_clear_error():
    source = PrometheusSource(f"http://127.0.0.1:{local_stack.free_port()}", timeout_s=2)
    with pytest.raises(PrometheusError, match=r"^cannot query Prometheus at http://127\.0\.0\.1:\d+ \(.*\); start it"):
        source.snapshot(MODEL)


def test_a_stack_recorded_by_the_release_before_says_how_to_stop_it(tmp_path):
    (tmp_path / local_stack.STACK_FILE).write_text(json.dumps({
        "folder": str(tmp_path), "model": MODEL, "haproxy_pid": 41, "prometheus_pid": 42, "admin_socket": "s",
        "servers": [{"track": "stable", "name": "stable-0", "pid": 43, "rest": "r", "grpc": "g", "log": "l"}]}))
    with pytest.raises(local_stack.StackError) as caught:
        local_stack.load_stack(tmp_path)
    assert str(caught.value) == (f"{tmp_path / local_stack.STACK_FILE} was written by another release of `mlops "
                                 "deploy local`; end its processes (kill 41 42 43) and delete the file, then start the "
                                 "stack again.")
