"""The Python SDK worker that Beam's PROCESS environment starts on a Flink TaskManager, from this project's environment:
what the SDK container's `boot` program does (sdks/python/container/boot.go in apache/beam: ask the provision service
for the pipeline options, then run apache_beam.runners.worker.sdk_worker_main), less installing staged packages, since
this environment already holds the project and requirements.lock.

Each TaskManager starts its own workers (a shared EXTERNAL worker pool keys workers by an id both TaskManagers reuse,
so one TaskManager's stop ends the other's worker: apache_beam/runners/worker/worker_pool_main.py).
"""
from __future__ import annotations

import argparse
import os
import sys

import grpc
from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc, endpoints_pb2
from google.protobuf import json_format, text_format


def worker_environment(args: argparse.Namespace) -> dict[str, str]:
    """sdk_worker_main's environment variables, from the provision service's answer for this worker."""
    with grpc.insecure_channel(args.provision_endpoint) as channel:
        info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
            beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", args.id)]).info

    def descriptor(url: str) -> str:
        return text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url))

    return {
        "WORKER_ID": args.id,
        "PIPELINE_OPTIONS": json_format.MessageToJson(info.pipeline_options),
        "CONTROL_API_SERVICE_DESCRIPTOR": descriptor(info.control_endpoint.url or args.control_endpoint),
        "LOGGING_API_SERVICE_DESCRIPTOR": descriptor(info.logging_endpoint.url or args.logging_endpoint),
        "RUNNER_CAPABILITIES": " ".join(info.runner_capabilities),
        "SEMI_PERSISTENT_DIRECTORY": args.semi_persistent_directory,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--id", required=True)
    parser.add_argument("--provision_endpoint", required=True)
    parser.add_argument("--control_endpoint", default="")
    parser.add_argument("--logging_endpoint", default="")
    parser.add_argument("--artifact_endpoint", default="")
    parser.add_argument("--semi_persistent_directory", default="/tmp")
    args, _ = parser.parse_known_args(argv)
    env = {**os.environ, **worker_environment(args)}
    os.execve(sys.executable, [sys.executable, "-m", "apache_beam.runners.worker.sdk_worker_main"], env)


if __name__ == "__main__":
    main()
