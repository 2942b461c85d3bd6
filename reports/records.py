"""The typed records of the reports one stage writes and another reads back: the Optimizer's optimization report,
the calibration record, and the Exporter's export report (which carries the other two).

Each record is a dataclass with `to_dict`, the JSON object the file holds, and `from_dict`, which reads one back
(reports written by earlier releases too: a key added since then has a default). The JSON keeps the layout the files
have always had, so summary.json, published versions and the run report read the same files as before.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class RecordError(ValueError):
    """A report file does not hold the record it should: the message names the key missing or of the wrong type."""


def _get(data: Mapping[str, Any], key: str, convert: Callable[[Any], T], what: str) -> T:
    if key not in data:
        raise RecordError(f"the {what} has no '{key}'")
    try:
        return convert(data[key])
    except (TypeError, ValueError) as e:
        raise RecordError(f"the {what}'s '{key}' is {data[key]!r}: {e}") from None


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("expected true or false")
    return value


def _reading(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A record's from_dict that raises RecordError, and only RecordError, for a value of the wrong shape."""
    def decorate(read: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(read)
        def checked(cls: type, data: Any) -> T:
            try:
                return read(cls, _mapping(data))
            except RecordError:
                raise
            except (TypeError, ValueError) as e:
                raise RecordError(f"the {what} holds a value of the wrong kind: {e}") from None
        return checked
    return decorate


def _floats(value: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in _mapping(value).items()}


def _sorted(value: Any) -> Any:
    """`value` with every object's keys in order, as artifacts.write_json writes them: a record read back and written
    again is the same file."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _numbers(value: Any) -> dict[str, float | int]:
    """Figures by name; counts stay whole numbers."""
    return {str(k): v if isinstance(v, int) and not isinstance(v, bool) else float(v)
            for k, v in _mapping(value).items()}


def _optional(value: Any, convert: Callable[[Any], T]) -> T | None:
    """None for an absent, null or empty section (reports write `{}` for a stage that did not run)."""
    return convert(value) if value not in (None, {}, []) else None


# ---- the export report ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArtifactCheck:
    """The gate on one exported format: its `figure` (max_abs_diff, or <metric>_degradation for a quantized
    variant) against `threshold`, the config key that sets it, and the verdict."""

    figure: str
    value: float
    threshold: float
    config_key: str
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"figure": self.figure, "value": self.value, "threshold": self.threshold,
                "config_key": self.config_key, "passed": self.passed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArtifactCheck:
        what = "export check"
        return cls(_get(data, "figure", str, what), _get(data, "value", float, what),
                   _get(data, "threshold", float, what), _get(data, "config_key", str, what),
                   _get(data, "passed", _bool, what))


# The keys of an artifact row that are not the task's metrics (those sit beside them in the same object).
_ROW_KEYS = ("artifact", "path", "size_bytes", "max_abs_diff", "latency_ms_p50", "check")


@dataclass(frozen=True)
class ArtifactRow:
    """One exported format's row: where it is (relative to the version folder), its size, its largest output
    difference from the SavedModel, the task's metrics on the eval rows, its median single-row latency and its
    check."""

    artifact: str
    path: str
    size_bytes: int
    max_abs_diff: float
    metrics: dict[str, float]
    latency_ms_p50: float
    check: ArtifactCheck

    def to_dict(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "path": self.path, "size_bytes": self.size_bytes,
                "max_abs_diff": self.max_abs_diff, **self.metrics, "latency_ms_p50": self.latency_ms_p50,
                "check": self.check.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArtifactRow:
        what = "export report's artifact row"
        return cls(
            artifact=_get(data, "artifact", str, what), path=str(data.get("path", "")),
            size_bytes=_get(data, "size_bytes", int, what), max_abs_diff=_get(data, "max_abs_diff", float, what),
            metrics=_floats({k: v for k, v in data.items() if k not in _ROW_KEYS}),
            latency_ms_p50=_get(data, "latency_ms_p50", float, what),
            check=_get(data, "check", lambda v: ArtifactCheck.from_dict(_mapping(v)), what),
        )


@dataclass(frozen=True)
class ExportTask:
    """What the exported model predicts (components/tasks.py Task): its kind, the output tensor's name, a
    multiclass model's classes in the order of its probabilities, and the metric quantized variants were judged by."""

    kind: str = "binary"
    output: str = ""
    classes: tuple[str, ...] = ()
    metric: str = ""

    def to_dict(self) -> dict[str, Any]:
        described: dict[str, Any] = {"kind": self.kind, "output": self.output}
        if self.kind == "multiclass":
            described["classes"] = list(self.classes)
        if self.metric:
            described["metric"] = self.metric
        return described

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExportTask:
        return cls(kind=_get(data, "kind", str, "export report's task"), output=str(data.get("output", "")),
                   classes=tuple(str(c) for c in data.get("classes") or ()), metric=str(data.get("metric", "")))


@dataclass(frozen=True)
class RequestEncoding:
    """How the training CSV encodes a row, for `mlops predict --csv`: its missing-value markers and the label
    columns a request leaves out."""

    missing_values: tuple[str, ...] = ()
    label_columns: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"missing_values": list(self.missing_values), "label_columns": list(self.label_columns)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestEncoding:
        return cls(tuple(str(v) for v in data.get("missing_values") or ()),
                   tuple(str(v) for v in data.get("label_columns") or ()))


# The format every other one is compared with: `reference` holds its figures.
REFERENCE_ARTIFACT = "saved_model"


@dataclass(frozen=True)
class ExportReport:
    """export_report.json: every format's row, the SavedModel's own figures (`reference`), what ignoring the features
    scores on the same rows (`no_skill`), the verdict, and what the model carries from the stages before it (the
    optimization report, the calibration record, the request encoding).

    class_shares (multiclass) and predicted_actual (regression: SavedModel prediction and label of up to 300 eval
    rows) are written for those kinds only. A report from before task kinds has no task: read it as binary."""

    passed: bool
    artifacts: tuple[ArtifactRow, ...] = ()
    task: ExportTask | None = None
    eval_rows: int = 0
    reference: dict[str, float] = field(default_factory=dict)
    no_skill: dict[str, float] = field(default_factory=dict)
    class_shares: tuple[float, ...] | None = None
    predicted_actual: tuple[tuple[float, float], ...] | None = None
    optimization: OptimizationReport | None = None
    calibration: CalibrationRecord | None = None
    request: RequestEncoding | None = None
    seconds: float | None = None
    # Variants not built because they cannot hold the model's values: artifact name -> why.
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.task.kind if self.task else "binary"

    @property
    def failed(self) -> tuple[ArtifactRow, ...]:
        return tuple(row for row in self.artifacts if not row.check.passed)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.task is not None:
            data["task"] = self.task.to_dict()
        data.update(eval_rows=self.eval_rows, reference={"artifact": REFERENCE_ARTIFACT, **self.reference},
                    no_skill=dict(self.no_skill), artifacts=[row.to_dict() for row in self.artifacts],
                    passed=self.passed)
        if self.class_shares is not None:
            data["class_shares"] = list(self.class_shares)
        if self.predicted_actual is not None:
            data["predicted_actual"] = [list(pair) for pair in self.predicted_actual]
        data.update(optimization=self.optimization.to_dict() if self.optimization else {},
                    calibration=self.calibration.to_dict() if self.calibration else {},
                    request=self.request.to_dict() if self.request else {})
        if self.seconds is not None:
            data["seconds"] = self.seconds
        if self.skipped:
            data["skipped"] = dict(self.skipped)
        return data

    @classmethod
    @_reading("export report")
    def from_dict(cls, data: Mapping[str, Any]) -> ExportReport:
        what = "export report"
        reference = {k: v for k, v in _mapping(data.get("reference") or {}).items() if k != "artifact"}
        pairs = data.get("predicted_actual")
        return cls(
            passed=_get(data, "passed", _bool, what),
            artifacts=tuple(ArtifactRow.from_dict(_mapping(row)) for row in data.get("artifacts") or ()),
            task=_optional(data.get("task"), lambda v: ExportTask.from_dict(_mapping(v))),
            eval_rows=int(data.get("eval_rows", 0)),
            reference=_floats(reference),
            no_skill=_floats(data.get("no_skill") or {}),
            class_shares=None if data.get("class_shares") is None else
            tuple(float(s) for s in data["class_shares"]),
            predicted_actual=None if pairs is None else tuple((float(p), float(a)) for p, a in pairs),
            optimization=_optional(data.get("optimization"), lambda v: OptimizationReport.from_dict(_mapping(v))),
            calibration=_optional(data.get("calibration"), lambda v: CalibrationRecord.from_dict(_mapping(v))),
            request=_optional(data.get("request"), lambda v: RequestEncoding.from_dict(_mapping(v))),
            seconds=None if data.get("seconds") is None else float(data["seconds"]),
            skipped={str(k): str(v) for k, v in _mapping(data.get("skipped") or {}).items()},
        )


# ---- the optimization report ------------------------------------------------------------------------------------

# The keys of a model's figures that are not the task's metrics.
_FIGURE_KEYS = ("rows", "parameters", "nonzero_parameters", "gzip_bytes", "dense_units", "kernel_sparsity",
                "pruned_from", "degradation")


@dataclass(frozen=True)
class ModelFigures:
    """One model the Optimizer measured (the input, the distilled student, the pruned model): the task's metrics on
    `rows` eval rows, its size (parameters, nonzero ones, gzipped weight bytes), its Dense layers' widths and the
    fraction of zeros in each Dense kernel; for the pruned model, the stage it was pruned from and how much worse the
    gated metric got (negative: better)."""

    metrics: dict[str, float]
    rows: int
    parameters: int
    nonzero_parameters: int
    gzip_bytes: int
    dense_units: tuple[int, ...] = ()
    kernel_sparsity: dict[str, float] = field(default_factory=dict)
    pruned_from: str | None = None
    degradation: float | None = None

    def figure(self, name: str) -> float | int:
        """A metric or a size by name (the summary's before and after columns name both)."""
        return self.metrics[name] if name in self.metrics else getattr(self, name)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {**self.metrics, "rows": self.rows, "parameters": self.parameters,
                                "nonzero_parameters": self.nonzero_parameters, "gzip_bytes": self.gzip_bytes,
                                "dense_units": list(self.dense_units), "kernel_sparsity": dict(self.kernel_sparsity)}
        if self.pruned_from is not None:
            data["pruned_from"] = self.pruned_from
        if self.degradation is not None:
            data["degradation"] = self.degradation
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelFigures:
        what = "optimization report's model figures"
        return cls(
            metrics=_floats({k: v for k, v in data.items() if k not in _FIGURE_KEYS}),
            rows=int(data.get("rows", 0)),
            parameters=_get(data, "parameters", int, what),
            nonzero_parameters=_get(data, "nonzero_parameters", int, what),
            gzip_bytes=_get(data, "gzip_bytes", int, what),
            dense_units=tuple(int(u) for u in data.get("dense_units") or ()),
            kernel_sparsity=_floats(data.get("kernel_sparsity") or {}),
            pruned_from=None if data.get("pruned_from") is None else str(data["pruned_from"]),
            degradation=None if data.get("degradation") is None else float(data["degradation"]),
        )


@dataclass(frozen=True)
class OptimizationSummary:
    """The model the Optimizer handed on (`output_stage`: input, distilled or pruned) and, when it measured any, the
    task's metrics and sizes of its input (`before`) and of that model (`after`)."""

    output_stage: str
    before: dict[str, float | int] = field(default_factory=dict)
    after: dict[str, float | int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"output_stage": self.output_stage, **{f"{k}_before": v for k, v in self.before.items()},
                **{f"{k}_after": v for k, v in self.after.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OptimizationSummary:
        def side(suffix: str) -> dict[str, float | int]:
            return _numbers({k[: -len(suffix)]: v for k, v in data.items() if k.endswith(suffix)})

        return cls(_get(data, "output_stage", str, "optimization summary"), side("_before"), side("_after"))


# The Optimizer's stages in the order they run, and the model each leaves.
STAGE_MODELS = {"distill": "distilled", "prune": "pruned"}


@dataclass(frozen=True)
class OptimizationReport:
    """optimization_report.json: the stages that ran (distill, prune), the task kind and the metric the pruning gate
    watched, the optimize section as configured, the figures of each model measured, and the summary. With nothing
    enabled, `note` says so and no model was measured."""

    kind: str
    metric: str
    stages: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    input: ModelFigures | None = None
    distilled: ModelFigures | None = None
    pruned: ModelFigures | None = None
    summary: OptimizationSummary | None = None
    note: str | None = None

    def model(self, stage: str) -> ModelFigures:
        """The figures of the model a stage name denotes (input, distilled or pruned)."""
        found = {"input": self.input, "distilled": self.distilled, "pruned": self.pruned}.get(stage)
        if found is None:
            raise RecordError(f"the optimization report has no figures for the '{stage}' model.")
        return found

    @property
    def measured(self) -> list[tuple[str, ModelFigures]]:
        """(stage name, figures) of every model measured, in the order they were made."""
        return [(name, figures) for name, figures in
                (("input", self.input), ("distilled", self.distilled), ("pruned", self.pruned)) if figures]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"stages": list(self.stages), "kind": self.kind, "metric": self.metric,
                                "settings": self.settings}
        data.update((name, figures.to_dict()) for name, figures in self.measured)
        if self.summary is not None:
            data["summary"] = self.summary.to_dict()
        if self.note is not None:
            data["note"] = self.note
        return _sorted(data)

    @classmethod
    @_reading("optimization report")
    def from_dict(cls, data: Mapping[str, Any]) -> OptimizationReport:
        def figures(name: str) -> ModelFigures | None:
            return _optional(data.get(name), lambda v: ModelFigures.from_dict(_mapping(v)))

        return cls(
            kind=str(data.get("kind", "binary")), metric=str(data.get("metric", "auc")),
            stages=tuple(str(s) for s in data.get("stages") or ()), settings=dict(data.get("settings") or {}),
            input=figures("input"), distilled=figures("distilled"), pruned=figures("pruned"),
            summary=_optional(data.get("summary"), lambda v: OptimizationSummary.from_dict(_mapping(v))),
            note=None if data.get("note") is None else str(data["note"]),
        )


# ---- the calibration record -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CalibrationFigures:
    """A model's probabilities measured on rows: calibration (mean probability over the positive rate, or mean
    confidence over accuracy; 1 when they mean what they say), the expected calibration error, AUC (macro for a
    multiclass model), and precision and recall (at a binary model's threshold; macro of the argmax otherwise)."""

    calibration: float
    ece: float
    auc: float
    precision: float
    recall: float

    def to_dict(self) -> dict[str, float]:
        return {"calibration": self.calibration, "ece": self.ece, "auc": self.auc, "precision": self.precision,
                "recall": self.recall}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CalibrationFigures:
        # A record written before the expected calibration error has none: not a number, shown as n/a.
        return cls(**{name: float(data.get(name, math.nan)) for name in ("calibration", "ece", "auc", "precision",
                                                                         "recall")})


@dataclass(frozen=True)
class Confusion:
    """Rows counted at a binary model's decision threshold: true and false positives, false and true negatives."""

    tp: int
    fp: int
    fn: int
    tn: int

    def to_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "fp": self.fp, "fn": self.fn, "tn": self.tn}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Confusion:
        return cls(*(_get(data, key, int, "confusion at the threshold") for key in ("tp", "fp", "fn", "tn")))


# A reliability diagram's points: per bin of rows, the mean probability (or confidence), the observed frequency and
# the number of rows.
ReliabilityBins = tuple[tuple[float, float, int], ...]


def _bins(value: Any) -> ReliabilityBins:
    return tuple((float(x), float(y), int(n)) for x, y, n in value or ())


@dataclass(frozen=True)
class CalibrationRecord:
    """calibration.json: the fit (platt: scale and shift of the logit; temperature: T), the rows it was fitted on,
    the decision threshold chosen there (None for a multiclass model: the argmax decides), and the model before
    (uncalibrated, at 0.5) and after (calibrated, at the threshold) on the rows it was measured on.

    When the fit moved the measured calibration further from 1, it is not applied (`applied` False): `rejected` holds
    the two calibration figures that decided it and `note` the sentence, and before and after are the same model."""

    method: str
    fitted_on: str
    rows: int
    measured_on: str
    measured_rows: int
    objective: str
    threshold: float | None
    before: CalibrationFigures
    after: CalibrationFigures
    reliability_before: ReliabilityBins = ()
    reliability_after: ReliabilityBins = ()
    temperature: float | None = None
    scale: float | None = None
    shift: float | None = None
    positive_rate_fitted: float | None = None
    positive_rate_measured: float | None = None
    confusion_at_threshold: Confusion | None = None
    min_precision: float | None = None
    applied: bool = True
    rejected_before: float | None = None
    rejected_after: float | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"method": self.method, "fitted_on": self.fitted_on, "rows": self.rows,
                                "measured_on": self.measured_on, "measured_rows": self.measured_rows,
                                "objective": self.objective, "threshold": self.threshold}
        if self.temperature is not None:
            data["temperature"] = self.temperature
        if self.scale is not None:
            data.update(scale=self.scale, shift=self.shift)
        if self.positive_rate_fitted is not None:
            data["positive_rate"] = {"fitted": self.positive_rate_fitted, "measured": self.positive_rate_measured}
        data.update(before=self.before.to_dict(), after=self.after.to_dict(),
                    reliability={"before": [list(b) for b in self.reliability_before],
                                 "after": [list(b) for b in self.reliability_after]})
        if self.confusion_at_threshold is not None:
            data["confusion_at_threshold"] = self.confusion_at_threshold.to_dict()
        if self.min_precision is not None:
            data["min_precision"] = self.min_precision
        data["applied"] = self.applied
        if self.rejected_before is not None:
            data["rejected"] = {"before": self.rejected_before, "after": self.rejected_after}
        if self.note is not None:
            data["note"] = self.note
        return _sorted(data)

    @classmethod
    @_reading("calibration record")
    def from_dict(cls, data: Mapping[str, Any]) -> CalibrationRecord:
        what = "calibration record"

        def number(key: str, within: Mapping[str, Any] = data) -> float | None:
            return None if within.get(key) is None else float(within[key])

        def figures(key: str) -> CalibrationFigures:
            return _get(data, key, lambda v: CalibrationFigures.from_dict(_mapping(v)), what)

        rates = _mapping(data.get("positive_rate") or {})
        rejected = _mapping(data.get("rejected") or {})
        reliability = _mapping(data.get("reliability") or {})
        return cls(
            method=_get(data, "method", str, what), fitted_on=str(data.get("fitted_on", "")),
            rows=int(data.get("rows", 0)), measured_on=str(data.get("measured_on", "")),
            measured_rows=int(data.get("measured_rows", 0)), objective=str(data.get("objective", "")),
            threshold=number("threshold"), before=figures("before"), after=figures("after"),
            reliability_before=_bins(reliability.get("before")), reliability_after=_bins(reliability.get("after")),
            temperature=number("temperature"), scale=number("scale"), shift=number("shift"),
            positive_rate_fitted=number("fitted", rates), positive_rate_measured=number("measured", rates),
            confusion_at_threshold=_optional(data.get("confusion_at_threshold"),
                                             lambda v: Confusion.from_dict(_mapping(v))),
            min_precision=number("min_precision"), applied=bool(data.get("applied", True)),
            rejected_before=number("before", rejected), rejected_after=number("after", rejected),
            note=None if data.get("note") is None else str(data["note"]),
        )
