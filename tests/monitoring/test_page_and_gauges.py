"""The monitor's page and gauges drawn from a record alone: values from the requests are escaped on the page and in
the gauges' labels, the text format parses as Prometheus reads it, and a window too small to judge says so."""
from __future__ import annotations

import copy

from prometheus_client.parser import text_string_to_metric_families

from monitoring.page import monitor_html
from monitoring.prometheus import exposition

HOSTILE = "<script>alert(1)</script>"
RECORD = {
    "model": "taxi", "version": 3, "judged": True, "note": "",
    "asked": {"since": None, "until": None, "last": 500},
    "window": {"files": 2, "from": "2026-01-31T12:00:00Z", "to": "2026-01-31T12:10:00Z",
               "requests": 500, "rows": 620, "all_requests": 510, "versions": {"3": 500, "2": 10},
               "sampling_rates": [0.5], "skipped": {"not a Predict request": 4}, "truncated_files": []},
    "previous": {"files": 0, "from": None, "to": None, "requests": 0, "rows": 0,
                 "all_requests": 0, "versions": {}, "sampling_rates": [], "skipped": {}, "truncated_files": [],
                 "judged": False, "note": "fewer than monitoring.min_requests (100) to judge drift"},
    "thresholds": {"categorical_skew": 0.1, "numeric_skew": 0.25, "categorical_drift": 0.1, "numeric_drift": 0.25},
    "min_requests": 100,
    "features": [
        {"name": "company", "kind": "categorical", "flagged": True,
         "skew": {"measure": "L-infinity distance", "value": 0.4, "threshold": 0.1, "crossed": True}, "drift": None,
         "anomalies": [f"Examples contain values missing from the schema: {HOSTILE}"],
         "distributions": {"training": {"rows": 10, "missing": 0.1, "unique": 2, "top": [["Flash Cab", 0.6],
                                                                                         ["Yellow", 0.4]]},
                           "serving": {"rows": 10, "missing": 0.0, "unique": 2, "top": [[HOSTILE, 0.5],
                                                                                        ["Flash Cab", 0.5]]},
                           "previous": None}},
        {"name": 'fare"x', "kind": "numeric", "flagged": False,
         "skew": {"measure": "Jensen-Shannon divergence", "value": 0.05, "threshold": 0.25, "crossed": False},
         "drift": None, "anomalies": [],
         "distributions": {"training": {"rows": 10, "missing": 0.0, "mean": 1, "min": 0, "max": 2,
                                        "cdf": [[0, 0], [1, 0.5], [2, 1]]},
                           "serving": {"rows": 10, "missing": 0.0, "mean": 1, "min": 0, "max": 3,
                                       "cdf": [[0, 0], [1.5, 0.5], [3, 1]]},
                           "previous": None}},
    ],
    "flagged": ["company"], "exit_code": 3, "started_at": "2026-01-31T13:00:00Z", "finished_at": "2026-01-31T13:00:09Z",
    "finished_at_seconds": 1769864409.0,
    "files": {"html": "/out/monitor.html", "json": "/out/monitor.json", "prom": "/out/metrics.prom"},
}


def test_the_page_escapes_what_the_requests_carried_and_fetches_nothing():
    page = monitor_html(RECORD)
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "1 feature crossed a threshold or broke the training schema: company." in page
    assert "500 requests, 620 rows (sampled at 50%: about 1,000 served)" in page
    assert "version 2: 10 requests" in page and "4 not a Predict request" in page
    assert "0 requests, no log file &mdash; fewer than monitoring.min_requests (100) to judge drift" in page
    assert page.count("data-chart='shares-company'") == 1 and page.count("data-chart='cdf-fare&quot;x'") == 1
    # The flagged feature's section comes first.
    assert page.index("id='feature-company'") < page.index("id='feature-fare&quot;x'")


def test_a_window_not_judged_says_why_and_draws_no_feature():
    record = copy.deepcopy(RECORD)
    record.update(judged=False, note="12 requests in the window, fewer than monitoring.min_requests (100): nothing "
                                     "judged", features=[], flagged=[], exit_code=0)
    page = monitor_html(record)
    assert "Not judged: 12 requests in the window, fewer than monitoring.min_requests (100): nothing judged." in page
    assert "<h2>Features</h2>" not in page and "data-chart" not in page
    families = {f.name: f for f in text_string_to_metric_families(exposition(record))}
    assert sorted(families) == ["mlops_monitor_judged", "mlops_monitor_last_run_timestamp_seconds",
                                "mlops_monitor_requests", "mlops_monitor_rows", "mlops_monitor_threshold_crossed"]
    assert [s.value for s in families["mlops_monitor_judged"].samples] == [0.0]


def test_the_gauges_parse_and_keep_every_label_value_as_it_was():
    text = exposition(RECORD)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    skew = {s.labels["feature"]: s for s in families["mlops_monitor_skew"].samples}
    assert sorted(skew) == ["company", 'fare"x']
    assert skew['fare"x'].labels == {"model": "taxi", "version": "3", "feature": 'fare"x',
                                     "measure": "Jensen-Shannon divergence"}
    assert skew["company"].value == 0.4
    assert [s.value for s in families["mlops_monitor_skew_threshold"].samples] == [0.1, 0.25]
    assert [(s.labels["feature"], s.value) for s in families["mlops_monitor_feature_flagged"].samples] == [
        ("company", 1.0), ('fare"x', 0.0)]
    assert [s.value for s in families["mlops_monitor_requests"].samples] == [500]
    assert [s.value for s in families["mlops_monitor_threshold_crossed"].samples] == [1.0]
    assert "mlops_monitor_drift" not in families
    assert '# TYPE mlops_monitor_skew gauge' in text and text.endswith("\n")
    odd = copy.deepcopy(RECORD)
    odd["features"][0]["name"] = 'a\\b\n"c'
    [sample] = [s for f in text_string_to_metric_families(exposition(odd)) if f.name == "mlops_monitor_skew"
                for s in f.samples if s.labels["measure"] == "L-infinity distance"]
    assert sample.labels["feature"] == 'a\\b\n"c'
