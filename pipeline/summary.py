"""What the last run produced, read back from ML Metadata: eval metrics, blessing, published version."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pipeline import metadata
from reports.records import CalibrationRecord, ExportReport, OptimizationReport
from settings.files import RUN_REPORT_HTML, RUN_SUMMARY_JSON


@dataclass
class RunSummary:
    run_id: str
    # Metric name -> value, for all eval rows and per slice ("payment_type=Cash" -> {...}).
    metrics: dict[str, float] = field(default_factory=dict)
    slices: dict[str, dict[str, float]] = field(default_factory=dict)
    blessed: bool | None = None
    pushed_path: str | None = None
    # The model repository version the Publisher published (or found already published).
    published_version: int | None = None
    model_path: str | None = None
    evaluation_path: str | None = None
    # The Optimizer's and the Exporter's reports (components/optimizer, components/exporter), when they ran.
    optimization: OptimizationReport | None = None
    export: ExportReport | None = None
    # The run report's material (reports/run_page.py draws it): plain JSON, so summary.json carries it.
    task: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    plots: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    # Why the Evaluator did not bless the model: each failed threshold and the config keys that set it, with values.
    blessing_failure: str = ""
    calibration: CalibrationRecord | None = None
    serving: dict[str, Any] = field(default_factory=dict)
    cached_stages: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    elapsed_seconds: float = 0.0
    # From the start of `mlops` to the summary: the stages plus importing TensorFlow, TFX and reading the run back.
    total_seconds: float = 0.0
    # Whether the Publisher published a new version in this run (False: cached, or the same model already there).
    published_new: bool = False
    # The repository's labels on the published version, read back after the run (e.g. stable on a first version).
    published_labels: list[str] = field(default_factory=list)
    # Whether the repository's config serves the published version (its first version serves from the start).
    published_serving: bool = False
    log_path: str = ""
    # A failed run: the stage it stopped in, and the error's sentence (what failed and what to do).
    failed_stage: str = ""
    failure: str = ""

    def to_dict(self) -> dict[str, Any]:
        """summary.json's object: every field as plain JSON, a report that did not run as {}."""
        records = {"optimization": self.optimization, "export": self.export, "calibration": self.calibration}
        return {**asdict(replace(self, optimization=None, export=None, calibration=None)),
                **{name: record.to_dict() if record is not None else {} for name, record in records.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def _flatten_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """{output: {sub key: {name: value}}} as {name: value}; a figure per class as "precision/classId:0"."""
    flat = {}
    for sub_keys in metrics.values():
        for sub_key, name_to_value in sub_keys.items():
            for name, value in name_to_value.items():
                if "doubleValue" in value:
                    flat[f"{name}/{sub_key}" if sub_key else name] = float(value["doubleValue"])
    return flat


def _slice_name(slice_key: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in slice_key) or "overall"


def read_evaluation(uri: str) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Overall and per-slice metrics from an Evaluator output folder."""
    import tensorflow_model_analysis as tfma

    result = tfma.load_eval_result(uri)
    overall, slices = {}, {}
    for slice_key, metrics in result.slicing_metrics:
        flat = _flatten_metrics(metrics)
        if not slice_key:
            overall = flat
        else:
            slices[_slice_name(slice_key)] = flat
    return overall, slices


def latest_run(metadata_path: str, pipeline_name: str, features: list[str] | None = None,
               model_name: str = "") -> RunSummary:
    """Summary of the newest run of `pipeline_name` recorded in the MLMD database; with the served model's
    `features` and `model_name`, also an eval row to call the published version with."""
    store = metadata.connect(metadata_path)
    runs = metadata.runs(store, pipeline_name)
    if not runs:
        metadata.latest_run(store, pipeline_name)  # raises NoRecordError with its sentence
    run = runs[-1]
    summary = RunSummary(run_id=run.name)
    outputs = metadata.run_outputs(store, run, pipeline_name)
    by_type: dict[str, list[metadata.Output]] = {}
    for output in outputs:
        by_type.setdefault(output.type_name, []).append(output)
    # StatisticsGen's and ExampleValidator's outputs, not the Transform's statistics and anomalies of the same types.
    statistics = [o for o in by_type.get("ExampleStatistics", []) if o.key == "statistics"]
    anomalies = [o for o in by_type.get("ExampleAnomalies", []) if o.key == "anomalies"]
    for output in outputs:
        artifact, props = output.artifact, output.artifact.custom_properties
        if output.type_name == "ModelEvaluation":
            summary.evaluation_path = artifact.uri
            summary.metrics, summary.slices = read_evaluation(artifact.uri)
            summary.plots = read_plots(artifact.uri)
            summary.baseline = read_baseline(artifact.uri)
        elif output.type_name == "ModelBlessing":
            summary.blessed = bool(props["blessed"].int_value) if "blessed" in props else None
        elif output.type_name == "PushedModel":
            if "pushed" in props and props["pushed"].int_value:
                summary.pushed_path = props["pushed_destination"].string_value
                if "pushed_version" in props:
                    summary.published_version = props["pushed_version"].int_value
                # Set by this run's Publisher only: a cached one's artifact tells of the run that published.
                summary.published_new = bool(props["pushed_new"].int_value) if "pushed_new" in props else True
        elif output.type_name == "Model":
            _read_model_reports(summary, artifact.uri)
    export = summary.export
    summary.task = export.task.to_dict() if export is not None and export.task is not None else {}
    if export is not None and export.predicted_actual:
        summary.plots["predicted_actual"] = [list(pair) for pair in export.predicted_actual]
    # The newest earlier run that computed statistics (a run stopped before StatisticsGen has none).
    previous, previous_run = [], ""
    for earlier in reversed(runs[:-1]):
        previous = [o for o in metadata.run_outputs(store, earlier, pipeline_name)
                    if o.type_name == "ExampleStatistics" and o.key == "statistics"]
        if previous:
            previous_run = earlier.name
            break
    summary.data = read_data(statistics, anomalies, previous, previous_run)
    left_out = [o.artifact.custom_properties["missing_label_rows"].int_value for o in by_type.get("Examples", [])
                if o.node == "CsvExampleGen" and "missing_label_rows" in o.artifact.custom_properties]
    if summary.data and left_out and left_out[0]:
        summary.data["missing_label_rows"] = left_out[0]
    summary.training.update(read_tuner(by_type.get("HyperParameters", []), by_type.get("TunerResults", [])))
    if summary.published_version is not None and features:
        examples = [o for o in by_type.get("Examples", []) if o.node == "CsvExampleGen"]
        row = serving_row(examples[0].artifact, features) if examples else {}
        summary.serving = {"model_name": model_name, "version": summary.published_version, "row": row}
    return summary


def _split_names(artifact: Any) -> list[str]:
    names = artifact.properties["split_names"].string_value if "split_names" in artifact.properties else ""
    return json.loads(names or "[]")


def _statistics(uri: str, split: str) -> Any:
    from tensorflow_metadata.proto.v0 import statistics_pb2

    from components import artifacts

    path = artifacts.join(artifacts.split_uri(uri, split), artifacts.STATISTICS_FILE)
    return statistics_pb2.DatasetFeatureStatisticsList.FromString(artifacts.read_bytes(path)).datasets[0]


# Top values a feature's small chart shows, and bars of a numeric histogram.
TOP_VALUES = 8


def feature_summary(dataset: Any) -> dict[str, dict[str, Any]]:
    """Per feature of one split's TFDV statistics: its kind, the share of rows without a value, and a small
    distribution (histogram counts with their range, or the most frequent values)."""
    from tensorflow_metadata.proto.v0 import statistics_pb2

    from reports.statistics_page import present_rows

    rows = int(dataset.num_examples)
    found = {}
    for feature in dataset.features:
        entry: dict[str, Any] = {"missing": (rows - present_rows(feature)) / rows if rows else 0.0}
        if feature.HasField("num_stats"):
            stats = feature.num_stats
            standard = next((h for h in stats.histograms if h.type == statistics_pb2.Histogram.STANDARD), None)
            entry.update(kind="numeric", mean=stats.mean, std=stats.std_dev, min=stats.min, max=stats.max,
                         histogram=[float(b.sample_count) for b in standard.buckets] if standard else [])
        else:
            stats = feature.string_stats
            entry.update(kind="string", unique=int(stats.unique),
                         top=[[t.value, float(t.frequency)] for t in list(stats.top_values)[:TOP_VALUES]])
        found[feature.path.step[0]] = entry
    return found


def drift(current: dict[str, dict[str, Any]], previous: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per feature in both: a number's mean shift in the previous standard deviations, a string's L-infinity
    distance between the two shares of its top values (TFDV's drift measure), and the missing share's change."""
    found = []
    for name in sorted(set(current) & set(previous)):
        now, then = current[name], previous[name]
        if now["kind"] != then["kind"]:
            continue
        if now["kind"] == "numeric":
            value = abs(now["mean"] - then["mean"]) / then["std"] if then["std"] else 0.0
            measure = "mean shift (std devs)"
        else:
            def shares(entry: dict[str, Any]) -> dict[str, float]:
                total = sum(f for _, f in entry["top"]) or 1.0
                return {v: f / total for v, f in entry["top"]}
            a, b = shares(now), shares(then)
            value = max((abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b)), default=0.0)
            measure = "L-infinity distance"
        found.append({"feature": name, "measure": measure, "value": value,
                      "missing_change": now["missing"] - then["missing"]})
    return found


def read_anomalies(uri: str, split: str) -> list[dict[str, str]]:
    """ExampleValidator's findings in one split: feature, severity and description."""
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    from components import artifacts

    path = artifacts.join(artifacts.split_uri(uri, split), artifacts.SCHEMA_DIFF_FILE)
    if not artifacts.exists(path):
        return []
    anomalies = anomalies_pb2.Anomalies.FromString(artifacts.read_bytes(path))
    found = [{"feature": name, "severity": anomalies_pb2.AnomalyInfo.Severity.Name(info.severity),
              "description": info.description or info.short_description}
             for name, info in sorted(anomalies.anomaly_info.items())]
    if anomalies.HasField("dataset_anomaly_info"):
        info = anomalies.dataset_anomaly_info
        found.append({"feature": "(dataset)", "severity": anomalies_pb2.AnomalyInfo.Severity.Name(info.severity),
                      "description": info.description or info.short_description})
    return found


def read_data(statistics: list[metadata.Output], anomalies: list[metadata.Output],
              previous: list[metadata.Output] | None, previous_run: str) -> dict[str, Any]:
    """Rows per split, each feature's summary per split, anomalies per split, and drift of the train split against
    the previous run's statistics (none when this run reused them from the cache)."""
    if not statistics:
        return {}
    artifact = statistics[0].artifact
    splits = _split_names(artifact)
    datasets = {split: _statistics(artifact.uri, split) for split in splits}
    data: dict[str, Any] = {
        "rows": {split: int(d.num_examples) for split, d in datasets.items()},
        "features": {split: feature_summary(d) for split, d in datasets.items()},
        "anomalies": {split: read_anomalies(anomalies[0].artifact.uri, split)
                      for split in _split_names(anomalies[0].artifact)} if anomalies else {},
    }
    if previous:
        before = previous[0].artifact
        split = "train" if "train" in splits else splits[0]
        data["drift"] = {"previous_run": previous_run, "split": split, "same_statistics": before.id == artifact.id,
                         "features": [] if before.id == artifact.id or split not in _split_names(before) else
                         drift(data["features"][split], feature_summary(_statistics(before.uri, split)))}
    return data


def read_tuner(hyperparameters: list[metadata.Output], results: list[metadata.Output]) -> dict[str, Any]:
    """The Tuner's best values and its trials (score and values each), when it ran."""
    from components import artifacts

    found: dict[str, Any] = {}
    if hyperparameters:
        config = artifacts.read_json(artifacts.only_file(hyperparameters[0].artifact.uri))
        found["tuner_best"] = config.get("values", {})
    if results:
        found["tuner_trials"] = artifacts.read_json(artifacts.only_file(results[0].artifact.uri))
    return found


def _plot_value(plots: dict[str, Any], name: str) -> Any:
    for sub_keys in plots.values():
        for by_name in sub_keys.values():
            if name in by_name:
                return by_name[name]
    return None


def _weight(value: Any) -> float:
    """A plot's weighted count: a number, or {"value": number} (TFMA writes either, by version)."""
    if isinstance(value, dict):
        value = value.get("value", 0.0)
    return float(value or 0.0)


def read_plots(uri: str) -> dict[str, Any]:
    """The Evaluator's plots on all eval rows: a binary model's confusion matrices per threshold (ROC, precision-
    recall and the matrix at the decision threshold come from them) and calibration buckets; a multiclass model's
    confusion matrix."""
    import tensorflow_model_analysis as tfma

    result = tfma.load_eval_result(uri, model_name=_candidate_name(uri))
    found: dict[str, Any] = {}
    for slice_key, plots in result.plots or []:
        if slice_key or not plots:
            continue
        matrices = _plot_value(plots, "confusionMatrixAtThresholds")
        if matrices:
            found["thresholds"] = [
                {"threshold": float(m.get("threshold", 0.0)),
                 **{k: float(m.get(key, 0.0)) for k, key in (("tp", "truePositives"), ("fp", "falsePositives"),
                                                             ("tn", "trueNegatives"), ("fn", "falseNegatives"))}}
                for m in matrices.get("matrices", [])]
        buckets = _plot_value(plots, "calibrationHistogramBuckets")
        if buckets:
            found["calibration"] = [
                {"low": float(b.get("lowerThresholdInclusive", 0.0)),
                 "high": float(b.get("upperThresholdExclusive", 0.0)),
                 "count": _weight(b.get("numWeightedExamples")), "label": _weight(b.get("totalWeightedLabel")),
                 "prediction": _weight(b.get("totalWeightedRefinedPrediction"))}
                for b in buckets.get("buckets", []) if _weight(b.get("numWeightedExamples"))]
        multiclass = _plot_value(plots, "multiClassConfusionMatrixAtThresholds")
        if multiclass and multiclass.get("matrices"):
            found["multiclass_confusion"] = [
                [int(e.get("actualClassId", 0)), int(e.get("predictedClassId", 0)),
                 _weight(e.get("numWeightedExamples"))]
                for e in multiclass["matrices"][0].get("entries", [])]
    return found


def _model_names(uri: str) -> list[str]:
    from tensorflow_model_analysis.writers import eval_config_writer

    return list(eval_config_writer.load_eval_run(uri)[3])


def _candidate_name(uri: str) -> str | None:
    names = _model_names(uri)
    return "candidate" if "candidate" in names else None


def read_baseline(uri: str) -> dict[str, Any]:
    """The baseline model's overall figures and the Evaluator's verdict (with the thresholds a model failed)."""
    import tensorflow_model_analysis as tfma

    found: dict[str, Any] = {}
    if "baseline" in _model_names(uri):
        result = tfma.load_eval_result(uri, model_name="baseline")
        found["metrics"] = next((_flatten_metrics(m) for key, m in result.slicing_metrics if not key), {})
    try:
        validation = tfma.load_validation_result(uri)
    except Exception:  # noqa: BLE001  (an Evaluator without thresholds writes no validation result)
        return found
    found["validation_ok"] = bool(validation.validation_ok)
    found["failures"] = [failure.message or str(failure.metric_key.name)
                         for per_slice in validation.metric_validations_per_slice for failure in per_slice.failures]
    found["failed_thresholds"] = validation_failures(validation)
    return found


def validation_failures(validation: Any) -> list[dict[str, Any]]:
    """The thresholds a TFMA ValidationResult failed, as plain JSON: TFMA's metric key, whether it is the change
    from the baseline model (is_diff), the figure that failed (the change, for a comparison) and TFMA's message."""
    failed = []
    for per_slice in validation.metric_validations_per_slice:
        for failure in per_slice.failures:
            value = failure.metric_value
            failed.append({"metric": failure.metric_key.name, "is_diff": bool(failure.metric_key.is_diff),
                           "value": value.double_value.value if value.HasField("double_value") else None,
                           "message": failure.message})
    return failed


def serving_row(examples: Any, features: list[str], limit: int = 200) -> dict[str, Any]:
    """The first eval row with a value in every feature (else the first row), as a request carries it."""
    import tensorflow as tf

    from components import artifacts

    if "eval" not in _split_names(examples):
        return {}
    first = None
    for record in artifacts.read_records(artifacts.split_uri(examples.uri, "eval"), limit=limit):
        example = tf.train.Example.FromString(record)
        row: dict[str, Any] = {}
        for name in features:
            feature = example.features.feature.get(name)
            values = getattr(feature, feature.WhichOneof("kind")).value if feature and feature.WhichOneof("kind") \
                else []
            value = values[0] if values else None
            if isinstance(value, bytes):
                value = value.decode()
            elif isinstance(value, float):
                value = float(f"{value:.7g}")  # a float32 as written in the CSV, not 8.050000190734863
            row[name] = value
        first = first or row
        if all(v is not None and v != "" for v in row.values()):
            return row
    return first or {}


def _read_model_reports(summary: RunSummary, uri: str) -> None:
    from components import artifacts

    history = artifacts.join(uri, artifacts.TRAINING_HISTORY_JSON)
    if artifacts.exists(history):
        summary.training.update(artifacts.read_json(history))
    summary.calibration = artifacts.read_calibration_record(uri) or summary.calibration
    export = artifacts.read_export_report(artifacts.serving_model_dir(uri))
    if export is not None:
        summary.export = export
        summary.model_path = uri
    else:
        summary.optimization = artifacts.read_optimization_report(uri) or summary.optimization
    if summary.model_path is None:
        summary.model_path = uri


def write_report(summary: RunSummary, folder: str) -> tuple[str, str]:
    """summary.json and the run report summary.html in `folder`, and the index of runs in its parent folder."""
    from reports.run_page import run_page, write_index

    os.makedirs(folder, exist_ok=True)
    json_path = os.path.join(folder, RUN_SUMMARY_JSON)
    with open(json_path, "w") as f:
        f.write(summary.to_json())
    html_path = os.path.join(folder, RUN_REPORT_HTML)
    with open(html_path, "w") as f:
        f.write(run_page(summary.to_dict()))
    write_index(os.path.dirname(os.path.abspath(folder)))
    return json_path, html_path
