"""The Trainer executor for `training.workers` > 1 or `training.backend: tfjob`; thin on purpose.

It builds FnArgs exactly as TFX's GenericExecutor does, writes them as a WorkerSpec, and hands the spec to
`run_distributed_training`, which the `mlops train` command calls too. With one local worker it is TFX's own
executor: run_fn runs in the Trainer's process, as before distributed training existed.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from absl import logging
from tfx import types
from tfx.components.trainer.executor import GenericExecutor
from tfx.components.util import tfxio_utils
from tfx.dsl.io import fileio
from tfx.types import standard_component_specs
from tfx.utils import json_utils

from components.distributed.launcher import LineSink, launch_local_workers
from components.distributed.layout import workers_dir
from components.distributed.spec import WorkerSpec, spec_from_fn_args

# Where the worker processes import `components` from: this checkout.
REPO_ROOT = str(Path(__file__).resolve().parents[2])


def run_distributed_training(
    spec: WorkerSpec,
    training: dict[str, Any],
    job_name: str,
    on_line: LineSink,
    repo_root: str = REPO_ROOT,
    tfjob_api: Any = None,
) -> str:
    """Runs `spec` on `training['workers']` workers (locally or as a TFJob) and returns where the logs are.

    `training` is the `training` section of the module config; `tfjob_api` a kubernetes CustomObjectsApi (made
    from training.tfjob.kubeconfig when None). Raises WorkerFailedError or TFJobFailedError.
    """
    work_dir = workers_dir(spec.model_run_dir)
    try:
        return _run(spec, training, job_name, on_line, repo_root, work_dir, tfjob_api)
    finally:
        # A worker killed mid-training could not remove its scratch folder; the job is over now.
        shutil.rmtree(os.path.join(work_dir, "scratch"), ignore_errors=True)


def _run(spec: WorkerSpec, training: dict[str, Any], job_name: str, on_line: LineSink, repo_root: str,
         work_dir: str, tfjob_api: Any) -> str:
    if training["backend"] == "tfjob":
        from components.distributed.tfjob import KUBEDL_MODEL_MOUNT, build_tfjob, custom_objects_api, run_tfjob

        settings = training["tfjob"]
        if settings["model_version_name"]:
            spec.copy_model_to = KUBEDL_MODEL_MOUNT
        spec_path = spec.save(os.path.join(work_dir, "spec.json"))
        job = build_tfjob(job_name, spec_path, training["workers"], settings)
        api = tfjob_api if tfjob_api is not None else custom_objects_api(settings["kubeconfig"])
        run_tfjob(api, job, settings["poll_seconds"], settings["active_deadline_seconds"],
                  lambda line: on_line(-1, line))
        return f"TFJob {settings['namespace']}/{job_name}"
    spec_path = spec.save(os.path.join(work_dir, "spec.json"))
    result = launch_local_workers(spec_path, training["workers"], repo_root, work_dir,
                                  max_restarts=training["max_restarts"], on_line=on_line)
    return result.log_dir


def _log_line(index: int, line: str) -> None:
    if index < 0:
        logging.info("[tfjob] %s", line)
    else:
        logging.info("[worker %d] %s", index, line)


class DistributedTrainerExecutor(GenericExecutor):
    """TFX Trainer executor that runs the module's run_fn on N workers (local processes or a TFJob)."""

    def Do(
        self,
        input_dict: dict[str, list[types.Artifact]],
        output_dict: dict[str, list[types.Artifact]],
        exec_properties: dict[str, Any],
    ) -> None:
        custom_config = json_utils.loads(exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY, "null"))
        training = (custom_config or {}).get("training", {})
        if training.get("backend", "local") == "local" and training.get("workers", 1) == 1:
            return super().Do(input_dict, output_dict, exec_properties)

        self._log_startup(input_dict, output_dict, exec_properties)
        run_fn = exec_properties.get(standard_component_specs.RUN_FN_KEY)
        if not run_fn:
            raise ValueError("distributed training needs the Trainer's run_fn as a dotted path "
                             "(run_fn='components.model.run_fn'), not a module_file.")
        fn_args = self._GetFnArgs(input_dict, output_dict, exec_properties)
        payload_format, data_view_uri = tfxio_utils.resolve_payload_format_and_data_view_uri(
            input_dict[standard_component_specs.EXAMPLES_KEY]
        )
        spec = spec_from_fn_args(fn_args, run_fn, payload_format, data_view_uri)
        job_name = tfjob_name(fn_args.model_run_dir)
        logging.info("training on %d workers (%s backend)", training["workers"], training["backend"])
        where = run_distributed_training(spec, training, job_name, _log_line)
        if not fileio.exists(fn_args.serving_model_dir):
            raise RuntimeError(f"the chief worker wrote no model to {fn_args.serving_model_dir}; see {where}.")
        logging.info("Training complete. Model written to %s; worker logs in %s", fn_args.serving_model_dir, where)


def tfjob_name(model_run_dir: str) -> str:
    """A DNS-1123 name unique to this Trainer execution, the same when TFX retries it (so it re-attaches)."""
    return "trainer-" + hashlib.sha256(os.path.abspath(model_run_dir).encode()).hexdigest()[:12]
