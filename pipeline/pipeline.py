"""The DAG: CSV to a blessed model published as a version of a TF Serving model repository, from one PipelineConfig."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow_model_analysis as tfma

# TFX's modules, not `tfx.v1`: it imports Google Cloud's AI Platform and KFP clients (~2 s) that runs never use.
from tfx.components import Evaluator, ExampleValidator, StatisticsGen, Trainer, Transform, Tuner
from tfx.components.example_gen.component import FileBasedExampleGen
from tfx.components.schema_gen.import_schema_gen.component import ImportSchemaGen
from tfx.dsl.components.base import executor_spec
from tfx.orchestration.data_types import RuntimeParameter
from tfx.orchestration.metadata import sqlite_metadata_connection_config
from tfx.orchestration.pipeline import Pipeline
from tfx.proto import example_gen_pb2, trainer_pb2

from components import artifacts
from components.baseline import baseline_resolver
from components.distributed.executor import DistributedTrainerExecutor
from components.example_gen.executor import Executor as CsvMarkersExecutor
from components.example_gen.executor import custom_config as example_gen_custom_config
from components.exporter.component import Exporter
from components.gates.component import DataValidationGate
from components.optimizer.component import Optimizer
from components.publisher.component import Publisher
from components.serving_baseline.component import ServingBaseline
from components.serving_baseline.evaluator import Executor as ServingBaselineEvaluator
from components.serving_baseline.resolve import repository_state
from components.specs import (
    CODE_FINGERPRINT_KEY,
    EXPORTER_SECTIONS,
    FEATURE_SECTIONS,
    OPTIMIZED_MODEL_KEY,
    OPTIMIZER_SECTIONS,
    TRAINER_SECTIONS,
)
from pipeline.beam import beam_pipeline_args
from pipeline.data import count_csv_rows, resolve_data_dir
from settings.config import REPOSITORY_BASELINES, EvaluationConfig, LabelConfig, PipelineConfig, tolerance_note
from settings.tasks import EVALUATOR_METRICS, METRICS, higher_is_better, no_skill_bound, task_metric

PREPROCESSING_FN = "components.transform.preprocessing_fn"
RUN_FN = "components.model.run_fn"
TUNER_FN = "components.tuner.tuner_fn"
REPO_ROOT = Path(__file__).resolve().parent.parent
# The code Transform, Tuner and Trainer load by name, and the settings it reads.
MODULE_CODE = ("components", "settings")
# ExampleGen's own code: only its edits re-run ExampleGen (the module code's fingerprint would re-run it on any edit).
EXAMPLE_GEN_CODE = ("components/example_gen", "components/label_rule.py", "settings")
# Runtime parameters of the pipeline: a KFP run can set them without compiling again; local runs use the defaults.
DATA_ROOT_PARAMETER = "data_root"
TRAIN_ARGS_PARAMETER = "train_args"
# Node ids that other code looks up in ML Metadata or wires channels by.
EXAMPLE_GEN_NODE = "CsvExampleGen"
TRANSFORM_NODE = "Transform"
GATE_NODE = "DataValidationGate"
OPTIMIZER_NODE = "Optimizer"
EVALUATOR_NODE = "Evaluator"
SERVING_BASELINE_NODE = "ServingBaseline"


# Figures a person reads beside each kind's metrics (settings.tasks.METRICS), as TFMA computes them (class name,
# module, TFMA's key of the figure).
EXTRA_METRICS: dict[str, list[tuple[str, str, str]]] = {
    # MeanLabel: the share of positives, so that the report calls out a slice of one class (its AUC means nothing).
    "binary": [("Precision", "", "precision"), ("Recall", "", "recall"), ("Calibration", "", "calibration"),
               ("MeanLabel", "", "mean_label")],
    "multiclass": [("MulticlassMetric", EVALUATOR_METRICS, "precision"),
                   ("MulticlassMetric", EVALUATOR_METRICS, "recall")],
    "regression": [],
}
# The run report's pictures, per kind (TFMA plots: per slice, one pass with the metrics). Few points keep them cheap:
# 200 thresholds draw the ROC and precision-recall curves and give the confusion matrix at any threshold to 0.005.
PLOTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "binary": [("ConfusionMatrixPlot", {"num_thresholds": 200}), ("CalibrationPlot", {"num_buckets": 10})],
    "multiclass": [("MultiClassConfusionMatrixPlot", {})],
    "regression": [],
}


def metric_bounds(evaluation: EvaluationConfig, kind: str) -> dict[str, dict[str, float]]:
    """Per metric, the bounds a candidate must meet ({"lower_bound": ..., "upper_bound": ...}): lower_bound and
    upper_bound on evaluation.metric, and no_skill_margin beyond each evaluation.no_skill figure; where both bound
    the same side of one metric, the stricter holds (TFMA keeps one threshold per metric)."""
    bounds: dict[str, dict[str, float]] = {}
    judged = task_metric(kind, evaluation.metric)
    for side in ("lower_bound", "upper_bound"):
        if getattr(evaluation, side) is not None:
            bounds.setdefault(judged, {})[side] = getattr(evaluation, side)
    for name, figure in evaluation.no_skill.items():
        side, stricter = ("lower_bound", max) if higher_is_better(kind, name) else ("upper_bound", min)
        bound = no_skill_bound(kind, name, figure, evaluation.no_skill_margin)
        held = bounds.setdefault(name, {})
        held[side] = stricter(held[side], bound) if side in held else bound
    return bounds


def blessing_threshold(evaluation: EvaluationConfig, kind: str, with_baseline: bool) -> tfma.MetricThreshold:
    """The threshold that blesses a model on evaluation.metric: within its bounds (metric_bounds), and (with a
    baseline) at most max_degradation worse than the baseline, whichever way the metric improves."""
    threshold = tfma.MetricThreshold()
    bounds = metric_bounds(evaluation, kind).get(task_metric(kind, evaluation.metric))
    if bounds:
        threshold.value_threshold.CopyFrom(tfma.GenericValueThreshold(
            **{side: {"value": value} for side, value in bounds.items()}))
    if with_baseline:
        # Ignored on the first run, when no blessed baseline exists yet. TFMA compares candidate - baseline.
        if higher_is_better(kind, evaluation.metric):
            change = tfma.GenericChangeThreshold(direction=tfma.MetricDirection.HIGHER_IS_BETTER,
                                                 absolute={"value": -evaluation.max_degradation})
        else:
            change = tfma.GenericChangeThreshold(direction=tfma.MetricDirection.LOWER_IS_BETTER,
                                                 absolute={"value": evaluation.max_degradation})
        threshold.change_threshold.CopyFrom(change)
    return threshold


def _setting(config: PipelineConfig, key: str) -> str:
    """`key=value` as the config file writes it (null for no value)."""
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return f"{key}={'null' if value is None else (f'{value:g}' if isinstance(value, float) else value)}"


def not_blessed_message(failures: list[dict[str, Any]], config: PipelineConfig, candidate: dict[str, float],
                        baseline: dict[str, float], label_std: float | None = None) -> str:
    """Why the Evaluator did not bless the candidate: for each threshold it failed (summary.validation_failures),
    the figures and every config key, with its value, that sets the same comparison; empty for no failure."""
    kind, evaluation = config.label.kind, config.evaluation
    judged = task_metric(kind, evaluation.metric)
    names = {metric.key: metric.name for metric in METRICS[kind]}
    chosen = _setting(config, "evaluation.metric") + (f", which judges {judged}" if evaluation.metric == "auto" else "")
    parts = []
    for failure in failures:
        key, value = failure["metric"], failure.get("value")
        name = names.get(key, key)
        if value is None or not math.isfinite(value):
            # No bound passes a NaN: naming the bounds would send the user to a dead end.
            parts.append(f"the eval {name} is {value}, which no bound passes: the model or the eval rows hold a value "
                         "that is not a number (a missing label, a NaN training loss); check the label column and the "
                         "Trainer's log")
        elif failure.get("is_diff"):
            figure, before = candidate.get(key), baseline.get(key)
            figures = (f"{figure:.4f} is {abs(value):.4f} {'below' if value < 0 else 'above'} the baseline model's "
                       f"{before:.4f}" if figure is not None and before is not None
                       else f"is {abs(value):.4f} worse than the baseline model's")
            note = tolerance_note("evaluation.max_degradation", kind, evaluation.metric, label_std)
            parts.append(f"the eval {name} {figures}, more than {_setting(config, 'evaluation.max_degradation')} "
                         f"allows (the baseline model chosen by {_setting(config, 'evaluation.baseline')}, the metric "
                         f"by {chosen}; {note}); allow more with evaluation.max_degradation, compare with another "
                         "evaluation.baseline (none: the bounds alone) or improve the model")
        else:
            keys = [_setting(config, "evaluation.lower_bound"),
                    _setting(config, "evaluation.upper_bound")] if name == judged else []
            if name in evaluation.no_skill:
                # The no-skill bound and the blessing metric's bound are one TFMA threshold: the stricter one holds.
                keys += [f"evaluation.no_skill.{name}={evaluation.no_skill[name]:g}",
                         _setting(config, "evaluation.no_skill_margin")]
            bounds = metric_bounds(evaluation, kind).get(name, {})
            lower, upper = bounds.get("lower_bound"), bounds.get("upper_bound")
            if lower is not None and value < lower:
                where = f"below its lower bound {lower:g}"
            elif upper is not None and value > upper:
                where = f"above its upper bound {upper:g}"
            else:
                where = f"outside its bounds ({failure.get('message') or 'a threshold of TFMA'})"
            named = (", ".join(keys[:-1]) + " and " if len(keys) > 1 else "") + (keys[-1] if keys else "")
            named += f" on {chosen}" if name == judged else ""
            parts.append(f"the eval {name} {value:.4f} is {where} (set by {named or 'no key of evaluation'}); "
                         "improve the model or move the bound with those keys")
    return "; ".join(dict.fromkeys(parts))  # a NaN fails the bound and the comparison alike: said once


def eval_config(config: PipelineConfig) -> tfma.EvalConfig:
    """TFMA: the metrics a person reads for the task kind, overall and per slice, and the thresholds on
    evaluation.metric that bless a model."""
    kind = config.label.kind
    evaluation = config.evaluation
    blessing = task_metric(kind, evaluation.metric)
    threshold = blessing_threshold(evaluation, kind, evaluation.baseline != "none")
    metrics = [tfma.MetricConfig(class_name="ExampleCount")]
    bounds = metric_bounds(evaluation, kind)
    for judged_metric in METRICS[kind]:
        name = judged_metric.name
        metric = tfma.MetricConfig(class_name=judged_metric.tfma_class, module=judged_metric.tfma_module,
                                   config=json.dumps({"name": judged_metric.key}) if judged_metric.tfma_module else "")
        judged = tfma.MetricThreshold()
        if name == blessing:
            judged.CopyFrom(threshold)
        elif name in bounds:
            # A no-skill bound on another metric: TFMA blesses only when every threshold of every metric passes.
            judged.value_threshold.CopyFrom(tfma.GenericValueThreshold(
                **{side: {"value": value} for side, value in bounds[name].items()}))
        if judged.ListFields():
            # Judged on all eval rows; small slices (a rare payment type) can hold one class only.
            metric.per_slice_thresholds.append(
                tfma.PerSliceMetricThreshold(slicing_specs=[tfma.SlicingSpec()], threshold=judged))
        metrics.append(metric)
    for class_name, module, key in EXTRA_METRICS[kind]:
        metrics.append(tfma.MetricConfig(class_name=class_name, module=module,
                                         config=json.dumps({"name": key}) if module else ""))
    for class_name, settings in PLOTS[kind]:
        metrics.append(tfma.MetricConfig(class_name=class_name, config=json.dumps(settings) if settings else ""))
    slicing = [tfma.SlicingSpec()]
    if evaluation.slice_feature:
        slicing.append(tfma.SlicingSpec(feature_keys=[evaluation.slice_feature]))
    return tfma.EvalConfig(
        model_specs=[
            tfma.ModelSpec(
                signature_name="serving_examples",
                label_key=config.label.name,
                preprocessing_function_names=["transform_features"],
            )
        ],
        slicing_specs=slicing,
        metrics_specs=[tfma.MetricsSpec(metrics=metrics)],
    )


def code_fingerprint(paths: tuple[str, ...] = MODULE_CODE) -> str:
    """Hash of the code in `paths` (folders or files; by default all module code Transform, Tuner and Trainer load by
    name, and the settings it reads), so that editing it invalidates TFX's cache (which keys on properties, not on
    the source behind a function path)."""
    digest = hashlib.sha256()
    for path in paths:
        code = REPO_ROOT / path
        for file in [code] if code.is_file() else sorted(code.rglob("*.py")):
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def staged_schema(config: PipelineConfig) -> str:
    """Copies the curated schema below the pipeline root (any file system), to a path named by its content:
    ImportSchemaGen's cache keys on the path, so an edited schema must arrive under a new one."""
    content = Path(config.schema_path).read_bytes()
    target = artifacts.join(artifacts.absolute(config.pipeline_root), artifacts.STAGED_SCHEMAS_DIR,
                            hashlib.sha256(content).hexdigest()[:16], artifacts.SCHEMA_FILE)
    if not artifacts.exists(target):
        artifacts.write_bytes(target, content)
    return target


def module_custom_config(config: PipelineConfig, *sections: str) -> dict[str, Any]:
    """The custom_config of a standard component: the named config sections and the module code's fingerprint."""
    return {**config.sections(*sections), CODE_FINGERPRINT_KEY: code_fingerprint()}


def trainer_custom_config(config: PipelineConfig) -> dict[str, Any]:
    """What the Trainer's and the Tuner's module code receives (and `mlops train` hands its workers)."""
    return module_custom_config(config, *TRAINER_SECTIONS)


@dataclass(frozen=True)
class Deployment:
    """Where the pipeline's code runs: this checkout (local runs) or the project image (Kubeflow)."""

    # The repository as the components see it: setup.py for Beam's workers, the curated schema.
    project_root: str
    # Local runs keep ML Metadata in the SQLite file and stage the schema below the pipeline root; on a cluster the
    # orchestrator keeps the metadata and the image carries the schema.
    local: bool


LOCAL = Deployment(project_root=str(REPO_ROOT), local=True)


def beam_args(config: PipelineConfig, deployment: Deployment = LOCAL) -> list[str]:
    """Beam's arguments; for a local run on local CSV files they also know its rows (beam.direct_running_mode)."""
    rows = None
    if deployment.local and config.beam.direct_running_mode == "auto" and not artifacts.is_uri(config.data.path):
        folder = resolve_data_dir(config.data.path, config.output_root)
        rows = count_csv_rows(folder) if folder.is_dir() else None
    return beam_pipeline_args(config.beam, artifacts.join(deployment.project_root, "setup.py"), rows)


def schema_file(config: PipelineConfig, deployment: Deployment) -> str:
    """The schema ImportSchemaGen reads: staged below the pipeline root locally, inside the image on a cluster."""
    if deployment.local:
        return staged_schema(config)
    schema = Path(config.schema_path).resolve()
    if not schema.is_relative_to(REPO_ROOT):
        raise ValueError(f"schema_path {schema} is outside the repository, so the project image does not carry it; "
                         "put the curated schema in the repository (pipeline/configs/) and build the image again.")
    return artifacts.join(deployment.project_root, schema.relative_to(REPO_ROOT).as_posix())


def data_root(config: PipelineConfig) -> str:
    """The CSV folder ExampleGen reads: a URI as given, a local folder, the embedded sample, or a bundled dataset
    written below output_root."""
    if artifacts.is_uri(config.data.path):
        return config.data.path
    return str(resolve_data_dir(config.data.path, config.output_root))


def stratify_label(config: PipelineConfig) -> LabelConfig | None:
    """The label ExampleGen splits each class of by the split shares (data.stratify); None for a hash split."""
    if not config.data.stratify or config.label.kind == "regression":
        return None
    return config.label


def csv_example_gen(config: PipelineConfig) -> FileBasedExampleGen:
    """ExampleGen: the CSV folder as train and eval tf.Examples, `data.missing_values` read as empty cells and rows
    without a value of `label.column` left out (also what `mlops init` reads the data with, so that its schema
    describes the same encoding)."""
    return FileBasedExampleGen(
        input_base=RuntimeParameter(name=DATA_ROOT_PARAMETER, ptype=str, default=data_root(config)),
        input_config=example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern="*.csv")]),
        output_config=example_gen_pb2.Output(
            split_config=example_gen_pb2.SplitConfig(
                splits=[
                    example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=config.data.train_buckets),
                    example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=config.data.eval_buckets),
                    *([example_gen_pb2.SplitConfig.Split(name=artifacts.CALIBRATION_SPLIT,
                                                   hash_buckets=config.data.calibration_buckets)]
                      if config.data.calibration_buckets else []),
                ]
            )
        ),
        custom_config=example_gen_custom_config(config.data.missing_values, code_fingerprint(EXAMPLE_GEN_CODE),
                                                stratify_label(config), config.label.column),
        custom_executor_spec=executor_spec.BeamExecutorSpec(CsvMarkersExecutor),
    ).with_id(EXAMPLE_GEN_NODE)


def create_pipeline(
    config: PipelineConfig, deployment: Deployment = LOCAL, data_only: bool = False
) -> Pipeline:
    """Builds the TFX pipeline; the same object runs locally or, compiled, on Kubeflow Pipelines.

    Each component gets the config sections it reads (components/specs.py), so that editing a later stage's
    settings keeps the earlier stages cached. `data_only` stops after Transform: the data stages, whose cost grows
    with the data and which the Beam runner runs.
    """
    fingerprint = code_fingerprint()
    trainer_config = trainer_custom_config(config)
    example_gen = csv_example_gen(config)
    statistics_gen = StatisticsGen(examples=example_gen.outputs["examples"])
    schema_gen = ImportSchemaGen(schema_file=schema_file(config, deployment))
    example_validator = ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"]
    )
    gate = DataValidationGate(anomalies=example_validator.outputs["anomalies"]).with_id(GATE_NODE)
    transform = Transform(
        examples=example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        preprocessing_fn=PREPROCESSING_FN,
        custom_config=module_custom_config(config, *FEATURE_SECTIONS),
        disable_statistics=not config.transform.statistics,
        # Nothing feeds an analyzer cache back in (no analyzer_cache input), so writing one is work for nothing.
        disable_analyzer_cache=True,
        force_tf_compat_v1=config.transform.tf_compat_v1,
    ).with_id(TRANSFORM_NODE)
    components = [example_gen, statistics_gen, schema_gen, example_validator, gate, transform]
    if data_only:
        return _pipeline(config, deployment, components)

    hyperparameters = None
    if config.tuner.enabled:
        tuner = Tuner(
            tuner_fn=TUNER_FN,
            examples=transform.outputs["transformed_examples"],
            transform_graph=transform.outputs["transform_graph"],
            train_args=trainer_pb2.TrainArgs(num_steps=config.tuner.train_steps),
            eval_args=trainer_pb2.EvalArgs(num_steps=config.tuner.eval_steps),
            custom_config=trainer_config,
        )
        # Nothing learns from data the gate refused; Transform only prepares it, beside the validation.
        tuner.add_upstream_node(gate)
        components.append(tuner)
        hyperparameters = tuner.outputs["best_hyperparameters"]

    trainer = Trainer(
        run_fn=RUN_FN,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema_gen.outputs["schema"],
        hyperparameters=hyperparameters,
        # A TrainArgs proto as JSON, so that a KFP run can change the number of steps.
        train_args=RuntimeParameter(
            name=TRAIN_ARGS_PARAMETER, ptype=str, default=json.dumps({"num_steps": config.training.train_steps})),
        eval_args=trainer_pb2.EvalArgs(num_steps=config.training.eval_steps),
        custom_config=trainer_config,
        # TFX's own executor for one local worker; N worker processes or a TFJob otherwise.
        custom_executor_spec=executor_spec.ExecutorClassSpec(DistributedTrainerExecutor),
    )
    trainer.add_upstream_node(gate)
    # The Evaluator judges the model that ships: after distillation and pruning.
    optimizer = Optimizer(
        model=trainer.outputs["model"],
        transform_graph=transform.outputs["transform_graph"],
        examples=transform.outputs["transformed_examples"],
        sections=config.sections(*OPTIMIZER_SECTIONS),
        code_fingerprint=fingerprint,
    ).with_id(OPTIMIZER_NODE)
    model_resolver = serving_baseline(config, deployment, fingerprint)
    if model_resolver is None:
        model_resolver = baseline_resolver(config.evaluation.baseline, OPTIMIZER_NODE, OPTIMIZED_MODEL_KEY,
                                           EVALUATOR_NODE)
        if model_resolver is not None:
            # The resolver must run after this run's candidate exists: it leaves that model out of the baselines.
            model_resolver.add_upstream_node(optimizer)
    evaluator = Evaluator(
        examples=example_gen.outputs["examples"],
        model=optimizer.outputs[OPTIMIZED_MODEL_KEY],
        baseline_model=model_resolver.outputs["model"] if model_resolver else None,
        eval_config=eval_config(config),
    ).with_id(EVALUATOR_NODE)
    if isinstance(model_resolver, ServingBaseline):
        # TFX's Evaluator, reading ServingBaseline's empty Model of a first run as no baseline.
        evaluator.executor_spec = executor_spec.BeamExecutorSpec(ServingBaselineEvaluator)
    # Every format, verified against the SavedModel: with the blessing, the gate before publishing. It takes no
    # blessing, so that it runs beside the Evaluator (pipeline/local/dag_runner.py; on Kubeflow, in its own pod).
    exporter = Exporter(
        model=optimizer.outputs["optimized_model"],
        transform_graph=transform.outputs["transform_graph"],
        examples=example_gen.outputs["examples"],
        sections=config.sections(*EXPORTER_SECTIONS),
        code_fingerprint=fingerprint,
    ).with_id("Exporter")
    # The next integer version of the model repository; publishing routes no traffic (`mlops rollout` does).
    publisher = Publisher(
        model=exporter.outputs["exported_model"],
        model_blessing=evaluator.outputs["blessing"],
        serving_base_dir=artifacts.absolute(config.serving_base_dir),
        model_name=config.model_name,
        # The version carries its training schema and statistics: `mlops monitor` compares the requests with them.
        schema=schema_gen.outputs["schema"],
        statistics=statistics_gen.outputs["statistics"],
    ).with_id("Publisher")
    components += [trainer, optimizer, *([model_resolver] if model_resolver else []), evaluator, exporter, publisher]
    return _pipeline(config, deployment, components)


def serving_baseline(config: PipelineConfig, deployment: Deployment, fingerprint: str) -> ServingBaseline | None:
    """The ServingBaseline node for a repository baseline (evaluation.baseline stable or published_blessed)."""
    if config.evaluation.baseline not in REPOSITORY_BASELINES:
        return None
    serving_base_dir = artifacts.absolute(config.serving_base_dir)
    # Locally the repository's state keys the cache; a cluster's cache is switched off for the node instead.
    state = repository_state(serving_base_dir, config.model_name) if deployment.local else ""
    return ServingBaseline(serving_base_dir=serving_base_dir, model_name=config.model_name,
                           rule=config.evaluation.baseline, repository_state=state,
                           code_fingerprint=fingerprint).with_id(SERVING_BASELINE_NODE)


def _pipeline(config: PipelineConfig, deployment: Deployment, components: list[Any]) -> Pipeline:
    return Pipeline(
        pipeline_name=config.name,
        pipeline_root=artifacts.absolute(config.pipeline_root),
        components=components,
        enable_cache=config.enable_cache,
        metadata_connection_config=sqlite_metadata_connection_config(
            artifacts.absolute(config.metadata_path)
        ) if deployment.local else None,
        beam_pipeline_args=beam_args(config, deployment),
    )
