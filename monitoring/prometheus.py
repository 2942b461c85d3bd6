"""A monitor run's figures as Prometheus gauges: the text exposition format, written as a file for node-exporter's
textfile collector and PUT to a Pushgateway (its API: PUT /metrics/job/<job>/<label>/<value> replaces the group)."""
from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "mlops_monitor"
GAUGES = {
    "skew": "Distance of a served feature's distribution from its training distribution (L-infinity distance for a "
            "categorical feature, Jensen-Shannon divergence for a numeric one).",
    "skew_threshold": "The skew distance above which the feature is flagged.",
    "drift": "Distance of a served feature's distribution from the previous window's (same measures as skew).",
    "drift_threshold": "The drift distance above which the feature is flagged.",
    "feature_flagged": "1 when the feature crossed a threshold or broke the training schema in the window.",
    "requests": "Logged requests of the version in the window.",
    "rows": "Rows (examples) of those requests.",
    "judged": "1 when the window held enough requests to be judged.",
    "threshold_crossed": "1 when any feature of the window was flagged.",
    "last_run_timestamp_seconds": "When this run judged the window (Unix time).",
}


class PushError(RuntimeError):
    """The Pushgateway did not take the metrics; the message says where and why."""


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, Any]) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def _number(value: float) -> str:
    return repr(float(value))


def exposition(record: Mapping[str, Any]) -> str:
    """The gauges of a monitor record (monitor.json) in Prometheus' text format."""
    base = {"model": record["model"], "version": "" if record["version"] is None else record["version"]}
    samples: dict[str, list[tuple[dict[str, Any], float]]] = {name: [] for name in GAUGES}
    for feature in record["features"]:
        labels = {**base, "feature": feature["name"]}
        for comparison in ("skew", "drift"):
            distance = feature.get(comparison)
            if distance is not None:
                measured = {**labels, "measure": distance["measure"]}
                samples[comparison].append((measured, distance["value"]))
                samples[f"{comparison}_threshold"].append((measured, distance["threshold"]))
        samples["feature_flagged"].append((labels, float(feature["flagged"])))
    window = record["window"]
    samples["requests"].append((base, window["requests"]))
    samples["rows"].append((base, window["rows"]))
    samples["judged"].append((base, float(record["judged"])))
    samples["threshold_crossed"].append((base, float(bool(record["flagged"]))))
    samples["last_run_timestamp_seconds"].append((base, record["finished_at_seconds"]))
    lines = []
    for name, help_text in GAUGES.items():
        if not samples[name]:
            continue
        lines += [f"# HELP {PREFIX}_{name} {help_text}", f"# TYPE {PREFIX}_{name} gauge"]
        lines += [f"{PREFIX}_{name}{_labels(labels)} {_number(value)}" for labels, value in samples[name]]
    return "\n".join(lines) + "\n"


def push(url: str, job: str, model: str, text: str, timeout: float) -> None:
    """PUTs `text` to the Pushgateway at `url` as the group job=<job>, model=<model> (replacing what it held)."""
    target = f"{url.rstrip('/')}/metrics/job/{quote(job, safe='')}/model/{quote(model, safe='')}"
    request = urllib.request.Request(target, data=text.encode(), method="PUT",
                                     headers={"Content-Type": CONTENT_TYPE})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace").strip()[:200]
        raise PushError(f"the Pushgateway at {url} refused the metrics (HTTP {e.code}: {body or e.reason}); check "
                        "--pushgateway and the gateway's log.") from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise PushError(f"the Pushgateway at {url} could not be reached ({reason}); check --pushgateway or "
                        "monitoring.pushgateway.") from e
