"""The one place where `beam.*` config becomes Beam's pipeline arguments for every Beam-powered component."""
from __future__ import annotations

import json
import re

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
        flink = f"--job_endpoint={beam.job_endpoint}" if beam.job_endpoint else f"--flink_master={beam.flink_master}"
        endpoint = {"PortableRunner": f"--job_endpoint={beam.job_endpoint}",
                    "FlinkRunner": flink,
                    "SparkRunner": f"--spark_master_url={beam.spark_master_url}"}[beam.runner]
        args += [endpoint, f"--environment_type={beam.environment_type}"]
        if beam.environment_config:
            config = beam.environment_config
            # PROCESS takes Beam's JSON; a bare command (`mlops cluster flink status` prints one) becomes it.
            if beam.environment_type == "PROCESS" and not config.lstrip().startswith("{"):
                config = json.dumps({"command": config})
            args.append(f"--environment_config={config}")
        if beam.parallelism and beam.runner != "SparkRunner":
            args.append(f"--parallelism={beam.parallelism}")
    return args + list(beam.extra_args)


def job_failure(error: BaseException) -> str | None:
    """One line for a Beam job a portable runner (Flink, Spark, Beam's job service) reported failed, or None for
    any other error. Their message is the runner's whole Java stack trace, with the SDK worker's Python traceback
    inside it: the line that says what failed is the Python exception's own, else the first Java one."""
    text = str(error)
    match = re.match(r"Pipeline (\S+) failed in state (\w+): ", text)
    if match is None:
        return None
    lines = text[match.end():].splitlines()
    python = [index for index, line in enumerate(lines) if "Traceback (most recent call last):" in line]
    if python:
        after = lines[python[-1] + 1:]
        # A traceback's last unindented line is the exception; Java's "\tat ..." frames follow it.
        exception = next((line for line in after if line and not line[0].isspace()), None)
        if exception:
            return f"its Beam job {match[1]} failed on the runner: {exception.strip()}"
    first = next((line.strip() for line in lines if line.strip()), "no reason given")
    return f"its Beam job {match[1]} failed on the runner: {first}"
