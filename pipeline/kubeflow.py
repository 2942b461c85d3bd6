"""Kubeflow Pipelines V2: `create_pipeline(config)` compiled by TFX's KubeflowV2DagRunner, submitted with `kfp`.

The compiled pipeline runs every component in the project image (the Dockerfile), with the pipeline root and the
published versions below `kubeflow.output_root` (a bucket), the data at `kubeflow.data_path` and the schema and
Beam's setup.py inside the image. Two forms:

- `.yaml`: the pipeline spec that open-source Kubeflow Pipelines 2.x runs. That backend refuses resolver
  executors ("resolver executors not implemented"), so the baseline is read from the model repository by the
  ServingBaseline step (`evaluation.baseline: stable` or `published_blessed`; the ML Metadata rules become `stable`).
- `.json`: a Vertex AI PipelineJob: the repository baselines as they are, or TFX's LatestBlessedModelStrategy
  (`latest_blessed`) for the ML Metadata rules.

Both carry each task's resources, retries and caching from `kubeflow.*`, written as the kfp SDK writes them.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components import artifacts
from pipeline.data import EMBEDDED_TAXI_DIR
from pipeline.init.datasets import is_bundled
from settings.config import KubeflowTaskConfig, PipelineConfig, quantity
from settings.errors import UserError

# The Dockerfile's layout: the repository at WORKDIR, the locked environment in a virtualenv.
IMAGE_PROJECT_ROOT = "/app"
IMAGE_VENV = "/opt/venv"
IMAGE_SITE_PACKAGES = f"{IMAGE_VENV}/lib/python3.10/site-packages"
# What each form runs for an ML Metadata baseline rule (see the module docstring); the repository rules run as set.
MLMD_BASELINES = ("previous_blessed", "latest_blessed")
FORM_BASELINES = {".yaml": "stable", ".json": "latest_blessed"}
# Tasks whose output depends on more than their inputs: KFP must never reuse one.
UNCACHED_TASKS = ("ServingBaseline",)


class KubeflowError(UserError, ValueError):
    """The config or the command cannot make a Kubeflow pipeline; the message says what to set."""

    exit_code = 2


@dataclass
class CompiledPipeline:
    path: str
    pipeline_root: str
    image: str
    # Task name -> the tasks it depends on, as the compiled spec says.
    tasks: dict[str, list[str]]
    parameters: dict[str, Any]
    # What the compiler had to change in the config for this form, one sentence each.
    notes: list[str]
    # Task name -> the resources, retries and caching written for it (apply_task_settings).
    settings: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


def embedded_sample_in_image() -> str:
    """The Chicago taxi sample inside the image's tfx package."""
    import tfx

    site_packages = Path(tfx.__file__).resolve().parent.parent
    return f"{IMAGE_SITE_PACKAGES}/{Path(EMBEDDED_TAXI_DIR).resolve().relative_to(site_packages).as_posix()}"


def cluster_config(config: PipelineConfig, form: str) -> tuple[PipelineConfig, list[str]]:
    """The config as the cluster runs it: output_root, data and baseline for the `.yaml` or `.json` form."""
    settings = config.kubeflow
    if not settings.output_root or not artifacts.is_uri(settings.output_root):
        raise KubeflowError("kubeflow.output_root must be a bucket the cluster writes, for example "
                            f"gs://my-bucket/tfx-mlops; got {settings.output_root!r}.")
    if not settings.output_root.startswith("gs://"):
        # The Publisher writes <output_root>/serving: refused here, not after a whole run on the cluster.
        raise KubeflowError(f"kubeflow.output_root {settings.output_root} is not on gs://, the only object store "
                            "where the Publisher can publish model versions atomically (and TF Serving reads no "
                            "s3:// since 2.7); use a gs:// bucket.")
    if not settings.image:
        raise KubeflowError("kubeflow.image is empty; set it to the project image the cluster pulls.")
    if settings.data_path and not artifacts.is_uri(settings.data_path):
        raise KubeflowError(f"kubeflow.data_path {settings.data_path!r} is not a URI the cluster can read; give a "
                            "gs:// or s3:// folder of CSV files, or leave it empty for the sample in the image.")
    if is_bundled(config.data.path) and not settings.data_path:
        # The sample in the image is the taxi data; a bundled dataset is written by a local run, not in the cluster.
        raise KubeflowError(f"data.path {config.data.path} is written on this machine at run time, where the "
                            "cluster cannot read it; copy <output_root>/data/<name>/data.csv of a local run to a "
                            "bucket and set kubeflow.data_path to that folder.")
    notes = []
    baseline = config.evaluation.baseline
    allowed = FORM_BASELINES[form]
    if baseline in MLMD_BASELINES and baseline != allowed:
        notes.append(f"evaluation.baseline {baseline} -> {allowed}: " + (
            "open-source Kubeflow Pipelines runs no resolver node, so ServingBaseline compares with the version "
            f"labelled stable in {settings.output_root}/serving" if form == ".yaml" else
            "Vertex AI Pipelines runs only TFX's LatestBlessedModelStrategy of the ML Metadata resolvers"))
        baseline = allowed
    data = dataclasses.replace(config.data, path=settings.data_path or embedded_sample_in_image())
    evaluation = dataclasses.replace(config.evaluation, baseline=baseline)
    cluster = dataclasses.replace(config, output_root=settings.output_root, artifact_root="", data=data,
                                  evaluation=evaluation, enable_cache=settings.enable_cache)
    return cluster, notes


def task_settings(config: PipelineConfig, task: str) -> KubeflowTaskConfig:
    """kubeflow.tasks with what kubeflow.components sets for `task` over it."""
    settings = config.kubeflow
    own = settings.components.get(task)
    if own is None:
        return settings.tasks
    return KubeflowTaskConfig(**{
        field.name: value if (value := getattr(own, field.name)) not in ("", None) else getattr(settings.tasks,
                                                                                                 field.name)
        for field in dataclasses.fields(KubeflowTaskConfig)})


def _cpu_cores(value: str | float) -> float:
    text = quantity(value)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


# Memory units in the kfp SDK's float form (gigabytes).
_MEMORY_UNITS = {"": 1e-9, "K": 1e-6, "M": 1e-3, "G": 1.0, "T": 1e3, "P": 1e6, "E": 1e9,
                 "Ki": 1024 / 1e9, "Mi": 1024 ** 2 / 1e9, "Gi": 1024 ** 3 / 1e9, "Ti": 1024 ** 4 / 1e9,
                 "Pi": 1024 ** 5 / 1e9, "Ei": 1024 ** 6 / 1e9}


def _memory_gigabytes(value: str) -> float:
    number = value.rstrip("EPTGMKi")
    return float(number) * _MEMORY_UNITS[value[len(number):]]


def apply_task_settings(spec: dict[str, Any], config: PipelineConfig) -> dict[str, dict[str, Any]]:
    """Writes kubeflow.tasks and kubeflow.components into the compiled spec (in place): each container's resources
    (the string form KFP 2.x reads and the float form older backends read, as the kfp SDK writes both), each task's
    retry policy and caching. Returns task name -> the settings written."""
    tasks = spec["root"]["dag"]["tasks"]
    unknown = sorted(set(config.kubeflow.components) - set(tasks))
    if unknown:
        raise KubeflowError(f"kubeflow.components names {', '.join(unknown)}, which this pipeline does not have; "
                            f"use a component of {', '.join(sorted(tasks))}.")
    executors = spec["deploymentSpec"]["executors"]
    written = {}
    for name, task in tasks.items():
        label = spec["components"][task["componentRef"]["name"]].get("executorLabel", "")
        container = executors.get(label, {}).get("container")
        if container is None:
            continue  # an importer or resolver of the .json form: no container to size
        settings = task_settings(config, name)
        resources = {}
        for key, spec_key in (("cpu_request", "CpuRequest"), ("cpu_limit", "CpuLimit")):
            if (value := getattr(settings, key)) != "":
                resources[f"resource{spec_key}"] = quantity(value)
                resources[spec_key[0].lower() + spec_key[1:]] = _cpu_cores(value)
        for key, spec_key in (("memory_request", "MemoryRequest"), ("memory_limit", "MemoryLimit")):
            if value := getattr(settings, key):
                resources[f"resource{spec_key}"] = value
                resources[spec_key[0].lower() + spec_key[1:]] = _memory_gigabytes(value)
        if resources:
            container["resources"] = resources
        if settings.retries:
            backoff = settings.retry_backoff_seconds if settings.retry_backoff_seconds is not None else 60
            task["retryPolicy"] = {"maxRetryCount": settings.retries, "backoffDuration": f"{backoff}s",
                                   "backoffFactor": 2.0, "backoffMaxDuration": "3600s"}
        cache = config.kubeflow.enable_cache and name not in UNCACHED_TASKS
        # Off is proto3's default, which the kfp client drops on submit: written as it arrives.
        task["cachingOptions"] = {"enableCache": True} if cache else {}
        written[name] = {"resources": resources, "retries": settings.retries or 0, "cache": cache}
    return written


def runtime_parameters(tfx_pipeline: Any) -> dict[str, Any]:
    """Name -> default of every RuntimeParameter in the pipeline's components."""
    from tfx.orchestration import data_types

    found = {}
    for node in tfx_pipeline.components:
        for value in node.exec_properties.values():
            if isinstance(value, data_types.RuntimeParameter):
                found[value.name] = value.default
    return found


def compile_pipeline(config: PipelineConfig, output: str) -> CompiledPipeline:
    """Writes the compiled pipeline to `output` (.yaml: KFP pipeline spec; .json: Vertex AI PipelineJob)."""
    from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner

    from pipeline.pipeline import Deployment, create_pipeline

    form = os.path.splitext(output)[1].lower()
    form = ".yaml" if form == ".yml" else form
    if form not in FORM_BASELINES:
        raise KubeflowError(f"--output {output} must end in .yaml (open-source Kubeflow Pipelines) or .json "
                            "(a Vertex AI PipelineJob).")
    cluster, notes = cluster_config(config, form)
    tfx_pipeline = create_pipeline(cluster, Deployment(project_root=IMAGE_PROJECT_ROOT, local=False))
    defaults = runtime_parameters(tfx_pipeline)
    runner = kubeflow_v2_dag_runner.KubeflowV2DagRunner(
        # Schema 2.1 is what the kfp 2 SDK and backend speak (parameterType); TFX's 2.0 form cannot even be
        # written as YAML once the pipeline has runtime parameters.
        config=kubeflow_v2_dag_runner.KubeflowV2DagRunnerConfig(
            display_name=config.name, default_image=config.kubeflow.image, use_pipeline_spec_2_1=True),
    )
    job = runner.run(tfx_pipeline, parameter_values=defaults, write_out=False)
    spec = job["pipelineSpec"]
    # TFX puts the defaults only into the PipelineJob's runtime config; the spec itself (all that KFP reads from
    # the .yaml) carries them the way the kfp SDK writes them.
    for name, parameter in spec["root"].get("inputDefinitions", {}).get("parameters", {}).items():
        parameter["defaultValue"] = defaults[name]
        parameter["isOptional"] = True
    settings = apply_task_settings(spec, config)
    _write(job, output, form)
    tasks = {name: sorted(task.get("dependentTasks", [])) for name, task in spec["root"]["dag"]["tasks"].items()}
    return CompiledPipeline(output, tfx_pipeline.pipeline_info.pipeline_root, config.kubeflow.image, tasks, defaults,
                            notes, settings)


def _write(job: dict[str, Any], output: str, form: str) -> None:
    import json

    import yaml

    folder = os.path.dirname(os.path.abspath(output))
    os.makedirs(folder, exist_ok=True)
    with open(output, "w") as f:
        if form == ".json":
            json.dump(job, f, indent=1, sort_keys=True)
            return
        name = job["pipelineSpec"]["pipelineInfo"]["name"]
        f.write(f"# PIPELINE DEFINITION\n# Name: {name}\n# Compiled by mlops compile kubeflow with "
                f"{job['pipelineSpec']['sdkVersion']}; submit with mlops submit kubeflow or the KFP UI.\n")
        yaml.safe_dump(job["pipelineSpec"], f, sort_keys=True)


def submit(package: str, host: str, experiment: str, run_name: str, arguments: dict[str, Any], namespace: str = "",
           client_factory: Callable[..., Any] | None = None) -> tuple[str, str]:
    """Starts a run of the compiled `package` (.yaml) on the KFP API at `host`; returns (run id, run link)."""
    if not package.endswith((".yaml", ".yml")):
        raise KubeflowError(f"{package} is not a KFP pipeline spec; open-source Kubeflow Pipelines takes the .yaml "
                            "form of mlops compile kubeflow (the .json form is for Vertex AI).")
    if not host:
        raise KubeflowError("no KFP API to submit to: pass --host http://... (or set kubeflow.host).")
    if client_factory is None:
        import kfp

        client_factory = kfp.Client
    client = client_factory(host=host, namespace=namespace or "kubeflow")
    result = client.create_run_from_pipeline_package(
        package, arguments=arguments, run_name=run_name, experiment_name=experiment,
        namespace=namespace or None,
    )
    return result.run_id, f"{host.rstrip('/')}/#/runs/details/{result.run_id}"


def compile_to_temporary(config: PipelineConfig, folder: str | None = None) -> str:
    """Compiles the .yaml form into a temporary file (for submit without --package); returns its path."""
    folder = folder or tempfile.mkdtemp(prefix="kfp-")
    return compile_pipeline(config, os.path.join(folder, f"{config.name}.yaml")).path
