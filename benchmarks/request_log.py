"""Request logging's cost, as CPU per request of every process on the path: `mlops serve` without logging, with
its own logger at 100% and 10% sampling, and the Kubernetes log proxy (`mlops log-proxy`, the sidecar of every
serving pod) in front of the server without logging, logging 100% and not logging; REST and gRPC, 1 and 16 clients,
side by side in one run.

Three servers and two proxies run at once (`python -m serving.cli serve` / `log-proxy`), on the same model; every
repeat measures each path in turn, the order rotated from one repeat to the next, so that a machine that gets busier
or quieter during the run weighs on them alike. The clients are serving_benchmark.py's (client processes, one
keep-alive connection each, the same pre-built single-row request as fast as they can). Each cell shows the median of
its repeats: requests/s and its spread, p50/p99, and the CPU seconds per 1,000 requests of the server and of the
proxy, read from /proc (benchmarks/cpu_per_request.py), which the machine's other load moves far less than
throughput. Also: what the loggers did (records written, dropped because the queue was full, failed), the targets of
issue 45 (logging at 100% adds at most 10% CPU per request), and where the proxy and the server saturate at the CPU
limits of k8s/serving/base. Writes request_log.{json,md,png} to --out.

Without --model-base-path the model is a stand-in with the taxi model's 15 raw inputs (6 float, 7 integer, 2 string,
one row per request) and almost no compute, so logging's share of a request is larger than with the trained model.

    .venv/bin/python benchmarks/request_log.py
    .venv/bin/python benchmarks/request_log.py --model-base-path outputs/serving/taxi --model-name taxi
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.cpu_per_request import added, requests_per_s_at  # noqa: E402 - after the path
from benchmarks.serving_benchmark import (  # noqa: E402 - after the path that makes it importable
    ServerProcess,
    _send_once,
    first_rows,
    grpc_body,
    load_signature,
    plot_cpu_per_1000,
    rest_body,
    run_clients,
)

# The paths a request takes: the server itself without and with its request logger (`mlops serve`, as
# `mlops deploy local` runs it), and the log proxy (the Kubernetes sidecar) in front of the server without logging.
OFF, IN_SERVER_100, PROXY_100, PROXY_OFF = "server, no logging", "server logging 100%", "log proxy 100%", \
    "log proxy, logging off"
SERVER_MODES = [(OFF, None), (IN_SERVER_100, 1.0), ("server logging 10%", 0.1)]
PROXY_MODES = [(PROXY_100, 1.0), (PROXY_OFF, None)]
SERVER, PROXY = "server", "log proxy"
# Issue 45: request logging at 100% sampling adds at most 10% CPU per request.
LOGGING_TARGET = 0.10
DEPLOYMENT = REPO / "k8s" / "serving" / "base" / "deployment-stable.yaml"
# What one log proxy process can use, whatever its limit: its REST and gRPC front ends run in one event loop thread
# and its writer thread takes the same GIL.
PROXY_PROCESS_CPUS = 1.0
# The taxi model's raw inputs (pipeline/configs/taxi.yaml, taxi_schema.pbtxt), by the dtype its signature takes.
TAXI_FLOATS = ["fare", "trip_miles", "pickup_latitude", "pickup_longitude", "dropoff_latitude", "dropoff_longitude"]
TAXI_INTEGERS = ["trip_seconds", "trip_start_hour", "trip_start_day", "trip_start_month", "pickup_community_area",
                 "dropoff_community_area", "dropoff_census_tract"]
TAXI_STRINGS = ["payment_type", "company"]


def save_taxi_shaped_model(export_dir: Path) -> Path:
    """A SavedModel taking the taxi model's raw inputs (one tensor of shape [batch] each) -> `probabilities`."""
    import tensorflow as tf

    specs = ([tf.TensorSpec([None], tf.float32, name=n) for n in TAXI_FLOATS]
             + [tf.TensorSpec([None], tf.int64, name=n) for n in TAXI_INTEGERS]
             + [tf.TensorSpec([None], tf.string, name=n) for n in TAXI_STRINGS])
    module = tf.Module()

    @tf.function(input_signature=specs)
    def serve(*tensors):
        floats = tf.add_n([tf.where(tf.math.is_nan(t), tf.zeros_like(t), t) for t in tensors[:len(TAXI_FLOATS)]])
        integers = tf.add_n([tf.cast(t, tf.float32) for t in tensors[len(TAXI_FLOATS):-len(TAXI_STRINGS)]])
        cash = tf.cast(tf.equal(tensors[-2], "Cash"), tf.float32)
        return {"probabilities": tf.sigmoid(0.01 * floats + 0.001 * integers - cash)}

    tf.saved_model.save(module, str(export_dir / "1"), signatures={"serving_default": serve})
    return export_dir


def log_counts(rest_target: str, model: str) -> dict[str, float]:
    from rollout.metrics import parse_prometheus_text
    from serving.server.monitoring import REQUEST_LOG_COUNT

    with urllib.request.urlopen(f"http://{rest_target}/monitoring/prometheus/metrics", timeout=10) as page:
        samples = parse_prometheus_text(page.read().decode())
    return {s.labels["status"]: s.value for s in samples
            if s.name == REQUEST_LOG_COUNT and s.labels.get("model_name") == model}


def writer_cost_us(scratch: Path, model: str, inputs: dict, request: bytes, response: bytes,
                   records: int = 5000) -> dict[str, float]:
    """CPU microseconds per record the request logger spends in this process (request path and writer thread
    together, from the process's CPU time), for a REST prediction (built from its arrays) and a gRPC one (its bytes):
    what the load cells' throughput would lose on a machine whose other load does not blur it."""
    import functools
    import time

    import numpy as np

    from serving.server.request_log import LoggedPrediction, RequestLogger, predict_messages_from_arrays
    from settings.config import RequestLogConfig

    outputs = {"probabilities": np.array([0.25], np.float32)}
    builds = {
        "rest": functools.partial(predict_messages_from_arrays, model, None, None, 1, "serving_default", inputs,
                                  outputs),
        "grpc": lambda: LoggedPrediction(1, "serving_default", request, response),
    }
    costs = {}
    for transport, build in builds.items():
        logger = RequestLogger(RequestLogConfig(enabled=True, queue_size=records), str(scratch / f"cost-{transport}"))
        started = time.process_time()
        for _ in range(records):
            if logger.sample():
                logger.submit(model, build)
        logger.flush(120)
        costs[transport] = 1e6 * (time.process_time() - started) / records
        logger.close()
    return costs


def median_cell(runs: list[dict]) -> dict:
    rates = [r["requests_per_s"] for r in runs]
    middle = statistics.median(rates)
    return {"requests_per_s": middle, "spread": (max(rates) - min(rates)) / middle if middle else 0.0,
            "p50_ms": statistics.median(r["p50_ms"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs),
            "cpu_s_per_1000": {role: statistics.median(r["cpu_s_per_1000"][role] for r in runs)
                               for role in runs[0]["cpu_s_per_1000"]},
            "cores_used": {role: statistics.median(r["cores_used"][role] for r in runs)
                           for role in runs[0]["cores_used"]},
            "requests": sum(r["requests"] for r in runs),
            "machine_busy": statistics.median(r["machine_busy"] for r in runs),
            "errors": sum(r["errors"] for r in runs), "rates": rates}


def logging_target_lines(cells: dict) -> list[str]:
    """Issue 45's logging target, per transport and number of clients: logging every prediction adds at most 10% CPU
    per request, in the server (`mlops serve`) and as Kubernetes runs it (the log proxy in front of the server, both
    processes counted, against the server alone). The proxy's own logging (its CPU with logging on less with it off)
    tells forwarding from logging."""
    lines = []
    for (transport, clients, mode), cell in cells.items():
        if mode not in (IN_SERVER_100, PROXY_100):
            continue
        off = cells[(transport, clients, OFF)]
        share = added(cell["cpu_s_per_1000"], off["cpu_s_per_1000"])
        parts = " + ".join(f"{role} {cost:.3f}" for role, cost in cell["cpu_s_per_1000"].items())
        lines.append(f"  {transport} x{clients} {mode}: {100 * share:+.1f}% CPU per request ({parts} s per 1,000, "
                     f"against {sum(off['cpu_s_per_1000'].values()):.3f} without logging) (target at most "
                     f"+{100 * LOGGING_TARGET:.0f}%: {'met' if share <= LOGGING_TARGET else 'MISSED'})")
        forwarding = cells.get((transport, clients, PROXY_OFF))
        if mode == PROXY_100 and forwarding is not None:
            logging_part = cell["cpu_s_per_1000"][PROXY] - forwarding["cpu_s_per_1000"][PROXY]
            lines.append(f"    of which the proxy's forwarding {forwarding['cpu_s_per_1000'][PROXY]:.3f} "
                         f"(logging off) and its logging {logging_part:+.3f} s per 1,000 "
                         f"({100 * logging_part / sum(off['cpu_s_per_1000'].values()):+.1f}% of the server's)")
    return lines


def container_cpu_limits(deployment: Path = DEPLOYMENT) -> dict[str, float]:
    """container name -> its CPU limit in CPUs, from a Deployment's manifest (k8s/serving/base)."""
    import yaml

    manifest = yaml.safe_load(deployment.read_text())
    limits = {}
    for container in manifest["spec"]["template"]["spec"]["containers"]:
        quantity = str(container["resources"]["limits"]["cpu"])
        limits[container["name"]] = float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    return limits


def saturation_lines(cells: dict, limits: Mapping[str, float]) -> list[str]:
    """Where the log proxy and the server each saturate, from their CPU per request at the most clients: the proxy
    at 1 CPU and at what it can use (its Kubernetes limit, at most one process's CPU), the server at its limit
    (`mlops serve` standing for TF Serving, whose binary no package here installs)."""
    lines = []
    proxy_limit, server_limit = min(limits["log-proxy"], PROXY_PROCESS_CPUS), limits["tfserving"]
    for (transport, clients, mode), cell in cells.items():
        if mode != PROXY_100 or clients != max(c for _, c, _ in cells):
            continue
        proxy, server = cell["cpu_s_per_1000"][PROXY], cell["cpu_s_per_1000"][SERVER]
        proxy_at_limit = requests_per_s_at(proxy, proxy_limit)
        server_at_limit = requests_per_s_at(server, server_limit)
        lines.append(
            f"  {transport} x{clients}: log proxy {requests_per_s_at(proxy, 1):.0f} requests/s at 1 CPU, "
            f"{proxy_at_limit:.0f}/s at the {proxy_limit:g} CPU it can use (limit {limits['log-proxy']:g}); server "
            f"{requests_per_s_at(server, 1):.0f}/s at 1 CPU, {server_at_limit:.0f}/s at its limit of "
            f"{server_limit:g}; the proxy needs "
            f"{server_limit * proxy / server:.2f} CPU not to saturate first "
            f"({'it does not' if proxy_at_limit >= server_at_limit else 'it SATURATES FIRST'}); in this run the "
            f"proxy kept {cell['cores_used'][PROXY]:.2f} CPU busy at {cell['requests_per_s']:.0f} requests/s")
    return lines


def format_table(cells: dict, counts: dict, writer_us: dict[str, float], limits: Mapping[str, float]) -> str:
    lines = ["| transport | clients | path | requests/s | spread | p50 ms | p99 ms | server CPU s / 1,000 requests "
             "| log proxy CPU s / 1,000 requests | path CPU s / 1,000 requests | log proxy CPUs busy | machine busy "
             "| errors |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (transport, clients, mode), cell in cells.items():
        cost, busy = cell["cpu_s_per_1000"], cell["cores_used"]
        proxy = f"{cost[PROXY]:.3f}" if PROXY in cost else "-"
        proxy_busy = f"{busy[PROXY]:.2f}" if PROXY in busy else "-"
        lines.append(f"| {transport} | {clients} | {mode} | {cell['requests_per_s']:.0f} | {100 * cell['spread']:.0f}% "
                     f"| {cell['p50_ms']:.2f} | {cell['p99_ms']:.2f} | {cost[SERVER]:.3f} | {proxy} "
                     f"| {sum(cost.values()):.3f} | {proxy_busy} | {100 * cell['machine_busy']:.0f}% "
                     f"| {cell['errors']} |")
    lines += ["", "| request logging | records written | dropped (queue full) | failed |", "|---|---:|---:|---:|"]
    for mode, found in counts.items():
        lines.append(f"| {mode} | {found.get('written', 0):.0f} | {found.get('dropped', 0):.0f} "
                     f"| {found.get('failed', 0):.0f} |")
    lines += ["", f"targets (CPU per request, against the server without logging; logging at most "
                  f"+{100 * LOGGING_TARGET:.0f}%):", *logging_target_lines(cells)]
    lines += ["", "where each saturates (CPU limits of k8s/serving/base/deployment-stable.yaml):",
              *saturation_lines(cells, limits)]
    lines += ["", "throughput against logging off (noisy on a shared machine; CPU per request above is not):"]
    for (transport, clients, mode), on in cells.items():
        if mode == OFF:
            continue
        off = cells[(transport, clients, OFF)]
        lines.append(f"  {transport} x{clients} {mode}: throughput {on['requests_per_s'] / off['requests_per_s']:.3f}x "
                     f"({on['requests_per_s']:.0f} vs {off['requests_per_s']:.0f}/s), p99 "
                     f"{on['p99_ms']:.2f} vs {off['p99_ms']:.2f} ms")
    lines += ["", "the logger's own CPU per record (in this process, no server around it):"]
    for transport in ("rest", "grpc"):
        lines.append(f"  {transport}: {writer_us[transport]:.1f} us per record")
    return "\n".join(lines)


def plot(cells: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{transport} x{clients}\n" + mode.replace(", ", "\n").replace(" ", "\n", 1)
              for transport, clients, mode in cells]
    figure, (rate_axis, cpu_axis) = plt.subplots(2, 1, figsize=(16, 10))
    rate_axis.bar(range(len(cells)), [c["requests_per_s"] for c in cells.values()],
                  color=["tab:blue" if t == "rest" else "tab:orange" for t, _, _ in cells])
    for index, cell in enumerate(cells.values()):
        rate_axis.annotate(f"p50 {cell['p50_ms']:.1f}\np99 {cell['p99_ms']:.1f} ms", (index, cell["requests_per_s"]),
                           ha="center", va="bottom", fontsize=7)
    rate_axis.set_xticks(range(len(cells)), labels, fontsize=7)
    rate_axis.set_ylabel("requests/s (median of repeats)")
    rate_axis.set_title("request logging: REST (blue) and gRPC (orange), single-row requests")
    plot_cpu_per_1000(cpu_axis, labels, [c["cpu_s_per_1000"] for c in cells.values()],
                      "CPU per request of each process on the path (server, log proxy)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


class LogProxyProcess:
    """`python -m serving.cli log-proxy` (the Kubernetes sidecar) on free loopback ports, in front of `server`."""

    def __init__(self, server: ServerProcess, extra: list[str]) -> None:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "log-proxy", "--rest-port", "0", "--grpc-port", "0",
             "--upstream-rest", server.rest_target, "--upstream-grpc", server.grpc_target, *extra],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        line = self.process.stdout.readline()
        if not line.startswith("proxying REST on"):
            self.stop()
            self.stderr.seek(0)
            raise RuntimeError(f"the log proxy did not start: {line!r}\n{self.stderr.read().decode()[-3000:]}")
        words = line.split()  # proxying REST on <url> to <upstream> and gRPC on <target> to ...
        self.rest_target = words[3].removeprefix("http://")
        self.grpc_target = words[9]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def logging_flags(rate: float, directory: Path) -> list[str]:
    return ["--set", "serving.request_log.enabled=true", "--set", f"serving.request_log.sampling_rate={rate}",
            "--set", f"serving.request_log.directory={directory}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-base-path", type=Path, help="folder of <integer version>/ SavedModels (default: a "
                                                              "stand-in with the taxi model's inputs)")
    parser.add_argument("--model-name", default="taxi")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each cell's run (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each cell; medians are shown (default 3)")
    parser.add_argument("--clients", default="1,16", help="concurrent clients of each cell (default 1,16)")
    parser.add_argument("--client-processes", type=int, default=4, help="processes the clients are spread over")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "benchmarks")
    args = parser.parse_args()
    client_counts = [int(c) for c in args.clients.split(",")]

    import grpc

    from pipeline.data import EMBEDDED_TAXI_DIR
    from serving.clients import rows_to_columns
    from serving.repository.base import list_versions

    scratch = Path(tempfile.mkdtemp(prefix="request_log_benchmark_"))
    base_path = (args.model_base_path or save_taxi_shaped_model(scratch / "model")).resolve()
    signature = load_signature(base_path / str(list_versions(base_path)[-1]))
    one_row = rows_to_columns(first_rows(EMBEDDED_TAXI_DIR / "data.csv", 1), signature.inputs,
                              drop_unknown_features=True)
    path = f"/v1/models/{args.model_name}:predict"
    (scratch / "rest.req").write_bytes(rest_body(one_row))
    (scratch / "grpc.req").write_bytes(grpc_body(one_row, signature, args.model_name))

    servers: dict[str, ServerProcess] = {}
    proxies: dict[str, LogProxyProcess] = {}
    # mode -> (REST and gRPC targets the clients call, role -> pid of each process on the path)
    paths: dict[str, tuple[dict[str, str], dict[str, int]]] = {}
    try:
        for mode, rate in SERVER_MODES:
            extra = [] if rate is None else logging_flags(rate, scratch / "logs" / str(rate))
            servers[mode] = server = ServerProcess(REPO, base_path, args.model_name, extra)
            paths[mode] = ({"rest": server.rest_target, "grpc": server.grpc_target}, {SERVER: server.process.pid})
        for mode, rate in PROXY_MODES:  # in front of the server without logging, as the sidecar is of TF Serving
            extra = [] if rate is None else logging_flags(rate, scratch / "proxy-logs" / str(rate))
            proxies[mode] = proxy = LogProxyProcess(servers[OFF], extra)
            paths[mode] = ({"rest": proxy.rest_target, "grpc": proxy.grpc_target},
                           {PROXY: proxy.process.pid, SERVER: servers[OFF].process.pid})
        for targets, _ in paths.values():  # the first calls trace the model: not measured
            for transport, target in targets.items():
                for _ in range(3):
                    _send_once(transport, target, path, str(scratch / f"{transport}.req"))
        modes = list(paths)
        runs: dict[tuple[str, int, str], list[dict]] = {(t, c, m): [] for t in ("rest", "grpc")
                                                         for c in client_counts for m in modes}
        load_before = os.getloadavg()[0]
        for repeat in range(args.repeats):
            order = modes[repeat % len(modes):] + modes[:repeat % len(modes)]
            for transport, clients in ((t, c) for t in ("rest", "grpc") for c in client_counts):
                for mode in order:
                    targets, pids = paths[mode]
                    group = {"transport": transport, "clients": clients, "path": path, "target": targets[transport],
                             "request_file": str(scratch / f"{transport}.req"), "processes": args.client_processes}
                    [result] = run_clients([group], args.seconds, pids)
                    runs[(transport, clients, mode)].append(result)
                    print(f"repeat {repeat + 1} {transport:4} x{clients:2} {mode:24}: "
                          f"{result['requests_per_s']:6.0f} req/s p50 {result['p50_ms']:6.2f} ms p99 "
                          f"{result['p99_ms']:6.2f} ms CPU s per 1,000 requests: "
                          + ", ".join(f"{role} {cost:.3f}" for role, cost in result["cpu_s_per_1000"].items())
                          + f" (machine busy {100 * result['machine_busy']:.0f}%)", flush=True)
        counts = {mode: log_counts(paths[mode][0]["rest"], args.model_name)
                  for mode, rate in [*SERVER_MODES, *PROXY_MODES] if rate is not None}
        with grpc.insecure_channel(servers[OFF].grpc_target) as channel:
            answer = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")(
                (scratch / "grpc.req").read_bytes(), timeout=30)
    finally:
        for proxy in proxies.values():
            proxy.stop()
        for server in servers.values():
            server.stop()
    cells = {key: median_cell(value) for key, value in runs.items()}
    writer_us = writer_cost_us(scratch, args.model_name, one_row, (scratch / "grpc.req").read_bytes(), answer)
    limits = container_cpu_limits()
    table = format_table(cells, counts, writer_us, limits)
    note = (f"model: {base_path}; {args.repeats} repeat(s) of {args.seconds:g} s per cell; load average before/after: "
            f"{load_before:.2f}/{os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs shared by the server, the proxy and "
            "the clients")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "request_log.json").write_text(json.dumps({
        "cells": [{"transport": t, "clients": c, "path": m, **cell} for (t, c, m), cell in cells.items()],
        "log_counts": counts, "writer_us_per_record": writer_us, "cpu_limits": limits, "note": note}, indent=2))
    (args.out / "request_log.md").write_text(table + "\n\n" + note + "\n")
    plot(cells, args.out / "request_log.png")
    print()
    print(table)
    print(f"\n{note}\nfigures: {args.out}/request_log.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
