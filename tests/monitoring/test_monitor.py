"""`mlops monitor` end to end on a real small pipeline run's artifacts: requests drawn from the eval split raise no
skew anomaly; fare x 3 and an unseen payment_type are flagged, exactly those two, for skew and for drift; the window by
time and by count; too few requests; the version that answered; the page, the record, the gauges and the
Pushgateway; every error a user can cause in one sentence with exit code 2."""
from __future__ import annotations

import http.server
import json
import shutil
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from components.publisher.publish import publish_model
from monitoring.monitor import EXIT_CROSSED, MonitorError, Window, monitor, window_from_arguments
from pipeline import cli
from settings.config import load_config
from tests.browser import render
from tests.conftest import as_cli_flags
from tests.monitoring.conftest import MODEL
from tests.monitoring.request_logs import request_records, write_log_file
from tests.serving.conftest import save_tiny_model

T0 = datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)


def shifted(rows):
    """Fare tripled; a payment type the training data never had."""
    return [{**r, "fare": None if r["fare"] is None else r["fare"] * 3, "payment_type": b"Bitcoin"} for r in rows]


def overrides(taxi_run, tmp_path, *extra):
    return [*taxi_run.overrides, f"serving.request_log.directory={tmp_path}/logs",
            f"monitoring.output_dir={tmp_path}/out", "monitoring.min_requests=100", *extra]


def config(taxi_run, tmp_path, *extra):
    return load_config(None, overrides(taxi_run, tmp_path, *extra))


def log(taxi_run, tmp_path, rows, minutes, seq, version=None, **kwargs):
    """Writes `rows` as one log file starting `minutes` after T0 and last written 5 minutes later."""
    return write_log_file(tmp_path / "logs" / MODEL, T0 + timedelta(minutes=minutes),
                          request_records(rows, taxi_run.types, version or taxi_run.version, **kwargs), seq=seq,
                          modified=T0 + timedelta(minutes=minutes + 5))


def test_requests_drawn_from_the_eval_split_raise_no_skew_anomaly(taxi_run, tmp_path, capsys):
    evaluation = taxi_run.splits["eval"]
    log(taxi_run, tmp_path, evaluation[:200], 0, 0)
    log(taxi_run, tmp_path, evaluation[200:], 10, 1, rows_per_request=4)
    result = monitor(config(taxi_run, tmp_path), Window(last=1000), now=T0 + timedelta(hours=1))
    record = result.record
    assert result.exit_code == 0 and record["judged"] and record["flagged"] == []
    assert record["window"]["rows"] == len(evaluation) > 300
    assert record["window"]["requests"] == 200 + (len(evaluation) - 200 + 3) // 4
    features = {f["name"]: f for f in record["features"]}
    assert sorted(features) == sorted(taxi_run.config.features)
    for name, feature in features.items():
        assert feature["skew"] is not None and not feature["skew"]["crossed"], name
        assert feature["anomalies"] == [] and feature["drift"] is None, name
    assert not record["previous"]["judged"] and record["previous"]["requests"] == 0
    out = capsys.readouterr().out
    requests = record["window"]["requests"]
    assert f"read 2 log file(s): {requests:,} requests in the window, 0 in the one before" in out
    assert f"statistics of {requests:,} requests answered by version 1" in out


def test_drift_is_not_judged_against_a_window_before_under_half_the_judged_ones_size(taxi_run, tmp_path):
    """Skew is judged; drift against 74 requests for 150 would weigh noise the thresholds were not set for."""
    evaluation = taxi_run.splits["eval"]
    log(taxi_run, tmp_path, evaluation[:74], 0, 0)
    log(taxi_run, tmp_path, shifted(evaluation[74:224]), 10, 1)
    settings = config(taxi_run, tmp_path, "monitoring.min_requests=50")
    record = monitor(settings, Window(last=150), now=T0 + timedelta(hours=1)).record
    assert record["judged"] and {"fare", "payment_type"} <= set(record["flagged"]), "skew still flags the shift"
    assert record["previous"]["requests"] == 74 and not record["previous"]["judged"]
    assert record["previous"]["note"] == "under 50% of the judged window's 150 requests: too few to judge drift against"
    assert all(feature["drift"] is None for feature in record["features"])
    # One request more before, and drift is judged.
    log(taxi_run, tmp_path, evaluation[224:225], -10, 2)
    record = monitor(settings, Window(last=150), now=T0 + timedelta(hours=1)).record
    assert record["previous"]["requests"] == 75 and record["previous"]["judged"] and record["previous"]["note"] == ""
    assert all(feature["drift"] is not None for feature in record["features"])


def test_a_shifted_fare_and_an_unseen_payment_type_are_flagged_and_nothing_else(taxi_run, tmp_path):
    evaluation = taxi_run.splits["eval"]
    log(taxi_run, tmp_path, evaluation, 0, 0)
    log(taxi_run, tmp_path, shifted(evaluation), 10, 1)
    result = monitor(config(taxi_run, tmp_path), Window(last=len(evaluation)), now=T0 + timedelta(hours=1))
    record = result.record
    assert result.exit_code == EXIT_CROSSED == record["exit_code"] == 3
    assert record["flagged"] == ["fare", "payment_type"]
    features = {f["name"]: f for f in record["features"]}
    for name in ("fare", "payment_type"):
        assert features[name]["skew"]["crossed"] and features[name]["drift"]["crossed"], name
    assert features["fare"]["skew"]["measure"] == "Jensen-Shannon divergence" and features["fare"]["anomalies"] == []
    assert features["payment_type"]["skew"]["measure"] == "L-infinity distance"
    assert features["payment_type"]["skew"]["value"] == pytest.approx(1.0)
    assert "Bitcoin" in features["payment_type"]["anomalies"][0]
    assert record["previous"]["judged"] and record["previous"]["requests"] == len(evaluation)
    for name, feature in features.items():
        if name not in ("fare", "payment_type"):
            assert not feature["flagged"] and feature["drift"]["value"] == pytest.approx(0.0, abs=1e-9), name
    # The record, the page and the gauges, beside each other.
    folder = Path(result.folder)
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.prom", "monitor.html", "monitor.json"]
    assert json.loads((folder / "monitor.json").read_text()) == record
    assert (tmp_path / "out" / f"{MODEL}.prom").read_text() == (folder / "metrics.prom").read_text()


def test_the_page_says_which_version_window_and_requests_and_draws_each_feature(taxi_run, tmp_path):
    evaluation = taxi_run.splits["eval"]
    log(taxi_run, tmp_path, shifted(evaluation), 0, 0, sampling_rate=0.25)
    result = monitor(config(taxi_run, tmp_path), Window(since=T0, until=T0 + timedelta(minutes=30)),
                     now=T0 + timedelta(hours=1))
    rendered = render(Path(result.folder) / "monitor.html")
    assert rendered.console == []
    text = rendered.dom
    assert f"Skew and drift of taxi version {taxi_run.version}" in text
    assert "requests logged from 2026-01-31T12:00:00Z to 2026-01-31T12:30:00Z" in text
    assert "2026-01-31T12:00:00Z to 2026-01-31T12:05:00Z (1 log file)" in text
    assert f"{len(evaluation):,} requests, {len(evaluation):,} rows (sampled at 25%: about {4 * len(evaluation):,} " \
           "served)" in text
    assert "2 features crossed a threshold or broke the training schema: fare, payment_type." in text
    features = taxi_run.config.features
    assert {f"feature-{name}" for name in features} <= set(rendered.ids)
    numeric = [n for n in features if n not in ("payment_type", "company")]
    assert rendered.charts == {**{f"cdf-{n}": 1 for n in numeric}, "shares-payment_type": 1, "shares-company": 1}


def test_drift_is_judged_against_the_window_as_long_before(taxi_run, tmp_path):
    evaluation = taxi_run.splits["eval"]
    log(taxi_run, tmp_path, evaluation, 0, 0)
    log(taxi_run, tmp_path, shifted(evaluation), 30, 1)
    log(taxi_run, tmp_path, shifted(evaluation), 60, 2)
    # 12:30 to 13:00 against 12:00 to 12:30: the shift came in this window.
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path)), "--since", "2026-01-31T12:30:00Z",
                     "--until", "2026-01-31T13:00:00Z"])
    assert code == 3
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    record = json.loads((folder / "monitor.json").read_text())
    drifted = sorted(f["name"] for f in record["features"] if f["drift"] and f["drift"]["crossed"])
    assert drifted == ["fare", "payment_type"]
    # One writer: each file runs until its next one starts.
    assert (record["window"]["from"], record["window"]["to"]) == ("2026-01-31T12:30:00Z",
                                                                                         "2026-01-31T13:00:00Z")
    assert record["previous"]["from"] == "2026-01-31T12:00:00Z"
    shutil.rmtree(folder)
    # 13:00 to 13:30 against 12:30 to 13:00: shifted both times, so no drift, and the skew stays.
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path)), "--since", "2026-01-31T13:00:00Z",
                     "--until", "2026-01-31T13:30:00Z"])
    assert code == 3
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    record = json.loads((folder / "monitor.json").read_text())
    assert [f["name"] for f in record["features"] if f["drift"]["crossed"]] == []
    assert record["flagged"] == ["fare", "payment_type"]


@pytest.mark.parametrize("extra, judged", [(0, True), (1, False)])
def test_a_window_of_fewer_than_min_requests_is_reported_not_judged(taxi_run, tmp_path, capsys, extra, judged):
    served = shifted(taxi_run.splits["eval"][:150])
    log(taxi_run, tmp_path, served, 0, 0)
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path, f"monitoring.min_requests={150 + extra}")),
                     "--last", "150"])
    out = capsys.readouterr().out
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    record = json.loads((folder / "monitor.json").read_text())
    assert record["judged"] is judged and code == (3 if judged else 0)
    if not judged:
        assert record["features"] == [] and record["flagged"] == []
        assert record["note"] == "150 requests in the window, fewer than monitoring.min_requests (151): nothing judged"
        assert "not judged: 150 requests in the window" in out
        assert "Not judged: 150 requests" in (folder / "monitor.html").read_text()
    else:
        assert "FLAGGED fare: skew" in out and "FLAGGED payment_type" in out
    assert f"report: {folder}/monitor.html" in out


def test_the_version_that_answered_most_is_judged_and_others_are_named(taxi_run, tmp_path, capsys):
    evaluation = taxi_run.splits["eval"]
    log(taxi_run, tmp_path, evaluation[:300], 0, 0)
    log(taxi_run, tmp_path, evaluation[300:], 10, 1, version=7)
    result = monitor(config(taxi_run, tmp_path), Window(last=1000), now=T0 + timedelta(hours=1))
    window = result.record["window"]
    assert result.record["version"] == taxi_run.version and window["requests"] == 300
    assert window["versions"] == {str(taxi_run.version): 300, "7": len(evaluation) - 300}
    assert "version 7: " in (Path(result.folder) / "monitor.html").read_text()
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path)), "--last", "1000", "--version", "7"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"error: the logs name version 7 of 'taxi', which the model repository {taxi_run.config.serving_base_dir} "
        "does not hold; point output_root at the repository the server serves.\n")
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path)), "--last", "1000", "--version", "5"])
    assert code == 2
    assert capsys.readouterr().err == ("error: no logged request of the window was answered by version 5; the "
                                       "window's versions are 1, 7.\n")


def test_a_version_published_without_its_training_data_is_named(taxi_run, tmp_path, capsys):
    root = tmp_path / "root"
    shutil.copytree(taxi_run.config.serving_base_dir, root / "serving")
    export = save_tiny_model(tmp_path / "export", 2.0)
    (export / "export_report.json").write_text(json.dumps({"passed": True}))
    version = publish_model(str(export), str(root / "serving"), MODEL, {"blessed": True}).version
    log(taxi_run, tmp_path, taxi_run.splits["eval"], 0, 0, version=version)
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path, f"output_root={root}")), "--last", "500"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"error: version {version} of 'taxi' carries no training schema and statistics "
        "(assets.extra/training/schema.pbtxt is missing): it was published before versions did; publish it again "
        "with `mlops run`.\n")


def test_no_logs_and_bad_windows_are_told_in_one_sentence(taxi_run, tmp_path, capsys):
    flags = as_cli_flags(overrides(taxi_run, tmp_path))
    assert cli.main(["monitor", *flags]) == 2
    assert capsys.readouterr().err == (
        f"error: there are no request logs of model 'taxi': {tmp_path}/logs/taxi does not exist; point "
        "serving.request_log.directory at the folder the servers log requests to.\n")
    log(taxi_run, tmp_path, taxi_run.splits["eval"][:10], 0, 0)
    for arguments, message in [
        (["--last", "5", "--since", "1h"], "--last counts requests and --since/--until name times; give one or the "
                                           "other."),
        (["--until", "1h"], "--until needs --since: the window runs from --since to --until."),
        (["--since", "2026-01-31T13:00:00Z", "--until", "2026-01-31T12:00:00Z"],
         "the window from 2026-01-31T13:00:00Z to 2026-01-31T12:00:00Z is empty; --since must come before --until."),
        (["--last", "0"], "--last 0 names no request; ask for 1 or more."),
        (["--since", "noon"], "'noon' is not a time; write an ISO 8601 UTC time such as 2026-01-31T14:00:00Z, or a "
                              "span before now such as 90m, 2h or 1d."),
    ]:
        assert cli.main(["monitor", *flags, *arguments]) == 2, arguments
        assert capsys.readouterr().err == f"error: {message}\n"


def test_the_default_window_is_the_configured_number_of_requests():
    now = T0
    assert window_from_arguments(None, None, None, 250, now) == Window(last=250)
    assert window_from_arguments(None, None, 7, 250, now) == Window(last=7)
    assert window_from_arguments("2h", None, None, 250, now) == Window(since=T0 - timedelta(hours=2), until=T0)
    with pytest.raises(MonitorError):
        window_from_arguments("2h", "3h", None, 250, now)


class _Gateway(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, str, str]] = []
    status = 200

    def do_PUT(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        type(self).received.append(("PUT", self.path, self.headers["Content-Type"], body))
        self.send_response(type(self).status)
        self.end_headers()
        self.wfile.write(b"pushgateway says no" if type(self).status >= 300 else b"")

    def log_message(self, *args):
        pass


@pytest.fixture
def gateway():
    _Gateway.received, _Gateway.status = [], 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Gateway
    server.shutdown()
    server.server_close()


def test_the_distances_are_gauges_in_a_file_and_on_the_pushgateway(taxi_run, tmp_path, gateway, capsys):
    url, handler = gateway
    log(taxi_run, tmp_path, shifted(taxi_run.splits["eval"]), 0, 0)
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path, "monitoring.pushgateway_job=nightly")),
                     "--last", "1000", "--pushgateway", url + "/"])
    assert code == 3
    [(method, path, content_type, body)] = handler.received
    assert (method, path) == ("PUT", "/metrics/job/nightly/model/taxi")
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    assert body == (folder / "metrics.prom").read_text()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert all(f.type == "gauge" for f in families.values())
    skew = {s.labels["feature"]: s for s in families["mlops_monitor_skew"].samples}
    assert sorted(skew) == sorted(taxi_run.config.features)
    assert skew["fare"].labels == {"model": "taxi", "version": str(taxi_run.version), "feature": "fare",
                                   "measure": "Jensen-Shannon divergence"}
    record = json.loads((folder / "monitor.json").read_text())
    fare = next(f for f in record["features"] if f["name"] == "fare")
    assert skew["fare"].value == fare["skew"]["value"] > fare["skew"]["threshold"]
    thresholds = {s.labels["feature"]: s.value for s in families["mlops_monitor_skew_threshold"].samples}
    assert thresholds["fare"] == 0.25 and thresholds["company"] == 0.1
    flagged = {s.labels["feature"]: s.value for s in families["mlops_monitor_feature_flagged"].samples}
    assert {name for name, value in flagged.items() if value == 1} == {"fare", "payment_type"}
    [crossed] = families["mlops_monitor_threshold_crossed"].samples
    [requests] = families["mlops_monitor_requests"].samples
    assert (crossed.value, requests.value) == (1, len(taxi_run.splits["eval"]))
    assert "mlops_monitor_drift" not in families, "no window before: no drift gauge"
    capsys.readouterr()


@pytest.mark.parametrize("status", [500, None])
def test_a_pushgateway_that_does_not_take_the_figures_fails_the_run_after_the_report(taxi_run, tmp_path, gateway,
                                                                                     capsys, status):
    url, handler = gateway
    handler.status = status or 200
    if status is None:
        url = "http://127.0.0.1:9"  # discard port: nothing listens
    log(taxi_run, tmp_path, taxi_run.splits["eval"], 0, 0)
    code = cli.main(["monitor", *as_cli_flags(overrides(taxi_run, tmp_path)), "--last", "1000", "--pushgateway", url])
    captured = capsys.readouterr()
    assert code == 1
    [folder] = (tmp_path / "out" / MODEL).iterdir()
    assert json.loads((folder / "monitor.json").read_text())["exit_code"] == 0, "the judgement itself passed"
    assert "no threshold crossed" in captured.out
    if status:
        assert captured.err == (f"error: the Pushgateway at {url} refused the metrics (HTTP 500: pushgateway says no); "
                                "check --pushgateway and the gateway's log.\n")
    else:
        assert captured.err.startswith(f"error: the Pushgateway at {url} could not be reached (")
        assert captured.err.endswith("); check --pushgateway or monitoring.pushgateway.\n")
