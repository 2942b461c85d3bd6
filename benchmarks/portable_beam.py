"""The data stages through Beam's PortableRunner: Beam's own Python job service and an external SDK worker pool, each
a separate process, on 127.0.0.1 (the Fn API path Flink's and Spark's job servers use).

    .venv/bin/python -m benchmarks.portable_beam --rows 2000

Starts `apache_beam.runners.portability.local_job_service_main` and `apache_beam.runners.worker.worker_pool_main`
on free ports, runs `mlops run --data-only` with `beam.runner=PortableRunner`, `beam.environment_type=EXTERNAL`, and
checks that every Beam stage ran as a job of the job service on SDK workers the pool started, and that ExampleGen's
examples and Transform's graph came out. Prints the stage times; exits non-zero if anything is missing.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.measure import REPO
from pipeline.data import EMBEDDED_TAXI_DIR, write_slice


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.5)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {seconds:.0f}s")


@contextlib.contextmanager
def service(command: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.portable_beam", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="rows of the taxi sample to run on")
    parser.add_argument("--out", type=Path, default=None, help="working folder (default: a temporary one)")
    args = parser.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="portable-beam-"))
    work.mkdir(parents=True, exist_ok=True)
    write_slice(EMBEDDED_TAXI_DIR / "data.csv", work / "data", args.rows)
    # The pool starts each SDK worker as `python -c ...`: this environment's python, importing this checkout.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    job_port, pool_port = free_port(), free_port()
    with service([sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
                  "--port", str(job_port)], work / "job_service.log", env), \
            service([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                     "--service_port", str(pool_port)], work / "worker_pool.log", env):
        wait_for_port(job_port)
        wait_for_port(pool_port)
        command = [sys.executable, "-m", "pipeline.cli", "run", "--data-only",
                   "--set", f"data.path={work / 'data'}", "--set", f"output_root={work / 'outputs'}",
                   "--set", "beam.runner=PortableRunner", "--set", f"beam.job_endpoint=localhost:{job_port}",
                   "--set", "beam.environment_type=EXTERNAL", "--set", f"beam.environment_config=localhost:{pool_port}"]
        started = time.monotonic()
        result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
        seconds = time.monotonic() - started
    print(result.stdout)
    if result.returncode != 0:
        print(result.stderr[-4000:], file=sys.stderr)
        return result.returncode
    jobs = (work / "job_service.log").read_text().count("with state DONE")
    workers = (work / "worker_pool.log").read_text().count("Starting worker with command")
    root = work / "outputs" / "pipelines" / "taxi"
    checks = {
        "jobs the job service ran to DONE": jobs,
        "SDK worker processes the pool started": workers,
        "ExampleGen eval files": len(list(root.glob("CsvExampleGen/examples/*/Split-eval/*.gz"))),
        "Transform graphs": len(list(root.glob("Transform/transform_graph/*/transform_fn/saved_model.pb"))),
        "transformed train files": len(list(root.glob("Transform/transformed_examples/*/Split-train/*.gz"))),
    }
    for name, count in checks.items():
        print(f"  {name:<40}{count:>4}")
    [summary] = (work / "outputs" / "runs").glob("*/summary.json")
    print(f"  data stages in {seconds:.0f}s: {json.loads(summary.read_text())['stage_seconds']}\n  logs in {work}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
