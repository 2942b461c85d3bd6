"""Latency and throughput of the local server over REST and gRPC, against calling the SavedModel in-process.

Single-row and 64-row requests, 1 and 8 concurrent clients (threads, each with its own client), each cell run
for `--seconds`. The server runs in a subprocess (`python -m serving.cli serve`) so it does not share the
benchmark's interpreter. Every mode pays the same row-to-tensor conversion. Figures land in
<out>/serving_benchmark.{json,png}.

    .venv/bin/python benchmarks/serving_benchmark.py --model-base-path outputs/serving/taxi --model-name taxi
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tensorflow as tf  # noqa: E402

from pipeline.data import EMBEDDED_TAXI_DIR  # noqa: E402
from serving.client import (  # noqa: E402
    GrpcClient,
    RestClient,
    SignatureSpec,
    TensorSpec,
    parse_signature_defs,
    rows_to_columns,
)
from serving.model_repository import list_versions  # noqa: E402
from serving.servable import read_signature_defs  # noqa: E402

MODES = ("direct", "rest", "grpc")
BATCH_SIZES = (1, 64)
CONCURRENCY = (1, 8)
# A plausible raw value per dtype when no --csv is given; the model's own vocabularies decide what it means.
SYNTHETIC_VALUES = {"DT_FLOAT": 12.5, "DT_DOUBLE": 12.5, "DT_INT64": 7, "DT_INT32": 7, "DT_STRING": "Cash"}


def synthetic_rows(signature: SignatureSpec, count: int) -> list[dict]:
    return [{name: SYNTHETIC_VALUES.get(spec.dtype, "") for name, spec in signature.inputs.items()}] * count


def csv_rows(path: Path, count: int) -> list[dict]:
    import csv

    with path.open(newline="") as f:
        rows = [row for _, row in zip(range(count), csv.DictReader(f), strict=False)]
    return (rows * (count // len(rows) + 1))[:count]


def start_server(base_path: Path, model_name: str) -> tuple[subprocess.Popen, str, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    process = subprocess.Popen(
        [sys.executable, "-m", "serving.cli", "serve", "--model-base-path", str(base_path), "--model-name",
         model_name, "--rest-port", "0", "--grpc-port", "0", "--poll-seconds", "0", "--grpc-workers", "16"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    line = process.stdout.readline()
    if not line.startswith("serving REST on"):
        process.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    words = line.split()
    return process, words[3], words[7]


def run_cell(make_call: Callable[[], Callable[[], None]], clients: int, seconds: float) -> dict:
    """Runs `clients` threads calling as fast as they can for `seconds`; returns latency percentiles and rates."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    calls = [make_call() for _ in range(clients)]
    for call in calls:
        for _ in range(3):  # warm-up: connections, metadata caches, traced functions
            call()
    start_barrier = threading.Barrier(clients + 1)
    deadline = [0.0]

    def worker(index: int) -> None:
        start_barrier.wait()
        while time.perf_counter() < deadline[0]:
            started = time.perf_counter()
            calls[index]()
            latencies[index].append(time.perf_counter() - started)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + seconds
    begun = time.perf_counter()
    start_barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - begun
    all_latencies = np.array([x for per_thread in latencies for x in per_thread]) * 1000
    return {
        "requests": int(all_latencies.size),
        "p50_ms": float(np.percentile(all_latencies, 50)),
        "p99_ms": float(np.percentile(all_latencies, 99)),
        "requests_per_s": all_latencies.size / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-base-path", type=Path, required=True, help="folder of <integer version>/ SavedModels")
    parser.add_argument("--model-name", default="taxi")
    parser.add_argument(
        "--csv", type=Path, default=EMBEDDED_TAXI_DIR / "data.csv",
        help="raw rows to send (default: the embedded taxi data); 'none' sends one synthetic row repeated",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each cell (default 2)")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "benchmarks")
    args = parser.parse_args()

    base_path = args.model_base_path.resolve()
    versions = list_versions(base_path)
    if not versions:
        print(f"error: no <integer version>/ folder under {base_path}", file=sys.stderr)
        return 2
    export_dir = base_path / str(versions[-1])
    signature_defs = read_signature_defs(export_dir)
    from google.protobuf import json_format

    signatures = parse_signature_defs(
        json_format.MessageToDict(signature_defs, preserving_proto_field_name=True)["signature_def"]
    )
    signature = signatures["serving_default"]
    loaded = tf.saved_model.load(str(export_dir))
    direct_function = loaded.signatures["serving_default"]
    use_csv = str(args.csv) != "none"
    rows = {n: (csv_rows(args.csv, n) if use_csv else synthetic_rows(signature, n)) for n in BATCH_SIZES}

    process, rest_url, grpc_target = start_server(base_path, args.model_name)
    results = []
    try:
        for mode in MODES:
            for batch in BATCH_SIZES:
                for clients in CONCURRENCY:
                    batch_rows = rows[batch]

                    def make_call(mode=mode, batch_rows=batch_rows) -> Callable[[], None]:
                        if mode == "direct":
                            dtypes = {n: tf.dtypes.as_dtype(loaded_dtype(s)) for n, s in signature.inputs.items()}
                            return lambda: direct_function(**{
                                n: tf.constant(v, dtype=dtypes[n])
                                for n, v in rows_to_columns(batch_rows, signature.inputs, True).items()
                            })
                        client = RestClient(rest_url) if mode == "rest" else GrpcClient(grpc_target)
                        return lambda: client.predict(batch_rows, args.model_name, drop_unknown_features=True)

                    cell = run_cell(make_call, clients, args.seconds)
                    cell.update(mode=mode, batch=batch, clients=clients, rows_per_s=cell["requests_per_s"] * batch)
                    results.append(cell)
                    print(f"{mode:6} batch {batch:2} clients {clients}: p50 {cell['p50_ms']:7.2f} ms  "
                          f"p99 {cell['p99_ms']:7.2f} ms  {cell['requests_per_s']:8.1f} req/s", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=30)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serving_benchmark.json").write_text(json.dumps(results, indent=2))
    table = format_table(results)
    print()
    print(table)
    plot(results, args.out / "serving_benchmark.png")
    print(f"\nfigures: {args.out / 'serving_benchmark.json'} and {args.out / 'serving_benchmark.png'}")
    return 0


def loaded_dtype(spec: TensorSpec) -> int:
    from tensorflow.core.framework import types_pb2

    return types_pb2.DataType.Value(spec.dtype)


def format_table(results: list[dict]) -> str:
    lines = [
        "| mode | rows/request | clients | p50 ms | p99 ms | requests/s | rows/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['mode']} | {r['batch']} | {r['clients']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
            f"{r['requests_per_s']:.0f} | {r['rows_per_s']:.0f} |"
        )
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [(b, c) for b in BATCH_SIZES for c in CONCURRENCY]
    labels = [f"{b} row{'s' if b > 1 else ''}\n{c} client{'s' if c > 1 else ''}" for b, c in cells]
    x = np.arange(len(cells))
    width = 0.27
    figure, (latency_axis, throughput_axis) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, mode in enumerate(MODES):
        by_cell = {(r["batch"], r["clients"]): r for r in results if r["mode"] == mode}
        p50 = [by_cell[c]["p50_ms"] for c in cells]
        p99 = [by_cell[c]["p99_ms"] for c in cells]
        bars = latency_axis.bar(x + (i - 1) * width, p50, width, label=f"{mode} p50")
        latency_axis.errorbar(x + (i - 1) * width, p50, yerr=[[0] * len(p50), np.subtract(p99, p50)],
                              fmt="none", ecolor=bars.patches[0].get_facecolor(), capsize=3)
        throughput_axis.bar(x + (i - 1) * width, [by_cell[c]["rows_per_s"] for c in cells], width, label=mode)
    latency_axis.set_yscale("log")
    latency_axis.set_ylabel("latency ms (bar p50, whisker p99)")
    throughput_axis.set_yscale("log")
    throughput_axis.set_ylabel("rows per second")
    for axis in (latency_axis, throughput_axis):
        axis.set_xticks(x, labels)
        axis.legend()
    figure.suptitle("Local TF-Serving-compatible server: REST vs gRPC vs in-process SavedModel call")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
