"""The one place where `beam.*` config becomes Beam's pipeline arguments for every Beam-powered component."""
from __future__ import annotations

from settings.config import BeamConfig


def direct_running_mode(beam: BeamConfig, rows: int | None) -> str:
    """The DirectRunner's mode: `beam.direct_running_mode`, or for `auto` in_memory when the input's `rows` are
    known and at most `beam.in_memory_max_rows` (worker processes cost more to start than they save), else
    multi_processing."""
    if beam.direct_running_mode != "auto":
        return beam.direct_running_mode
    return "in_memory" if rows is not None and rows <= beam.in_memory_max_rows else "multi_processing"


def beam_pipeline_args(beam: BeamConfig, setup_file: str, rows: int | None = None) -> list[str]:
    """Beam's command-line options for `beam.runner`, with `setup_file` naming the project's code for workers and
    `rows` the input's data rows where known (the DirectRunner's `auto` mode chooses by them).

    Without a dependency flag TFX builds an sdist of itself before every Beam stage (seconds each); the setup file
    is also what remote workers (Dataflow, Flink and Spark SDK harnesses) install the project from.
    """
    args = [f"--runner={beam.runner}", f"--setup_file={setup_file}"]
    if beam.runner == "DirectRunner":
        mode = direct_running_mode(beam, rows)
        # in_memory runs every bundle in this process: more workers only split each bundle into parts run on
        # threads under one GIL (Beam warns so), which cost the taxi job's data stages 7 of 36 s.
        workers = 1 if mode == "in_memory" else beam.direct_num_workers
        args += [f"--direct_running_mode={mode}", f"--direct_num_workers={workers}"]
    elif beam.runner == "DataflowRunner":
        args += [f"--project={beam.project}", f"--region={beam.region}", f"--temp_location={beam.temp_location}"]
        if beam.sdk_container_image:
            args.append(f"--sdk_container_image={beam.sdk_container_image}")
    else:
        endpoint = {"PortableRunner": f"--job_endpoint={beam.job_endpoint}",
                    "FlinkRunner": f"--flink_master={beam.flink_master}",
                    "SparkRunner": f"--spark_master_url={beam.spark_master_url}"}[beam.runner]
        args += [endpoint, f"--environment_type={beam.environment_type}"]
        if beam.environment_config:
            args.append(f"--environment_config={beam.environment_config}")
        if beam.parallelism and beam.runner != "SparkRunner":
            args.append(f"--parallelism={beam.parallelism}")
    return args + list(beam.extra_args)
