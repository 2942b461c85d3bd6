"""Runs the pipeline locally with TFX's LocalDagRunner (Beam DirectRunner, MLMD on SQLite)."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from pipeline import STARTED
from pipeline.beam import job_failure
from pipeline.data import check_csv_folder, resolve_data_dir
from pipeline.local.progress import StageProgress
from pipeline.local.stage_workers import LIBRARY_LOGGERS, LOG_FORMAT, StageWorkers
from pipeline.preflight import check_config
from pipeline.summary import RunSummary, latest_run, write_report
from settings.config import PipelineConfig
from settings.errors import UserError


class PipelineError(UserError, RuntimeError):
    """A stage failed for a reason other than the data gate; the message names the stage and the log."""

    exit_code = 1


def _runner_job_failure(error: BaseException | None) -> str | None:
    """The one line pipeline/beam.py's job_failure finds in `error` or in what caused it, if a runner's job failed."""
    seen = set()
    while error is not None and id(error) not in seen:
        line = job_failure(error)
        if line:
            return line
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _find_cause(error: BaseException, kind: type) -> BaseException | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def stderr_to_file(log_path: str) -> Iterator[None]:
    """Points file descriptor 2 at the log: TensorFlow's C++ log, tracebacks that Beam's worker processes print and
    Python's warnings all write there, from this process and the processes it starts."""
    for stream in (sys.stdout, sys.stderr, sys.__stderr__):
        if stream is not None:
            stream.flush()
    console = os.dup(2)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    try:
        yield
    finally:
        for stream in (sys.stderr, sys.__stderr__):
            if stream is not None:
                stream.flush()
        os.dup2(console, 2)
        os.close(console)


@contextlib.contextmanager
def _logs_to_file(log_path: str) -> Iterator[None]:
    """Everything TFX, Beam and TF log or print on stderr goes to the run's log file; the console shows only the
    stages (the caller prints errors after this returns)."""
    file_handler = logging.FileHandler(log_path)
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    quiet = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    saved = (root.level, list(root.handlers), [(lg, lg.propagate, list(lg.handlers)) for lg in quiet])
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(file_handler)
    root.setLevel(logging.INFO)
    for lg in quiet:
        lg.propagate = True
        for handler in list(lg.handlers):
            lg.removeHandler(handler)
    try:
        # Keras prints its epochs on sys.stdout: those lines go to the log too, while the stage lines keep the
        # console stream their caller took before.
        with stderr_to_file(log_path), open(log_path, "a", buffering=1) as printed, \
                contextlib.redirect_stdout(printed):
            yield
    except Exception:
        # The console gets one sentence from the caller; the log keeps the whole traceback.
        logging.getLogger(__name__).exception("stopped by an error")
        raise
    finally:
        root.removeHandler(file_handler)
        file_handler.close()
        root.setLevel(saved[0])
        for handler in saved[1]:
            root.addHandler(handler)
        for lg, propagate, handlers in saved[2]:
            lg.propagate = propagate
            for handler in handlers:
                lg.addHandler(handler)


def run_local(config: PipelineConfig, out: TextIO | None = None, data_only: bool = False) -> RunSummary:
    """Checks the data, runs every stage (only ExampleGen to Transform when `data_only`) with progress on `out`,
    and returns what the run produced.

    Raises DataError (bad folder or CSV, a config that does not fit the schema or the CSV files),
    DataValidationError (schema anomalies) or PipelineError.
    """
    out = out or sys.stdout  # looked up per call: a default bound at import misses a redirected stdout
    # Where the run stands, for the report of a run that fails: the stage and the log once they exist.
    state: dict[str, object] = {"stage": "checking the data and the config", "log_path": "", "tfx": False}
    try:
        return _run_local(config, out, data_only, state)
    except Exception as error:
        failure_report(config, error, state, out)
        raise


def failure_report(config: PipelineConfig, error: Exception, state: dict[str, object], out: TextIO) -> str:
    """Writes the run report of a failed run (what failed, where, and what to do: the error's own sentence), with
    what the stages that ran recorded; returns its path (empty when even the report cannot be written)."""
    summary = None
    if state["tfx"]:
        try:
            with _logs_to_file(str(state["log_path"])):
                summary = latest_run(os.path.abspath(config.metadata_path), config.name)
        except Exception:  # noqa: BLE001 - the run's own error is the one to report; this only adds to it
            summary = None
    if summary is None:
        summary = RunSummary(run_id=time.strftime("%Y-%m-%dT%H:%M:%S") + "-failed")
    summary.task.setdefault("kind", config.label.kind)
    summary.failed_stage = str(state["stage"])
    summary.failure = str(error)
    if isinstance(error, UserError):
        summary.failure = f"{getattr(error, 'prefix', 'error')}: {error}"
    summary.log_path = str(state["log_path"])
    summary.stage_seconds = dict(state.get("stage_seconds") or {})
    summary.elapsed_seconds = float(state.get("elapsed_seconds") or 0.0)
    summary.total_seconds = round(time.monotonic() - STARTED, 2)
    try:
        _, html_path = write_report(summary, run_report_dir(config, summary.run_id))
    except OSError:
        return ""
    print(f"report of the failed run: {html_path}", file=out, flush=True)
    return html_path


def _run_local(config: PipelineConfig, out: TextIO, data_only: bool, state: dict[str, object]) -> RunSummary:
    from components.gates.anomalies import DataValidationError

    files = None
    # components.artifacts.is_uri's test, without importing TensorFlow before fd 2 is the log.
    if "://" in config.data.path:
        # ExampleGen reads it through Beam; a bad file fails that stage with its name.
        source = f"CSV files from {config.data.path}"
    else:
        data_dir = resolve_data_dir(config.data.path, config.output_root)
        files = check_csv_folder(data_dir)
        source = f"{len(files)} CSV file(s) from {data_dir}"
    check_config(config, files)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = os.path.join(config.output_root, "logs")
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.abspath(os.path.join(log_dir, f"{config.name}-{stamp}.log"))
    state.update(log_path=log_path, stage="building the pipeline")
    print(f"pipeline '{config.name}': {source}", file=out)
    print(f"outputs under {os.path.abspath(config.output_root)}; full log {log_path}", file=out, flush=True)

    progress = None
    try:
        # The stage workers start first: they import TensorFlow while this process does
        # (pipeline/local/stage_workers.py).
        with _logs_to_file(log_path), StageWorkers(config.parallel_stages - 1) as workers:
            # Importing TensorFlow prints C++ log lines: here they land in the log.
            from components.compat import cache_dofn_specs
            from pipeline.local.dag_runner import ConcurrentDagRunner
            from pipeline.pipeline import GATE_NODE, create_pipeline

            cache_dofn_specs()

            tfx_pipeline = create_pipeline(config, data_only=data_only)
            stages = [node.id for node in tfx_pipeline.components]
            progress = StageProgress(stages, out, os.path.abspath(config.metadata_path), config.name)
            state["tfx"] = True
            with progress.track():
                ConcurrentDagRunner(workers, gates=frozenset({GATE_NODE})).run(tfx_pipeline)
    except Exception as error:
        if progress is None:
            raise PipelineError(f"the pipeline could not be built: {error}; see the full log at {log_path}") from error
        progress.failed()
        state["stage"] = progress.current or "the pipeline"
        # The failed run's report shows how long each finished stage took, as a finished run's does.
        state["stage_seconds"] = {node: round(took, 2) for node, (took, _) in progress.finished.items()}
        state["elapsed_seconds"] = round(progress.elapsed(), 2)
        gate = _find_cause(error, DataValidationError)
        if gate is not None:
            raise gate from None
        stage = progress.current or "the pipeline"
        verdict = ""
        if "Evaluator" in progress.finished and stage != "Evaluator":
            with _logs_to_file(log_path):
                verdict = evaluator_verdict(config)
        # A portable runner's failure is its whole Java stack trace: its one telling line here, all of it in the log.
        message = stage_failure(stage, _runner_job_failure(error) or str(error), verdict, log_path)
        raise PipelineError(message) from error

    state["stage"] = "reading the run back"
    # Reading the run back (TFMA, TFDV, tf.data) logs and warns too: into the same file.
    with _logs_to_file(log_path):
        summary = latest_run(os.path.abspath(config.metadata_path), config.name, config.features, config.model_name)
        summary.task.setdefault("kind", config.label.kind)
        if summary.blessed is False:
            summary.blessing_failure = blessing_failure(summary, config)
        summary.cached_stages = [node for node, (_, cached) in progress.finished.items() if cached]
        summary.stage_seconds = {node: round(took, 2) for node, (took, _) in progress.finished.items()}
        summary.elapsed_seconds = round(progress.elapsed(), 2)
        summary.log_path = log_path
        report_dir = run_report_dir(config, summary.run_id)
        summary.total_seconds = round(time.monotonic() - STARTED, 2)
        if "Publisher" in summary.cached_stages:
            summary.published_new = False
        if summary.published_version is not None:
            summary.published_labels = _labels_on(config, summary.published_version)
            summary.published_serving = _serving(config, summary.published_version)
        json_path, html_path = write_report(summary, report_dir)
    if data_only:
        print(f"\ndata stages done in {summary.elapsed_seconds:.1f}s; report {html_path}", file=out, flush=True)
    else:
        _print_summary(summary, json_path, html_path, out)
    return summary


def stage_failure(stage: str, reason: str, verdict: str, log_path: str) -> str:
    """The sentence of a stage that failed: its reason (the period that ended it dropped, as the sentence goes on),
    the Evaluator's verdict when it did not bless the model, and the log."""
    return f"{stage} failed: {reason.rstrip().removesuffix('.')}{verdict}; see the full log at {log_path}"


def run_report_dir(config: PipelineConfig, run_id: str) -> str:
    """The folder of a run's summary.json and summary.html (the run report)."""
    return os.path.join(config.output_root, "runs", run_id)


def evaluator_verdict(config: PipelineConfig) -> str:
    """A clause for the error of a stage that failed beside a finished Evaluator that did not bless the model: a
    tolerance to raise (the Exporter's) is no way forward for a model that would not be published anyway."""
    try:
        summary = latest_run(os.path.abspath(config.metadata_path), config.name)
        if summary.blessed is not False:
            return ""
        return f" (and the Evaluator did not bless this model: {blessing_failure(summary, config)})"
    except Exception:  # noqa: BLE001 - the stage's own error is the one to report; this only adds to it
        return ""


def blessing_failure(summary: RunSummary, config: PipelineConfig) -> str:
    """Why the Evaluator did not bless this run's model, naming the config keys of each failed comparison."""
    from pipeline.pipeline import not_blessed_message

    label = ((summary.data.get("features") or {}).get("train") or {}).get(config.label.name) or {}
    label_std = label.get("std") if config.label.kind == "regression" else None
    return not_blessed_message(summary.baseline.get("failed_thresholds") or [], config, summary.metrics,
                               summary.baseline.get("metrics") or {}, label_std)


def baseline_line(summary: RunSummary) -> str:
    """The comparison with the baseline model that took part in the blessing, for the console: the task metric of
    both and the change; empty when the Evaluator did not run."""
    if not summary.metrics or summary.blessed is None:
        return ""
    base = summary.baseline.get("metrics") or {}
    metric = summary.task.get("metric") or next((n for n in ("auc", "macro_auc", "rmse") if n in summary.metrics), "")
    if not base or metric not in base or metric not in summary.metrics:
        return "none to compare with (the first blessed model, or evaluation.baseline none): the bounds alone decided"
    cached = " (the cached Evaluator's comparison, from the run that evaluated this model)" \
        if "Evaluator" in summary.cached_stages else ""
    return (f"{metric} {base[metric]:.4f}, this model {summary.metrics[metric]:.4f}, change "
            f"{summary.metrics[metric] - base[metric]:+.4f}{cached}")


def _serving(config: PipelineConfig, version: int) -> bool:
    """Whether the model repository's config serves `version` (False when it cannot be read)."""
    from serving.repository.base import RepositoryError
    from serving.repository.factory import open_repository

    try:
        return version in open_repository(config.serving_base_dir).served_versions(config.model_name)
    except (RepositoryError, OSError):
        return False


def _labels_on(config: PipelineConfig, version: int) -> list[str]:
    """The labels the model repository's config points at `version` (empty when it cannot be read)."""
    from serving.repository.base import RepositoryError
    from serving.repository.factory import open_repository

    try:
        labels = open_repository(config.serving_base_dir).labels(config.model_name)
    except (RepositoryError, OSError):
        return []
    return sorted(label for label, labelled in labels.items() if labelled == version)


# The Evaluator's figures the summary prints, for every task kind (each only where the run has it).
SUMMARY_METRICS = ("auc", "binary_accuracy", "precision", "recall", "calibration", "macro_auc", "accuracy",
                   "log_loss", "rmse", "mae", "r2", "example_count")


def _per_class_lines(metrics: dict[str, float], classes: list[str]) -> list[str]:
    """'precision  setosa 1.0000, versicolor 0.9000' from the figures TFMA keeps per class id."""
    lines = []
    for name in ("precision", "recall"):
        values = {int(key.rsplit(":", 1)[1]): value for key, value in metrics.items()
                  if key.startswith(f"{name}/classId:")}
        if values:
            named = ", ".join(f"{classes[i] if i < len(classes) else i} {v:.4f}" for i, v in sorted(values.items()))
            lines.append(f"  eval {name:<18} {named}")
    return lines


def _print_summary(summary: RunSummary, json_path: str, html_path: str, out: TextIO) -> None:
    m = summary.metrics
    print("\nsummary", file=out)
    total = max(summary.total_seconds, summary.elapsed_seconds)
    print(f"  run           {summary.run_id} in {total:.1f}s ({summary.elapsed_seconds:.1f}s in the stages, the rest "
          "starting up and reading the run back)", file=out)
    # A resolver node only looks up artifacts: it is never cached, and doing so again changes nothing.
    worked = {node for node in summary.stage_seconds if not node.endswith("Resolver")}
    if worked and set(summary.cached_stages) >= worked:
        print("  nothing changed: every stage came from the cache of an earlier run (same data, config and code)",
              file=out)
    left_out = (summary.data or {}).get("missing_label_rows")
    if left_out:
        print(f"  left out      {left_out} row(s) without a label (before the split)", file=out)
    for name in SUMMARY_METRICS:
        if name in m:
            print(f"  eval {name:<18} {m[name]:.4f}", file=out)
    export = summary.export
    classes = list(export.task.classes) if export is not None and export.task is not None else []
    for line in _per_class_lines(m, classes):
        print(line, file=out)
    shares = export.class_shares if export is not None and export.class_shares else ()
    for class_id, share in enumerate(shares):
        precision = m.get(f"precision/classId:{class_id}")
        if precision is not None and precision < share and class_id < len(classes):
            print(f"  warning       class {classes[class_id]!r}: eval precision {precision:.4f} is below its share of "
                  f"the eval rows {share:.4f}, so its answers are worse than guessing it (class weights favour rare "
                  "classes; see training.class_weights)", file=out)
    if export is not None and export.no_skill:
        what = "always the eval mean" if export.kind == "regression" else "the class shares, never the features"
        shown = ", ".join(f"{name} {value:.4f}" for name, value in export.no_skill.items())
        print(f"  no skill      {shown} ({what}; on the {export.eval_rows} exported eval rows)", file=out)
    optimization = summary.optimization
    pruned = optimization.pruned if optimization is not None else None
    if pruned is not None:
        metric = optimization.metric
        before = optimization.model(pruned.pruned_from or "input")
        sparsity = ", ".join(f"{k} {v:.3f}" for k, v in pruned.kernel_sparsity.items())
        print(f"  pruned        {metric} {before.metrics[metric]:.4f} -> {pruned.metrics[metric]:.4f}, gzip "
              f"{before.gzip_bytes} -> {pruned.gzip_bytes} bytes, sparsity {sparsity}", file=out)
    if optimization is not None and optimization.distilled is not None:
        metric, student, teacher = optimization.metric, optimization.distilled, optimization.model("input")
        print(f"  distilled     {metric} {teacher.metrics[metric]:.4f} -> {student.metrics[metric]:.4f}, parameters "
              f"{teacher.parameters} -> {student.parameters}", file=out)
    calibration = summary.calibration
    if calibration is not None:
        threshold = calibration.threshold
        if not calibration.applied:
            shown = "" if threshold is None else (
                f"; threshold {threshold:.4f} ({calibration.objective}) on the model's own probabilities")
            print(f"  calibrated    not applied: {calibration.note}{shown}", file=out)
        else:
            before, after = calibration.before, calibration.after
            shown = "" if threshold is None else f", threshold {threshold:.4f} ({calibration.objective})"
            print(f"  calibrated    {calibration.method} on {calibration.rows} held-out rows{shown}; eval "
                  f"calibration {before.calibration:.4f} -> {after.calibration:.4f}, precision "
                  f"{before.precision:.4f} -> {after.precision:.4f}, recall {before.recall:.4f} -> "
                  f"{after.recall:.4f}", file=out)
    if summary.blessed is None:
        # TFX judges nothing without a threshold; a first run has no baseline to compare with.
        print("  blessed       not judged: no evaluation bound is set and no blessed baseline exists yet; set "
              "evaluation.lower_bound (upper_bound for an error such as rmse)", file=out)
    elif summary.blessed is False and summary.blessing_failure:
        print(f"  blessed       False: {summary.blessing_failure}", file=out)
    else:
        print(f"  blessed       {summary.blessed}", file=out)
    line = baseline_line(summary)
    if line:
        print(f"  baseline      {line}", file=out)
    if export is not None:
        from reports.model_reports import table_lines

        print(f"  exported      {export.eval_rows} eval rows through every format:", file=out)
        for line in table_lines(export):
            print(f"    {line}", file=out)
    from reports.run_page import publication_state

    state = publication_state(summary.published_new, summary.published_labels, summary.published_serving)
    if summary.published_version is not None and state == "nothing_new":
        print(f"  published     nothing new: version {summary.published_version} at {summary.pushed_path} already "
              "holds this model (an earlier run published it)", file=out)
    elif summary.published_version is not None:
        print(f"  published     version {summary.published_version} at {summary.pushed_path}", file=out)
        if state in ("stable", "served"):
            why = "it is labelled stable" if state == "stable" else "it is the version served"
            print(f"                (`mlops versions` lists it; {why}: it serves without a rollout)", file=out)
        else:
            print(f"                (`mlops versions` lists it; `mlops rollout start --version "
                  f"{summary.published_version}` moves traffic to it)", file=out)
    else:
        print("  published     nothing (not blessed)", file=out)
    print(f"  report        {html_path}", file=out, flush=True)


def first_eval_row(config: PipelineConfig) -> dict[str, object]:
    """The first row of the newest eval split as {column: value}, '' where the CSV cell was empty."""
    import tensorflow as tf

    from components import artifacts
    from pipeline import metadata

    try:
        store = metadata.connect(os.path.abspath(config.metadata_path))
        split = metadata.latest_split(store, config.name, "CsvExampleGen", "examples", "eval")
    except metadata.NoRecordError as error:
        raise PipelineError(str(error)) from None
    [record] = artifacts.read_records(split, limit=1)
    example = tf.train.Example.FromString(record)
    row: dict[str, object] = {}
    for name, feature in example.features.feature.items():
        values = getattr(feature, feature.WhichOneof("kind") or "bytes_list").value
        value = values[0] if values else ""
        row[name] = value.decode() if isinstance(value, bytes) else value
    return row
