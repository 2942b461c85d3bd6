"""The DAG: CSV to a blessed model published as a version of a TF Serving model repository, from one PipelineConfig."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import tensorflow_model_analysis as tfma
from tfx import v1 as tfx
from tfx.dsl.components.base import executor_spec

from components.baseline import PreviousBlessedModelStrategy
from components.distributed.executor import DistributedTrainerExecutor
from components.exporter.component import Exporter
from components.gates.component import DataValidationGate
from components.optimizer.component import Optimizer
from components.publisher.component import Publisher
from pipeline.config import PipelineConfig
from pipeline.data import resolve_data_dir

PREPROCESSING_FN = "components.transform.preprocessing_fn"
RUN_FN = "components.model.run_fn"
TUNER_FN = "components.tuner.tuner_fn"


def eval_config(config: PipelineConfig) -> tfma.EvalConfig:
    """TFMA: the metrics a person reads, overall and per slice, and the two thresholds that bless a model."""
    auc_threshold = tfma.MetricThreshold(
        value_threshold=tfma.GenericValueThreshold(lower_bound={"value": config.evaluation.min_auc}),
        # Ignored on the first run, when no blessed baseline exists yet.
        change_threshold=tfma.GenericChangeThreshold(
            direction=tfma.MetricDirection.HIGHER_IS_BETTER,
            absolute={"value": -config.evaluation.max_auc_drop},
        ),
    )
    slicing = [tfma.SlicingSpec()]
    if config.evaluation.slice_feature:
        slicing.append(tfma.SlicingSpec(feature_keys=[config.evaluation.slice_feature]))
    return tfma.EvalConfig(
        model_specs=[
            tfma.ModelSpec(
                signature_name="serving_examples",
                label_key=config.label.name,
                preprocessing_function_names=["transform_features"],
            )
        ],
        slicing_specs=slicing,
        metrics_specs=[
            tfma.MetricsSpec(
                metrics=[
                    tfma.MetricConfig(class_name="ExampleCount"),
                    tfma.MetricConfig(
                        class_name="AUC",
                        # Judged on all eval rows; small slices (a rare payment type) can hold one class only.
                        per_slice_thresholds=[
                            tfma.PerSliceMetricThreshold(slicing_specs=[tfma.SlicingSpec()], threshold=auc_threshold)
                        ],
                    ),
                    tfma.MetricConfig(class_name="BinaryAccuracy"),
                    tfma.MetricConfig(class_name="Precision"),
                    tfma.MetricConfig(class_name="Recall"),
                    tfma.MetricConfig(class_name="Calibration"),
                ]
            )
        ],
    )


def code_fingerprint() -> str:
    """Hash of the module code that Transform, Tuner and Trainer load by name, so that editing it
    invalidates TFX's cache (which keys on properties, not on the source behind a function path)."""
    digest = hashlib.sha256()
    for path in sorted((Path(__file__).parent.parent / "components").rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def staged_schema(config: PipelineConfig) -> str:
    """Copies the curated schema to a path named by its content: ImportSchemaGen's cache keys on the path,
    so an edited schema must arrive under a new one."""
    content = Path(config.schema_path).read_bytes()
    target = Path(config.pipeline_root, "_schemas", hashlib.sha256(content).hexdigest()[:16], "schema.pbtxt")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return str(target.resolve())


def beam_args(config: PipelineConfig) -> list[str]:
    return [
        f"--direct_running_mode={config.beam.direct_running_mode}",
        f"--direct_num_workers={config.beam.direct_num_workers}",
        # Names this project as the code Beam workers need. Without a dependency flag TFX builds an sdist
        # of itself before every Beam stage (seconds each), which the local DirectRunner never reads.
        f"--setup_file={Path(__file__).resolve().parent.parent / 'setup.py'}",
    ]


def create_pipeline(config: PipelineConfig) -> tfx.dsl.Pipeline:
    """Builds the TFX pipeline; the same object runs locally or, compiled, on Kubeflow Pipelines."""
    full_config = {**config.module_config(), "code_fingerprint": code_fingerprint()}
    # Each component gets the sections it reads, so that editing a later stage's settings keeps earlier ones cached.
    transform_config = {k: full_config[k] for k in ("features", "label", "transform", "code_fingerprint")}
    module_config = {k: v for k, v in full_config.items() if k not in ("optimize", "export")}
    example_gen = tfx.components.CsvExampleGen(
        input_base=str(resolve_data_dir(config.data.path)),
        input_config=tfx.proto.Input(splits=[tfx.proto.Input.Split(name="single_split", pattern="*.csv")]),
        output_config=tfx.proto.Output(
            split_config=tfx.proto.SplitConfig(
                splits=[
                    tfx.proto.SplitConfig.Split(name="train", hash_buckets=config.data.train_buckets),
                    tfx.proto.SplitConfig.Split(name="eval", hash_buckets=config.data.eval_buckets),
                ]
            )
        ),
    )
    statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema_gen = tfx.components.ImportSchemaGen(schema_file=staged_schema(config))
    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"]
    )
    gate = DataValidationGate(anomalies=example_validator.outputs["anomalies"]).with_id("DataValidationGate")
    transform = tfx.components.Transform(
        examples=example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        preprocessing_fn=PREPROCESSING_FN,
        custom_config=transform_config,
    )
    transform.add_upstream_node(gate)
    components = [example_gen, statistics_gen, schema_gen, example_validator, gate, transform]

    hyperparameters = None
    if config.tuner.enabled:
        tuner = tfx.components.Tuner(
            tuner_fn=TUNER_FN,
            examples=transform.outputs["transformed_examples"],
            transform_graph=transform.outputs["transform_graph"],
            train_args=tfx.proto.TrainArgs(num_steps=config.tuner.train_steps),
            eval_args=tfx.proto.EvalArgs(num_steps=config.tuner.eval_steps),
            custom_config=module_config,
        )
        components.append(tuner)
        hyperparameters = tuner.outputs["best_hyperparameters"]

    trainer = tfx.components.Trainer(
        run_fn=RUN_FN,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema_gen.outputs["schema"],
        hyperparameters=hyperparameters,
        train_args=tfx.proto.TrainArgs(num_steps=config.training.train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=config.training.eval_steps),
        custom_config=module_config,
        # TFX's own executor for one local worker; N worker processes or a TFJob otherwise.
        custom_executor_spec=executor_spec.ExecutorClassSpec(DistributedTrainerExecutor),
    )
    # The Evaluator judges the model that ships: after distillation and pruning.
    optimizer = Optimizer(
        model=trainer.outputs["model"],
        transform_graph=transform.outputs["transform_graph"],
        examples=transform.outputs["transformed_examples"],
        custom_config={**module_config, "optimize": full_config["optimize"]},
    ).with_id("Optimizer")
    model_resolver = tfx.dsl.Resolver(
        strategy_class=PreviousBlessedModelStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
        candidate=optimizer.outputs["optimized_model"],
    ).with_id("BaselineModelResolver")
    evaluator = tfx.components.Evaluator(
        examples=example_gen.outputs["examples"],
        model=optimizer.outputs["optimized_model"],
        baseline_model=model_resolver.outputs["model"],
        eval_config=eval_config(config),
    )
    # The gate between the blessing and the push: every format, verified against the SavedModel.
    exporter = Exporter(
        model=optimizer.outputs["optimized_model"],
        model_blessing=evaluator.outputs["blessing"],
        transform_graph=transform.outputs["transform_graph"],
        examples=example_gen.outputs["examples"],
        custom_config={**module_config, "export": full_config["export"]},
    ).with_id("Exporter")
    # The next integer version of the model repository; publishing routes no traffic (`mlops rollout` does).
    publisher = Publisher(
        model=exporter.outputs["exported_model"],
        model_blessing=evaluator.outputs["blessing"],
        serving_base_dir=os.path.abspath(config.serving_base_dir),
        model_name=config.model_name,
    ).with_id("Publisher")
    components += [trainer, optimizer, model_resolver, evaluator, exporter, publisher]

    return tfx.dsl.Pipeline(
        pipeline_name=config.name,
        pipeline_root=os.path.abspath(config.pipeline_root),
        components=components,
        enable_cache=config.enable_cache,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            os.path.abspath(config.metadata_path)
        ),
        beam_pipeline_args=beam_args(config),
    )
