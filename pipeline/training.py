"""`mlops train`: training alone, on N workers, from the pipeline's latest Transform output."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from components import artifacts
from components.distributed.spec import WorkerSpec
from pipeline import metadata
from pipeline.pipeline import RUN_FN, TRANSFORM_NODE, trainer_custom_config
from settings.config import PipelineConfig
from settings.errors import UserError


class NoTransformOutputError(UserError, LookupError):
    """The pipeline has not run Transform yet; the message says to run it first."""

    exit_code = 2


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
    try:
        outputs = metadata.latest_outputs(metadata.connect(os.path.abspath(config.metadata_path)), config.name,
                                          TRANSFORM_NODE)
    except metadata.NoRecordError:
        raise NoTransformOutputError(f"pipeline '{config.name}' has no finished Transform under "
                                     f"{config.output_root}; run `mlops run` first.") from None
    return TransformOutput(outputs["transformed_examples"].uri, outputs["transform_graph"].uri)


def training_spec(config: PipelineConfig, transform: TransformOutput, output_dir: str) -> WorkerSpec:
    """The WorkerSpec the Trainer would write for this config, with the model and logs under `output_dir`."""
    return WorkerSpec(
        run_fn=RUN_FN,
        train_files=[artifacts.split_pattern(artifacts.split_uri(transform.transformed_examples, "train"))],
        eval_files=[artifacts.split_pattern(artifacts.split_uri(transform.transformed_examples, "eval"))],
        # TFX's layout of a Model artifact, so that Evaluator and Pusher code reads it alike.
        serving_model_dir=artifacts.serving_model_dir(artifacts.join(output_dir, "model")),
        model_run_dir=artifacts.join(output_dir, "model_run"),
        transform_output=transform.transform_graph,
        train_steps=config.training.train_steps,
        eval_steps=config.training.eval_steps,
        custom_config=trainer_custom_config(config),
    )


def train(config: PipelineConfig, out: TextIO | None = None) -> TrainResult:
    """Trains on `config.training.workers` workers (local or TFJob) from the latest Transform output."""
    out = out or sys.stdout
    from components.distributed.executor import run_distributed_training, tfjob_name

    transform = latest_transform_output(config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    output_dir = os.path.abspath(os.path.join(config.output_root, "train", f"{config.name}-{stamp}"))
    spec = training_spec(config, transform, output_dir)
    print(f"training '{config.name}' on {config.training.workers} worker(s) ({config.training.backend}) from "
          f"{transform.transformed_examples}", file=out, flush=True)

    def show(index: int, line: str) -> None:
        print(f"[tfjob] {line}" if index < 0 else f"[worker {index}] {line}", file=out, flush=True)

    started = time.monotonic()
    logs = run_distributed_training(spec, config.resolved_training(), tfjob_name(spec.model_run_dir), show)
    result = TrainResult(spec.serving_model_dir, spec.model_run_dir, logs, time.monotonic() - started)
    if not artifacts.exists(result.serving_model_dir):
        raise RuntimeError(f"the chief worker wrote no model to {result.serving_model_dir}; see {logs}.")
    print(f"\ntrained in {result.seconds:.1f}s\n  model         {result.serving_model_dir}\n"
          f"  TensorBoard   {result.model_run_dir}\n  worker logs   {logs}", file=out, flush=True)
    return result
