"""What a worker process needs to call the Trainer's run_fn: the FnArgs fields, saved as JSON.

TFX builds FnArgs inside the Trainer's process; its DataAccessor holds closures that cannot cross a process
boundary, so the worker rebuilds one from the examples' payload format (what TFX itself does from the artifact).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

TELEMETRY_DESCRIPTORS = ["Trainer", "DistributedTrainer"]


@dataclass
class WorkerSpec:
    # Import path of the function each worker runs, e.g. components.model.run_fn.
    run_fn: str
    train_files: list[str]
    eval_files: list[str]
    serving_model_dir: str
    model_run_dir: str
    transform_output: str | None = None
    schema_path: str | None = None
    train_steps: int | None = None
    eval_steps: int | None = None
    eval_model_dir: str | None = None
    base_model: str | None = None
    hyperparameters: dict[str, Any] | None = None
    custom_config: dict[str, Any] = field(default_factory=dict)
    # example_gen_pb2.PayloadFormat name of the training examples; Transform writes tf.Examples.
    payload_format: str = "FORMAT_TF_EXAMPLE"
    data_view_uri: str | None = None
    # KubeDL's ModelVersion: the chief also copies its SavedModel to this folder (empty: nothing to copy).
    copy_model_to: str = ""

    def save(self, path: str) -> str:
        """Writes the spec as JSON to `path` (any file system: the pipeline root's); returns `path`."""
        from components import artifacts

        artifacts.write_json(path, dataclasses.asdict(self), indent=2)
        return path

    @classmethod
    def load(cls, path: str) -> WorkerSpec:
        from components import artifacts

        return cls(**json.loads(artifacts.read_text(path)))

    @classmethod
    def from_fn_args(cls, fn_args: Any, run_fn: str, payload_format: int, data_view_uri: str | None) -> WorkerSpec:
        """The WorkerSpec of the Trainer's FnArgs (everything but the DataAccessor, which the worker rebuilds)."""
        from tfx.proto import example_gen_pb2

        return cls(
            run_fn=run_fn,
            train_files=list(fn_args.train_files),
            eval_files=list(fn_args.eval_files),
            serving_model_dir=fn_args.serving_model_dir,
            model_run_dir=fn_args.model_run_dir,
            transform_output=fn_args.transform_output,
            schema_path=fn_args.schema_path,
            train_steps=fn_args.train_steps,
            eval_steps=fn_args.eval_steps,
            eval_model_dir=fn_args.eval_model_dir,
            base_model=fn_args.base_model,
            hyperparameters=fn_args.hyperparameters,
            custom_config=dict(fn_args.custom_config or {}),
            payload_format=example_gen_pb2.PayloadFormat.Name(payload_format),
            data_view_uri=data_view_uri,
        )

    def fn_args(self):  # -> tfx FnArgs; imported lazily so that the launcher does not load TensorFlow.
        from tfx.components.trainer.fn_args_utils import DataAccessor, FnArgs
        from tfx.components.util import tfxio_utils

        def tfxio(file_pattern, schema):
            return tfxio_utils.make_tfxio(
                file_pattern=file_pattern,
                telemetry_descriptors=TELEMETRY_DESCRIPTORS,
                payload_format=self.payload_format,
                data_view_uri=self.data_view_uri,
                schema=schema,
            )

        accessor = DataAccessor(
            tf_dataset_factory=lambda patterns, options, schema: tfxio(patterns, schema).TensorFlowDataset(options),
            record_batch_factory=lambda patterns, options, schema: tfxio(patterns, schema).RecordBatches(options),
            # Only DataViews over FORMAT_PROTO payloads decode records this way; Transform writes tf.Examples.
            data_view_decode_fn=None,
        )
        return FnArgs(
            train_files=self.train_files,
            eval_files=self.eval_files,
            train_steps=self.train_steps,
            eval_steps=self.eval_steps,
            schema_path=self.schema_path,
            schema_file=self.schema_path,
            transform_graph_path=self.transform_output,
            transform_output=self.transform_output,
            data_accessor=accessor,
            serving_model_dir=self.serving_model_dir,
            eval_model_dir=self.eval_model_dir,
            model_run_dir=self.model_run_dir,
            base_model=self.base_model,
            hyperparameters=self.hyperparameters,
            custom_config=self.custom_config,
        )
