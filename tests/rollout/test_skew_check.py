"""The rollout's skew check (rollout/skew.py): the candidate's requests, written by the real request logger
(serving/server/request_log.py), judged against the candidate's own training statistics before each step. Taxi rows as
in tests/monitoring/test_judge.py: traffic drawn like training passes and is promoted; fare x 3 and an unseen
payment_type roll back naming exactly those two, in the state and the report; too few requests are inconclusive; a
threshold just inside and just outside; the rollout refuses to start without request logs. A backend in memory
(tests/rollout/memory.py)."""
from __future__ import annotations

import dataclasses
import json
import os
from datetime import datetime, timezone

import numpy as np
import pytest
import tensorflow_data_validation as tfdv
from tensorflow_serving.apis import prediction_log_pb2

from monitoring import judge as gate
from rollout.controller import Controller, RolloutError
from rollout.factory import build_controller
from rollout.skew import SkewCheck, describe_feature, judge_skew
from serving.server.request_log import RequestLogger, predict_messages_from_arrays
from settings.config import (
    DEFAULT_CONFIG,
    ConfigError,
    MonitoringConfig,
    MonitoringFeatureConfig,
    RequestLogConfig,
    load_config,
)
from tests.monitoring.request_logs import (
    csv_rows,
    encode,
    feature_types,
    request_records,
    statistics_of,
    write_log_file,
)
from tests.rollout.memory import MODEL, HookedStore, MemoryBackend, ScriptedVerifier

SCHEMA = tfdv.load_schema_text(str(DEFAULT_CONFIG.parent / "taxi_schema.pbtxt"))
EPSILON = 1e-6
CANDIDATE, STABLE = 2, 1
# The controller's wall clock; the logged requests are answered a second after the rollout began.
CLOCK = [1_800_000_000.0]


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch):
    from rollout import controller

    CLOCK[0] = 1_800_000_000.0
    monkeypatch.setattr(controller, "_now", lambda: CLOCK[0])


@pytest.fixture(scope="module")
def taxi(taxi_slice):
    """The slice's rows as requests carry them: 1,200 trained on (the candidate's training statistics), every fifth
    one served (400)."""
    types = feature_types(SCHEMA, load_config().features)
    everything = csv_rows(taxi_slice / "data.csv", types)
    train = [row for i, row in enumerate(everything) if i % 5 < 3]
    return {"types": types, "training": statistics_of(train, types, CANDIDATE), "served": everything[4::5]}


def shifted(rows):
    return [{**r, "fare": None if r["fare"] is None else r["fare"] * 3, "payment_type": b"Bitcoin"} for r in rows]


def log_requests(folder, rows, types, version: int, at: float, named_version: int | None = None) -> None:
    """`rows` as one-row predictions answered by `version` at `at`, through the servers' own request logger;
    `named_version`: the request named that version (as the verifier's golden requests do)."""
    logger = RequestLogger(RequestLogConfig(enabled=True), str(folder), clock=lambda: at)
    for row in rows:
        inputs = encode([row], types)
        prediction = predict_messages_from_arrays(MODEL, named_version, None, version, "serving_default", inputs,
                                                  {"probabilities": np.array([0.5], np.float32)})
        logger.submit(MODEL, lambda prediction=prediction: prediction)
    assert logger.flush()
    logger.close()


def skew_check(folder, taxi, min_requests: int = 300, monitoring: MonitoringConfig | None = None,
               logging_enabled: bool = True) -> SkewCheck:
    trained = {CANDIDATE: (SCHEMA, taxi["training"])}
    return SkewCheck(str(folder), MODEL, monitoring or MonitoringConfig(), min_requests,
                     lambda version: trained[version], logging_enabled=logging_enabled)


def controller(tmp_path, check: SkewCheck, verifier: ScriptedVerifier | None = None, steps: tuple[int, ...] = (50, 100),
               **options) -> Controller:
    backend = MemoryBackend(HookedStore(tmp_path / "serving"))
    verifier = verifier or ScriptedVerifier()
    return Controller(backend, MODEL, list(steps), lambda: verifier, load_timeout_s=0.2, keep_previous_s=0.0,
                      poll_s=0.01, log=lambda _: None, sleep=lambda s: None, report_dir=str(tmp_path / "reports"),
                      skew_check=check, **options)


def skew_events(record):
    return [e["figures"]["skew"] for e in record["events"] if "skew" in e.get("figures", {})]


def test_a_canary_whose_traffic_is_drawn_like_training_is_promoted(tmp_path, taxi):
    logs = tmp_path / "logs"
    log_requests(logs, taxi["served"], taxi["types"], CANDIDATE, CLOCK[0] + 1)
    record = controller(tmp_path, skew_check(logs, taxi)).start(CANDIDATE)
    assert record["outcome"] == "promoted", record.get("reason")
    checks = skew_events(record)
    assert [c["verdict"] for c in checks] == ["passed", "passed"]
    assert checks[0]["requests"] == 400 and checks[0]["flagged"] == []
    assert sorted(f["name"] for f in checks[0]["features"]) == sorted(load_config().features)
    assert all(f["value"] is not None and f["value"] <= f["threshold"] for f in checks[0]["features"])


def test_a_canary_fed_shifted_data_is_rolled_back_naming_exactly_the_shifted_features(tmp_path, taxi):
    logs = tmp_path / "logs"
    log_requests(logs, shifted(taxi["served"]), taxi["types"], CANDIDATE, CLOCK[0] + 1)
    check = skew_check(logs, taxi)
    verifier = ScriptedVerifier()
    control = controller(tmp_path, check, verifier)
    record = control.start(CANDIDATE)
    assert record["outcome"] == "rolled_back"
    assert verifier.windows == [0, 50], "the window at 50% passed; the skew check failed it"
    [figures] = skew_events(record)
    assert figures["verdict"] == "failed" and figures["flagged"] == ["fare", "payment_type"]
    by_name = {f["name"]: f for f in figures["features"]}
    assert by_name["fare"]["crossed"] and by_name["fare"]["measure"] == "Jensen-Shannon divergence"
    assert by_name["payment_type"]["value"] == pytest.approx(1.0)
    assert any("Bitcoin" in a for a in by_name["payment_type"]["anomalies"])
    # What the state says is what it recorded, read back: the reason names both features with their distances.
    [last] = control.document()["history"]
    assert last["reason"] == f"verification at 50% failed: {figures['error']}"
    for name in ("fare", "payment_type"):
        assert describe_feature(by_name[name]) in last["reason"]
    assert f"fare (Jensen-Shannon divergence {by_name['fare']['value']:.4f} > 0.25)" in last["reason"]
    assert "payment_type (L-infinity distance 1.0000 > 0.1; " in last["reason"]
    others = [f["name"] for f in figures["features"] if f["name"] not in ("fare", "payment_type")]
    assert others and not any(f"{name} (" in last["reason"] for name in others)
    # The report shows each feature's figures for the step.
    page = (tmp_path / "reports" / f"{MODEL}-v{CANDIDATE}-{record['id']}.html").read_text()
    assert "Skew against the candidate's training data" in page
    assert f"{by_name['fare']['value']:.4f}" in page and "skewed" in page
    saved = json.loads((tmp_path / "reports" / f"{MODEL}-v{CANDIDATE}-{record['id']}.json").read_text())
    assert skew_events(saved) == [figures]


def test_too_few_logged_requests_are_inconclusive_never_a_pass(tmp_path, taxi):
    logs = tmp_path / "logs"
    log_requests(logs, taxi["served"], taxi["types"], CANDIDATE, CLOCK[0] + 1)
    verifier = ScriptedVerifier()
    record = controller(tmp_path, skew_check(logs, taxi, min_requests=401), verifier).start(CANDIDATE)
    assert record["outcome"] == "rolled_back"
    assert verifier.windows == [0, 50, 50, 50], "counted toward rollout.max_inconclusive_windows"
    assert [c["verdict"] for c in skew_events(record)] == ["inconclusive"] * 3
    assert record["reason"].startswith("3 inconclusive windows in a row at 50%: 400 logged requests answered by "
                                       "version 2 since the rollout began, fewer than rollout.skew_min_requests 401")


def test_the_check_runs_from_the_first_step_with_user_traffic_on(tmp_path, taxi):
    logs = tmp_path / "logs"
    log_requests(logs, taxi["served"], taxi["types"], CANDIDATE, CLOCK[0] + 1)
    record = controller(tmp_path, skew_check(logs, taxi), steps=(1, 100)).start(CANDIDATE)
    assert record["outcome"] == "promoted"
    weights = [e["figures"]["weight"] for e in record["events"] if "skew" in e.get("figures", {})]
    assert weights == [1, 100], "none at 0%: no user request reaches the canary before its first step"


def test_a_window_and_a_skew_check_both_inconclusive_say_both(tmp_path, taxi):
    logs = tmp_path / "logs"
    log_requests(logs, taxi["served"][:10], taxi["types"], CANDIDATE, CLOCK[0] + 1)
    verifier = ScriptedVerifier(inconclusive_at=[50])
    control = controller(tmp_path, skew_check(logs, taxi), verifier)
    state = control.start(CANDIDATE, wait_retain=False)
    [event] = [e for e in control.document()["history"][-1]["events"] if "inconclusive (1 of 3" in e["message"]]
    assert event["message"] == ("the window at 50% is inconclusive (1 of 3 in a row): no metrics from the canary "
                                "server(s) canary-0 (failed scrape); 10 logged requests answered by version 2 since "
                                "the rollout began, fewer than rollout.skew_min_requests 300: skew not judged; "
                                "verifying again")
    assert state["outcome"] == "rolled_back"


def test_requests_of_other_versions_of_the_verifier_and_from_before_the_rollout_are_left_out(tmp_path, taxi):
    logs = tmp_path / "logs"
    odd = shifted(taxi["served"])
    # Each logger a second later: one process's loggers would otherwise name their first files alike.
    log_requests(logs, taxi["served"][:200], taxi["types"], CANDIDATE, CLOCK[0] + 1)
    log_requests(logs, taxi["served"][200:], taxi["types"], CANDIDATE, CLOCK[0] + 4)
    log_requests(logs, odd[:50], taxi["types"], STABLE, CLOCK[0] + 2)
    log_requests(logs, odd[:60], taxi["types"], CANDIDATE, CLOCK[0] + 3, named_version=CANDIDATE)
    log_requests(logs, odd[:70], taxi["types"], CANDIDATE, CLOCK[0] - 3600)
    figures = skew_check(logs, taxi).check(CANDIDATE, since=CLOCK[0])
    assert figures["verdict"] == "passed" and figures["requests"] == 400, figures.get("inconclusive")
    assert figures["files"] == 2, "the two files that held the candidate's user requests"
    assert figures["left_out"] == {"another version's": 50, "the verifier's own": 60, "before the rollout": 70}


def _measured(folder, taxi, feature: str) -> float:
    figures = skew_check(folder, taxi).check(CANDIDATE, since=CLOCK[0])
    return next(f["value"] for f in figures["features"] if f["name"] == feature)


@pytest.mark.parametrize("feature", ["trip_miles", "company"])
def test_a_threshold_just_inside_passes_and_just_outside_fails(tmp_path, taxi, feature):
    logs = tmp_path / "logs"
    log_requests(logs, taxi["served"], taxi["types"], CANDIDATE, CLOCK[0] + 1)
    value = _measured(logs, taxi, feature)
    assert 0 < value < 1
    for limit, verdict in ((value + EPSILON, "passed"), (value, "passed"), (value - EPSILON, "failed")):
        monitoring = MonitoringConfig(features={feature: MonitoringFeatureConfig(skew=limit)})
        figures = skew_check(logs, taxi, monitoring=monitoring).check(CANDIDATE, since=CLOCK[0])
        assert figures["verdict"] == verdict, limit
        assert figures["flagged"] == ([feature] if verdict == "failed" else [])


def test_the_skew_check_uses_the_monitoring_sections_thresholds(tmp_path, taxi):
    logs = tmp_path / "logs"
    log_requests(logs, taxi["served"], taxi["types"], CANDIDATE, CLOCK[0] + 1)
    value = _measured(logs, taxi, "trip_miles")
    monitoring = dataclasses.replace(MonitoringConfig(), numeric_skew=value - EPSILON)
    figures = skew_check(logs, taxi, monitoring=monitoring).check(CANDIDATE, since=CLOCK[0])
    assert "trip_miles" in figures["flagged"] and figures["verdict"] == "failed"


def test_judge_skew_judges_only_with_enough_requests():
    calls = []

    def verdicts():
        calls.append(1)
        return [gate.FeatureVerdict("fare", gate.NUMERIC, gate.Distance("Jensen-Shannon divergence", 0.3, 0.25),
                                    None),
                gate.FeatureVerdict("company", gate.CATEGORICAL, gate.Distance("L-infinity distance", 0.1, 0.1),
                                    None),
                gate.FeatureVerdict("payment_type", gate.CATEGORICAL, gate.Distance("L-infinity distance", 0.05, 0.1),
                                    None, ("unexpected value Bitcoin ",))]

    few = judge_skew(99, 100, CANDIDATE, verdicts)
    assert calls == [], "nothing judged"
    assert few == {"requests": 99, "min_requests": 100, "features": [], "flagged": [], "verdict": "inconclusive",
                   "inconclusive": "99 logged requests answered by version 2 since the rollout began, fewer than "
                                   "rollout.skew_min_requests 100: skew not judged"}
    enough = judge_skew(100, 100, CANDIDATE, verdicts)
    assert calls == [1] and enough["verdict"] == "failed" and enough["flagged"] == ["fare", "payment_type"]
    assert enough["error"] == ("the requests version 2 answered are skewed against its training data: fare "
                               "(Jensen-Shannon divergence 0.3000 > 0.25), payment_type (unexpected value Bitcoin)")
    assert [f["crossed"] for f in enough["features"]] == [True, False, False], "a distance at its threshold passes"
    assert enough["features"][1] == {"name": "company", "kind": "categorical", "measure": "L-infinity distance",
                                     "value": 0.1, "threshold": 0.1, "crossed": False, "anomalies": [],
                                     "flagged": False}


def test_a_schema_anomaly_alone_fails_the_check():
    found = judge_skew(5, 1, CANDIDATE, lambda: [gate.FeatureVerdict("payment_type", gate.CATEGORICAL, None, None,
                                                                      ("unexpected value Bitcoin",))])
    assert found["verdict"] == "failed" and found["flagged"] == ["payment_type"]
    assert found["error"].endswith(": payment_type (unexpected value Bitcoin)")
    assert found["features"][0]["value"] is None and not found["features"][0]["crossed"]


def test_the_rollout_refuses_to_start_when_request_logging_is_off(tmp_path, taxi):
    control = controller(tmp_path, skew_check(tmp_path / "logs", taxi, logging_enabled=False))
    with pytest.raises(RolloutError) as raised:
        control.start(CANDIDATE)
    assert str(raised.value) == ("rollout.skew_check judges the canary's logged requests, but serving.request_log."
                                 "enabled is false; enable serving.request_log on the servers and in this config "
                                 "(docs/tutorials/monitoring.md), or set rollout.skew_check=false.")
    assert control.document().get("current") is None, "nothing started"
    assert control.backend.writes == []


def test_the_rollout_refuses_to_start_when_no_log_folder_is_reachable(tmp_path, taxi):
    control = controller(tmp_path, skew_check(tmp_path / "logs", taxi))
    with pytest.raises(RolloutError) as raised:
        control.start(CANDIDATE)
    assert str(raised.value) == (
        f"rollout.skew_check finds no request logs of 'tiny' at {tmp_path}/logs/tiny; point serving.request_log."
        "directory at the folder the servers log to (on Kubernetes a shared claim or bucket, not the pods' emptyDir: "
        "docs/tutorials/kubernetes.md), or set rollout.skew_check=false.")
    assert control.document().get("current") is None and control.backend.writes == []


def test_the_rollout_refuses_to_start_a_candidate_without_training_data(tmp_path, taxi):
    log_requests(tmp_path / "logs", taxi["served"][:1], taxi["types"], STABLE, CLOCK[0])

    def missing(version):
        raise ValueError(f"version {version} of 'tiny' carries no training schema and statistics")

    check = SkewCheck(str(tmp_path / "logs"), MODEL, MonitoringConfig(), 10, missing)
    with pytest.raises(RolloutError, match="rollout.skew_check needs version 2's training data: version 2 of 'tiny' "
                                           "carries no training schema"):
        controller(tmp_path, check).start(CANDIDATE)


def test_without_the_switch_no_skew_is_checked(tmp_path):
    record = controller(tmp_path, None).start(CANDIDATE)
    assert record["outcome"] == "promoted" and skew_events(record) == []


def test_the_config_switch_builds_the_check_with_the_monitoring_thresholds(tmp_path):
    settings = [f"output_root={tmp_path}", f"model_name={MODEL}", "rollout.skew_check=true",
                "rollout.skew_min_requests=5", "monitoring.numeric_skew=0.2"]
    backend = MemoryBackend(HookedStore(tmp_path / "serving"))
    check = build_controller(load_config(None, settings), backend).skew_check
    assert (check.log_dir, check.min_requests, check.monitoring.numeric_skew) == (str(tmp_path / "request_logs"), 5,
                                                                                 0.2)
    with pytest.raises(RolloutError, match="serving.request_log.enabled is false"):
        build_controller(load_config(None, settings), backend).start(CANDIDATE)
    enabled = build_controller(load_config(None, [*settings, "serving.request_log.enabled=true"]), backend)
    with pytest.raises(RolloutError, match="finds no request logs"):
        enabled.start(CANDIDATE)
    assert build_controller(load_config(None, settings[:2]), backend).skew_check is None, "off by default"


def test_skew_min_requests_must_be_at_least_one():
    assert load_config(None, ["rollout.skew_min_requests=1"]).rollout.skew_min_requests == 1
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["rollout.skew_min_requests=0"])
    assert str(refused.value) == "rollout.skew_min_requests must be at least 1."


def test_a_request_without_its_own_time_goes_with_its_files_start(tmp_path, taxi):
    folder = tmp_path / "logs" / MODEL
    records = []
    for record in request_records(taxi["served"], taxi["types"], CANDIDATE, model=MODEL):
        log = prediction_log_pb2.PredictionLog.FromString(record)
        log.predict_log.request.model_spec.ClearField("version")  # a user's request names no version
        records.append(log.SerializeToString())
    # A record that is no PredictionLog among them is counted and the ones after it still read.
    write_log_file(folder, datetime.fromtimestamp(CLOCK[0] + 1, timezone.utc),
                   [*records[:10], b"\x00garbage", *records[10:350]], seq=1)
    write_log_file(folder, datetime.fromtimestamp(CLOCK[0] - 60, timezone.utc), records[350:], seq=2,
                   modified=datetime.fromtimestamp(CLOCK[0] + 30, timezone.utc))
    figures = skew_check(tmp_path / "logs", taxi).check(CANDIDATE, since=CLOCK[0])
    assert (figures["requests"], figures["left_out"], figures["files"]) == (
        350, {"before the rollout": 50, "not a PredictionLog": 1}, 1)


def test_requests_are_taken_by_their_own_time_from_the_rollouts_start_on(tmp_path, taxi):
    logs = tmp_path / "logs"
    answered = [CLOCK[0] - 1] * 30 + [CLOCK[0]] * 20 + [CLOCK[0] + 1] * 380
    now = [answered[0]]
    # One logger, one file that began before the rollout: its requests are taken by their own time.
    logger = RequestLogger(RequestLogConfig(enabled=True), str(logs), clock=lambda: now[0])
    for at, row in zip(answered, [*taxi["served"][:30], *taxi["served"]], strict=True):
        now[0] = at
        inputs = encode([row], taxi["types"])
        prediction = predict_messages_from_arrays(MODEL, None, None, CANDIDATE, "serving_default", inputs,
                                                  {"probabilities": np.array([0.5], np.float32)})
        logger.submit(MODEL, lambda prediction=prediction: prediction)
    assert logger.flush()
    logger.close()
    [path] = (logs / MODEL).iterdir()
    # The writer's newest file ends at its modification time: the fake clock's, not the machine's.
    os.utime(path, (CLOCK[0] + 2, CLOCK[0] + 2))
    figures = skew_check(logs, taxi).check(CANDIDATE, since=CLOCK[0])
    assert (figures["requests"], figures["left_out"], figures["files"]) == (400, {"before the rollout": 30}, 1)


def test_logs_that_cannot_be_read_are_inconclusive(tmp_path, taxi):
    figures = skew_check(tmp_path / "gone", taxi).check(CANDIDATE, since=CLOCK[0])
    assert figures == {"requests": 0, "min_requests": 300, "features": [], "flagged": [], "verdict": "inconclusive",
                       "inconclusive": f"the request logs could not be read: there are no request logs of model "
                                       f"'tiny': {tmp_path}/gone/tiny does not exist; point serving.request_log."
                                       "directory at the folder the servers log requests to."}


def test_no_request_of_the_candidate_at_all_is_inconclusive(tmp_path, taxi):
    log_requests(tmp_path / "logs", taxi["served"][:5], taxi["types"], STABLE, CLOCK[0] + 1)
    figures = skew_check(tmp_path / "logs", taxi, min_requests=1).check(CANDIDATE, since=CLOCK[0])
    assert (figures["requests"], figures["verdict"], figures["files"]) == (0, "inconclusive", 0)
    assert figures["left_out"] == {"another version's": 5}


def test_training_data_gone_mid_rollout_fails_the_step(tmp_path, taxi):
    log_requests(tmp_path / "logs", taxi["served"][:5], taxi["types"], CANDIDATE, CLOCK[0] + 1)

    def gone(version):
        raise OSError(f"no {version}/assets.extra/training/statistics.pb")

    figures = SkewCheck(str(tmp_path / "logs"), MODEL, MonitoringConfig(), 5, gone).check(CANDIDATE, since=CLOCK[0])
    assert figures == {"requests": 5, "min_requests": 5, "features": [], "flagged": [], "verdict": "failed",
                       "error": "version 2's training data could not be read: no 2/assets.extra/training/"
                                "statistics.pb", "files": 1, "left_out": {}}
