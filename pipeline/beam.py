"""The one place where `beam.*` config becomes Beam's pipeline arguments for every Beam-powered component."""
from __future__ import annotations

from pipeline.config import BeamConfig


def beam_pipeline_args(beam: BeamConfig, setup_file: str) -> list[str]:
    """Beam's command-line options for `beam.runner`, with `setup_file` naming the project's code for workers.

    Without a dependency flag TFX builds an sdist of itself before every Beam stage (seconds each); the setup file
    is also what remote workers (Dataflow, Flink and Spark SDK harnesses) install the project from.
    """
    args = [f"--runner={beam.runner}", f"--setup_file={setup_file}"]
    if beam.runner == "DirectRunner":
        args += [f"--direct_running_mode={beam.direct_running_mode}", f"--direct_num_workers={beam.direct_num_workers}"]
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
