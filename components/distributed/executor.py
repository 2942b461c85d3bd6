"""The Trainer executor for `training.workers` > 1 or `training.backend: tfjob`; thin on purpose.

It builds FnArgs the way TFX's GenericExecutor does, from TFX's public helpers (`fn_args_utils.get_common_fn_args`,
`path_utils`), writes them as a WorkerSpec, and hands the spec to `run_distributed_training`, which the `mlops train`
command calls too. With one local worker it is TFX's own executor: run_fn runs in the Trainer's process, as before
distributed training existed.
"""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from absl import logging
from tfx import types
from tfx.components.trainer import fn_args_utils
from tfx.components.trainer.executor import GenericExecutor
from tfx.components.util import tfxio_utils
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import json_utils, path_utils

from components import artifacts
from components.distributed.launcher import LineSink, launch_local_workers
from components.distributed.spec import WorkerSpec
from components.specs import TRAINING_KEY
from settings.config import TrainingConfig, read_section

# Where the worker processes import `components` from: this checkout.
REPO_ROOT = str(Path(__file__).resolve().parents[2])


def run_distributed_training(
    spec: WorkerSpec,
    training: TrainingConfig,
    job_name: str,
    on_line: LineSink,
    repo_root: str = REPO_ROOT,
    tfjob_api: Any = None,
) -> str:
    """Runs `spec` on `training.workers` workers (locally or as a TFJob) and returns where the logs are.

    `tfjob_api` is a kubernetes CustomObjectsApi (made from training.tfjob.kubeconfig when None). Raises
    WorkerFailedError or TFJobFailedError.
    """
    work_dir = artifacts.workers_dir(spec.model_run_dir)
    try:
        return _run(spec, training, job_name, on_line, repo_root, work_dir, tfjob_api)
    finally:
        # A worker killed mid-training could not remove its scratch folder; the job is over now.
        artifacts.remove_tree(artifacts.join(work_dir, "scratch"))


def _run(spec: WorkerSpec, training: TrainingConfig, job_name: str, on_line: LineSink, repo_root: str,
         work_dir: str, tfjob_api: Any) -> str:
    if training.backend == "tfjob":
        from components.distributed.tfjob import KUBEDL_MODEL_MOUNT, build_tfjob, custom_objects_api, run_tfjob

        settings = training.tfjob
        if settings.model_version_name:
            spec.copy_model_to = KUBEDL_MODEL_MOUNT
        spec_path = spec.save(artifacts.join(work_dir, "spec.json"))
        job = build_tfjob(job_name, spec_path, training.workers, settings)
        api = tfjob_api if tfjob_api is not None else custom_objects_api(settings.kubeconfig)
        run_tfjob(api, job, settings.poll_seconds, settings.active_deadline_seconds, lambda line: on_line(-1, line))
        return f"TFJob {settings.namespace}/{job_name}"
    spec_path = spec.save(artifacts.join(work_dir, "spec.json"))
    if not artifacts.is_uri(work_dir):
        result = launch_local_workers(spec_path, training.workers, repo_root, work_dir,
                                      max_restarts=training.max_restarts, on_line=on_line)
        return result.log_dir
    # The launcher streams each worker's output into local files; they join the artifact when the workers end.
    with tempfile.TemporaryDirectory(prefix="worker-logs-") as local_logs:
        try:
            launch_local_workers(spec_path, training.workers, repo_root, local_logs,
                                 max_restarts=training.max_restarts, on_line=on_line)
        finally:
            artifacts.copy_tree(local_logs, work_dir)
    return work_dir


def _log_line(index: int, line: str) -> None:
    if index < 0:
        logging.info("[tfjob] %s", line)
    else:
        logging.info("[worker %d] %s", index, line)


def trainer_fn_args(input_dict: dict[str, list[types.Artifact]], output_dict: dict[str, list[types.Artifact]],
                    exec_properties: dict[str, Any]) -> fn_args_utils.FnArgs:
    """The FnArgs TFX's GenericExecutor gives run_fn, built from TFX's public helpers."""
    fn_args = fn_args_utils.get_common_fn_args(input_dict, exec_properties)
    model_uri = artifact_utils.get_single_uri(output_dict[standard_component_specs.MODEL_KEY])
    fn_args.transform_output = fn_args.transform_graph_path
    fn_args.serving_model_dir = path_utils.serving_model_dir(model_uri)
    fn_args.eval_model_dir = path_utils.eval_model_dir(model_uri)
    fn_args.model_run_dir = artifact_utils.get_single_uri(output_dict[standard_component_specs.MODEL_RUN_KEY])
    fn_args.schema_file = fn_args.schema_path
    fn_args.hyperparameters = None
    if input_dict.get(standard_component_specs.HYPERPARAMETERS_KEY):
        folder = artifact_utils.get_single_uri(input_dict[standard_component_specs.HYPERPARAMETERS_KEY])
        fn_args.hyperparameters = artifacts.read_json(artifacts.only_file(folder))
    return fn_args


class DistributedTrainerExecutor(GenericExecutor):
    """TFX Trainer executor that runs the module's run_fn on N workers (local processes or a TFJob)."""

    def Do(
        self,
        input_dict: dict[str, list[types.Artifact]],
        output_dict: dict[str, list[types.Artifact]],
        exec_properties: dict[str, Any],
    ) -> None:
        custom_config = json_utils.loads(exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY) or "null")
        training = read_section(custom_config or {}, TRAINING_KEY, TrainingConfig)
        if training.backend == "local" and training.workers == 1:
            return super().Do(input_dict, output_dict, exec_properties)

        run_fn = exec_properties.get(standard_component_specs.RUN_FN_KEY)
        if not run_fn:
            raise ValueError("distributed training needs the Trainer's run_fn as a dotted path "
                             "(run_fn='components.model.run_fn'), not a module_file.")
        fn_args = trainer_fn_args(input_dict, output_dict, exec_properties)
        payload_format, data_view_uri = tfxio_utils.resolve_payload_format_and_data_view_uri(
            input_dict[standard_component_specs.EXAMPLES_KEY]
        )
        spec = WorkerSpec.from_fn_args(fn_args, run_fn, payload_format, data_view_uri)
        job_name = tfjob_name(fn_args.model_run_dir)
        logging.info("training on %d workers (%s backend)", training.workers, training.backend)
        where = run_distributed_training(spec, training, job_name, _log_line)
        if not artifacts.exists(fn_args.serving_model_dir):
            raise RuntimeError(f"the chief worker wrote no model to {fn_args.serving_model_dir}; see {where}.")
        logging.info("Training complete. Model written to %s; worker logs in %s", fn_args.serving_model_dir, where)


def tfjob_name(model_run_dir: str) -> str:
    """A DNS-1123 name unique to this Trainer execution, the same when TFX retries it (so it re-attaches)."""
    return "trainer-" + hashlib.sha256(artifacts.absolute(model_run_dir).encode()).hexdigest()[:12]
