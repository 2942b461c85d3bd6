"""`mlops train`: training alone, on N workers, from the pipeline's latest Transform output."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from components.distributed.spec import WorkerSpec
from pipeline.config import PipelineConfig
from pipeline.pipeline import RUN_FN, code_fingerprint

TRANSFORM_TYPE = "tfx.components.transform.component.Transform"
FINISHED = (metadata_store_pb2.Execution.COMPLETE, metadata_store_pb2.Execution.CACHED)


class NoTransformOutputError(LookupError):
    """The pipeline has not run Transform yet; the message says to run it first."""


@dataclass
class TransformOutput:
    transformed_examples: str
    transform_graph: str


@dataclass
class TrainResult:
    serving_model_dir: str
    model_run_dir: str
    logs: str
    seconds: float


def latest_transform_output(config: PipelineConfig) -> TransformOutput:
    """The transformed examples and graph of the newest finished Transform of this pipeline, from ML Metadata."""
    missing = NoTransformOutputError(
        f"pipeline '{config.name}' has no finished Transform under {config.output_root}; run `mlops run` first."
    )
    if not os.path.exists(config.metadata_path):
        raise missing
    connection = metadata_store_pb2.ConnectionConfig()
    connection.sqlite.filename_uri = config.metadata_path
    connection.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    store = metadata_store.MetadataStore(connection)
    pipeline = store.get_context_by_type_and_name("pipeline", config.name)
    if pipeline is None:
        raise missing
    in_pipeline = {e.id for e in store.get_executions_by_context(pipeline.id)}
    executions = [e for e in store.get_executions_by_type(TRANSFORM_TYPE)
                  if e.id in in_pipeline and e.last_known_state in FINISHED]
    if not executions:
        raise missing
    latest = max(executions, key=lambda e: (e.create_time_since_epoch, e.id))
    outputs = {}
    for event in store.get_events_by_execution_ids([latest.id]):
        if event.type == metadata_store_pb2.Event.OUTPUT and event.path.steps:
            outputs[event.path.steps[0].key] = store.get_artifacts_by_id([event.artifact_id])[0].uri
    return TransformOutput(outputs["transformed_examples"], outputs["transform_graph"])


def training_spec(config: PipelineConfig, transform: TransformOutput, output_dir: str) -> WorkerSpec:
    """The WorkerSpec the Trainer would write for this config, with the model and logs under `output_dir`."""
    module_config = {**config.module_config(), "code_fingerprint": code_fingerprint()}
    return WorkerSpec(
        run_fn=RUN_FN,
        train_files=[os.path.join(transform.transformed_examples, "Split-train", "*")],
        eval_files=[os.path.join(transform.transformed_examples, "Split-eval", "*")],
        # TFX's layout of a Model artifact, so that Evaluator and Pusher code reads it alike.
        serving_model_dir=os.path.join(output_dir, "model", "Format-Serving"),
        model_run_dir=os.path.join(output_dir, "model_run"),
        transform_output=transform.transform_graph,
        train_steps=config.training.train_steps,
        eval_steps=config.training.eval_steps,
        custom_config=module_config,
    )


def train(config: PipelineConfig, out: TextIO = sys.stdout) -> TrainResult:
    """Trains on `config.training.workers` workers (local or TFJob) from the latest Transform output."""
    from components.distributed.executor import run_distributed_training, tfjob_name

    transform = latest_transform_output(config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    output_dir = os.path.abspath(os.path.join(config.output_root, "train", f"{config.name}-{stamp}"))
    spec = training_spec(config, transform, output_dir)
    training = config.module_config()["training"]
    print(f"training '{config.name}' on {config.training.workers} worker(s) ({config.training.backend}) from "
          f"{transform.transformed_examples}", file=out, flush=True)

    def show(index: int, line: str) -> None:
        print(f"[tfjob] {line}" if index < 0 else f"[worker {index}] {line}", file=out, flush=True)

    started = time.monotonic()
    logs = run_distributed_training(spec, training, tfjob_name(spec.model_run_dir), show)
    result = TrainResult(spec.serving_model_dir, spec.model_run_dir, logs, time.monotonic() - started)
    if not os.path.isdir(result.serving_model_dir):
        raise RuntimeError(f"the chief worker wrote no model to {result.serving_model_dir}; see {logs}.")
    print(f"\ntrained in {result.seconds:.1f}s\n  model         {result.serving_model_dir}\n"
          f"  TensorBoard   {result.model_run_dir}\n  worker logs   {logs}", file=out, flush=True)
    return result
