"""The rollout's skew check (rollout.skew_check): before each step, the requests the candidate answered since the
rollout began, read from the servers' request logs (serving/server/request_log.py), are judged against the candidate's
own training statistics and schema by `mlops monitor`'s gate (monitoring/judge.py, the monitoring section's thresholds).

A feature past its threshold, or data that breaks the training schema, fails the step as a failed window does: a
candidate trained on data unlike what it now receives is rolled back, whatever its error rate. Fewer logged requests
than rollout.skew_min_requests, or logs that cannot be read, make it inconclusive: never a pass.

Only user traffic is judged: the verifier's golden requests name the candidate's version (rollout/verify.py)
and are left out, as are requests answered by other versions or before the rollout began. Where a server serves one
version and answers no label (KubeDL), the verifier's requests cannot be told apart and are judged too.
"""
from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from monitoring import judge as gate
from monitoring import logs
from settings.config import MonitoringConfig

PASSED, FAILED, INCONCLUSIVE = "passed", "failed", "inconclusive"
# Why a logged request is not judged, as the figures count them.
VERIFIER, OTHER_VERSION, BEFORE_ROLLOUT = "the verifier's own", "another version's", "before the rollout"


class SkewCheckError(ValueError):
    """The skew check cannot run at all (request logging off, no logs, a candidate without training data); the
    message says what to do."""


def feature_figures(verdict: gate.FeatureVerdict) -> dict[str, Any]:
    """One feature's verdict as the state records it."""
    skew = verdict.skew
    return {"name": verdict.name, "kind": verdict.kind,
            "measure": skew.measure if skew else None, "value": skew.value if skew else None,
            "threshold": skew.threshold if skew else None, "crossed": bool(skew and skew.crossed),
            "anomalies": list(verdict.anomalies), "flagged": verdict.flagged}


def describe_feature(feature: dict[str, Any]) -> str:
    """`fare (Jensen-Shannon divergence 0.6100 > 0.25)`, with the schema anomalies after the distance."""
    parts = []
    if feature["crossed"]:
        parts.append(f"{feature['measure']} {feature['value']:.4f} > {feature['threshold']}")
    parts += [anomaly.strip() for anomaly in feature["anomalies"]]
    return f"{feature['name']} ({'; '.join(parts)})"


def judge_skew(requests: int, min_requests: int, candidate: int,
               verdicts: Callable[[], list[gate.FeatureVerdict]]) -> dict[str, Any]:
    """The skew check's figures and verdict from the number of logged candidate requests and, when there are enough of
    them, the gate's verdicts (`verdicts` runs only then)."""
    figures: dict[str, Any] = {"requests": requests, "min_requests": min_requests, "features": [], "flagged": []}
    if not gate.enough(requests, min_requests):
        figures["inconclusive"] = (f"{requests} logged requests answered by version {candidate} since the rollout "
                                   f"began, fewer than rollout.skew_min_requests {min_requests}: skew not judged")
    else:
        features = [feature_figures(v) for v in verdicts()]
        flagged = [f for f in features if f["flagged"]]
        figures.update(features=features, flagged=[f["name"] for f in flagged])
        if flagged:
            figures["error"] = (f"the requests version {candidate} answered are skewed against its training data: "
                                + ", ".join(describe_feature(f) for f in flagged))
    figures["verdict"] = INCONCLUSIVE if "inconclusive" in figures else FAILED if "error" in figures else PASSED
    return figures


def user_requests(records: list[bytes], candidate: int, since: float, file_start: float,
                  skipped: Counter[str]) -> list[Any]:
    """The PredictionLogs among `records` that the candidate answered for users at or after `since` (seconds); a
    record without its own time goes with its file's start. The others are counted in `skipped` by why."""
    taken = []
    for record in records:
        log = logs.parse_record(record, skipped)
        if log is None:
            continue
        if log.log_metadata.model_spec.version.value != candidate:
            skipped[OTHER_VERSION] += 1
        elif (log.log_metadata.timestamp_secs or file_start) < since:
            skipped[BEFORE_ROLLOUT] += 1
        elif log.predict_log.request.model_spec.HasField("version"):
            skipped[VERIFIER] += 1
        else:
            taken.append(log)
    return taken


class SkewCheck:
    """Reads the candidate's logged requests under `log_dir` and judges them with `monitoring`'s thresholds against
    the schema and statistics `training(version)` returns (monitoring/monitor.py, training_data)."""

    def __init__(self, log_dir: str, model: str, monitoring: MonitoringConfig, min_requests: int,
                 training: Callable[[int], tuple[Any, Any]], logging_enabled: bool = True) -> None:
        self.log_dir = log_dir
        self.model = model
        self.monitoring = monitoring
        self.min_requests = min_requests
        self.training = training
        self.logging_enabled = logging_enabled

    def ready(self, candidate: int) -> None:
        """Raises SkewCheckError at the start of a rollout whose skew check could never judge anything."""
        import tensorflow as tf

        if not self.logging_enabled:
            raise SkewCheckError("rollout.skew_check judges the canary's logged requests, but serving.request_log."
                                 "enabled is false; enable serving.request_log on the servers and in this config "
                                 "(docs/tutorials/monitoring.md), or set rollout.skew_check=false.")
        folder = posixpath.join(self.log_dir, self.model)
        if not tf.io.gfile.isdir(folder):
            raise SkewCheckError(f"rollout.skew_check finds no request logs of {self.model!r} at {folder}; point "
                                 "serving.request_log.directory at the folder the servers log to (on Kubernetes a "
                                 "shared claim or bucket, not the pods' emptyDir: docs/tutorials/kubernetes.md), "
                                 "or set rollout.skew_check=false.")
        try:
            self.training(candidate)
        except (ValueError, OSError) as e:
            raise SkewCheckError(f"rollout.skew_check needs version {candidate}'s training data: {e}") from None

    def check(self, candidate: int, since: float) -> dict[str, Any]:
        """The figures of the candidate's requests logged since `since` (seconds since the epoch), judged."""
        import tensorflow as tf

        window = logs.WindowStatistics()
        skipped: Counter[str] = Counter()
        # The files that held requests judged.
        files_read = 0
        try:
            files = logs.list_log_files(self.log_dir, self.model)
            begin = datetime.fromtimestamp(since, tz=timezone.utc)
            # Up to the newest file, whatever its stamp: the writers' clocks are not the controller's.
            for log_file in logs.files_between(files, begin, datetime.max.replace(tzinfo=timezone.utc)):
                # A file still being written ends in a partial record: its whole records are judged.
                records, _ = logs.read_records(log_file.path)
                taken = user_requests(records, candidate, since, log_file.start.timestamp(), skipped)
                if taken:
                    files_read += 1
                    window.add_logs(taken)
        except (logs.LogError, OSError, tf.errors.OpError) as e:
            # A store that did not answer this time may next time: retried as an inconclusive window is.
            return {"requests": 0, "min_requests": self.min_requests, "features": [], "flagged": [],
                    "verdict": INCONCLUSIVE, "inconclusive": f"the request logs could not be read: {e}"}
        requests = window.requests.get(candidate, 0)

        def verdicts() -> list[gate.FeatureVerdict]:
            schema, training = self.training(candidate)
            # Only the candidate's requests were added.
            return gate.judge(schema, training, window.statistics(), None, self.monitoring)

        try:
            figures = judge_skew(requests, self.min_requests, candidate, verdicts)
        except (ValueError, OSError) as e:  # monitoring.monitor.MonitorError: the training data went missing
            figures = {"requests": requests, "min_requests": self.min_requests, "features": [], "flagged": [],
                       "verdict": FAILED, "error": f"version {candidate}'s training data could not be read: {e}"}
        figures.update(files=files_read, left_out={**dict(skipped), **dict(window.skipped)})
        return figures
