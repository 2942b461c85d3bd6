"""Request logging's cost: `mlops serve` with 16 concurrent clients, logging off, on at 100% and on at 10% sampling,
REST and gRPC, side by side in one run.

Three servers run at once (`python -m serving.cli serve`, the third with `--set serving.request_log.*`), each on the
same model; every repeat measures each transport against the three in turn, the order rotated from one repeat to the
next, so that a machine that gets busier or quieter during the run weighs on the three alike. The clients are
serving_benchmark.py's (client processes, one keep-alive connection each, the same pre-built single-row request as
fast as they can). Each cell shows the median of its repeats, the spread of its requests/s, the server's CPU per
request, and what the logger did (records written, dropped because its queue was full, failed): a logger that
drops is not keeping up, however good the throughput. The goal (issue 29): at most 10% lower throughput at 100%.

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
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.serving_benchmark import (  # noqa: E402 - after the path that makes it importable
    ServerProcess,
    _send_once,
    first_rows,
    grpc_body,
    load_signature,
    rest_body,
    run_clients,
)

MODES = [("off", None), ("on, 100%", 1.0), ("on, 10%", 0.1)]
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


def log_counts(server: ServerProcess, model: str) -> dict[str, float]:
    from rollout.metrics import parse_prometheus_text
    from serving.server.monitoring import REQUEST_LOG_COUNT

    with urllib.request.urlopen(f"http://{server.rest_target}/monitoring/prometheus/metrics", timeout=10) as page:
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
            "server_cpu_ms_per_request": statistics.median(r["server_cpu_ms_per_request"] for r in runs),
            "machine_busy": statistics.median(r["machine_busy"] for r in runs),
            "errors": sum(r["errors"] for r in runs), "rates": rates}


def format_table(cells: dict, counts: dict, clients: int, writer_us: dict[str, float]) -> str:
    lines = ["| transport | request logging | clients | requests/s | spread | p50 ms | p99 ms | server CPU ms/request "
             "| machine busy | errors |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (transport, mode), cell in cells.items():
        lines.append(f"| {transport} | {mode} | {clients} | {cell['requests_per_s']:.0f} | {100 * cell['spread']:.0f}% "
                     f"| {cell['p50_ms']:.2f} | {cell['p99_ms']:.2f} | {cell['server_cpu_ms_per_request']:.3f} "
                     f"| {100 * cell['machine_busy']:.0f}% | {cell['errors']} |")
    lines += ["", "| request logging | records written | dropped (queue full) | failed |", "|---|---:|---:|---:|"]
    for mode, found in counts.items():
        lines.append(f"| {mode} | {found.get('written', 0):.0f} | {found.get('dropped', 0):.0f} "
                     f"| {found.get('failed', 0):.0f} |")
    lines += ["", "against logging off (goal at 100%: throughput at least 0.90x):"]
    for transport in ("rest", "grpc"):
        off = cells[(transport, "off")]
        for mode, _ in MODES[1:]:
            on = cells[(transport, mode)]
            lines.append(f"  {transport} {mode}: throughput {on['requests_per_s'] / off['requests_per_s']:.3f}x "
                         f"({on['requests_per_s']:.0f} vs {off['requests_per_s']:.0f}/s), p99 "
                         f"{on['p99_ms']:.2f} vs {off['p99_ms']:.2f} ms ({on['p99_ms'] / off['p99_ms']:.2f}x)")
    lines += ["", "the logger's own CPU per record (in this process: CPU time, which the machine's other load blurs "
                  "less than throughput), against the server's CPU per request with logging off:"]
    for transport in ("rest", "grpc"):
        off = cells[(transport, "off")]["server_cpu_ms_per_request"] * 1000
        lines.append(f"  {transport}: {writer_us[transport]:.1f} us per record = {writer_us[transport] / off:.1%} of "
                     f"{off:.0f} us per request at 100%, {0.1 * writer_us[transport] / off:.1%} at 10%")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-base-path", type=Path, help="folder of <integer version>/ SavedModels (default: a "
                                                              "stand-in with the taxi model's inputs)")
    parser.add_argument("--model-name", default="taxi")
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each cell's run (default 4)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each cell; medians are shown (default 5)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--client-processes", type=int, default=4, help="processes the clients are spread over")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "benchmarks")
    args = parser.parse_args()

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
    try:
        for mode, rate in MODES:
            extra = [] if rate is None else [
                "--set", "serving.request_log.enabled=true", "--set", f"serving.request_log.sampling_rate={rate}",
                "--set", f"serving.request_log.directory={scratch / 'logs' / str(rate)}"]
            servers[mode] = ServerProcess(REPO, base_path, args.model_name, extra)
        for server in servers.values():  # the first calls trace the model: not measured
            for transport, target in (("rest", server.rest_target), ("grpc", server.grpc_target)):
                for _ in range(3):
                    _send_once(transport, target, path, str(scratch / f"{transport}.req"))
        runs: dict[tuple[str, str], list[dict]] = {(t, m): [] for t in ("rest", "grpc") for m, _ in MODES}
        load_before = os.getloadavg()[0]
        for repeat in range(args.repeats):
            order = MODES[repeat % len(MODES):] + MODES[:repeat % len(MODES)]
            for transport in ("rest", "grpc"):
                for mode, _ in order:
                    server = servers[mode]
                    group = {"transport": transport, "clients": args.clients, "path": path,
                             "target": server.rest_target if transport == "rest" else server.grpc_target,
                             "request_file": str(scratch / f"{transport}.req"), "processes": args.client_processes}
                    [result] = run_clients([group], args.seconds, server.process.pid)
                    runs[(transport, mode)].append(result)
                    print(f"repeat {repeat + 1} {transport:4} logging {mode:9}: {result['requests_per_s']:6.0f} req/s "
                          f"p50 {result['p50_ms']:6.2f} ms p99 {result['p99_ms']:6.2f} ms "
                          f"(machine busy {100 * result['machine_busy']:.0f}%)", flush=True)
        counts = {mode: log_counts(servers[mode], args.model_name) for mode, rate in MODES if rate is not None}
        with grpc.insecure_channel(servers["off"].grpc_target) as channel:
            answer = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")(
                (scratch / "grpc.req").read_bytes(), timeout=30)
    finally:
        for server in servers.values():
            server.stop()
    cells = {key: median_cell(value) for key, value in runs.items()}
    writer_us = writer_cost_us(scratch, args.model_name, one_row, (scratch / "grpc.req").read_bytes(), answer)
    table = format_table(cells, counts, args.clients, writer_us)
    note = (f"model: {base_path}; {args.repeats} repeats of {args.seconds:g} s per cell; load average before/after: "
            f"{load_before:.2f}/{os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs shared by the server and the clients")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "request_log.json").write_text(json.dumps({"cells": {f"{t} {m}": c for (t, m), c in cells.items()},
                                                           "log_counts": counts, "writer_us_per_record": writer_us,
                                                           "note": note}, indent=2))
    (args.out / "request_log.md").write_text(table + "\n\n" + note + "\n")
    print()
    print(table)
    print(f"\n{note}\nfigures: {args.out}/request_log.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
