"""`mlops monitor` over 100,000 logged requests: wall time, CPU time and peak memory.

    .venv/bin/python -m benchmarks.monitor                       # 100,000 requests of one row each
    .venv/bin/python -m benchmarks.monitor --requests 20000 --rows-per-request 8

Requests are rows of the embedded taxi sample drawn with replacement (seed 0), logged as TF Serving's PredictionLog
in files of 10,000 requests, one minute apart; the model repository's version 1 carries the curated schema and the
statistics of the whole sample as its training data. Two runs, each `python -m pipeline.cli monitor` in its own process
whose resident memory (process tree) is sampled: `--last N` (all N requests judged for skew, none before them) and
`--last N/2` (N/2 judged, the N/2 before for drift). Figures land in outputs/bench/monitor.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from benchmarks.measure import REPO, run_measured
from benchmarks.taxi_data import read_sample

MODEL = "taxi"
REQUESTS_PER_FILE = 10_000
START = datetime(2026, 1, 31, 0, 0, tzinfo=timezone.utc)


def _columns(header: list[str], rows: list[list[str]], types: dict[str, int]) -> dict[str, np.ndarray]:
    """Each feature's cells as the dtype a client sends, with the client's missing markers."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    index = {name: i for i, name in enumerate(header)}
    columns = {}
    for name, kind in types.items():
        cells = [row[index[name]] for row in rows]
        if kind == schema_pb2.BYTES:
            columns[name] = np.array([c.encode() for c in cells], dtype=object)
        elif kind == schema_pb2.FLOAT:
            columns[name] = np.array([float(c) if c else np.nan for c in cells], np.float32)
        else:
            columns[name] = np.array([int(float(c)) if c else -1 for c in cells], np.int64)
    return columns


def _log(columns: dict[str, np.ndarray], picked: np.ndarray, version: int) -> bytes:
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import prediction_log_pb2

    log = prediction_log_pb2.PredictionLog()
    log.log_metadata.model_spec.name = MODEL
    log.log_metadata.model_spec.version.value = version
    log.log_metadata.sampling_config.sampling_rate = 1.0
    inputs = log.predict_log.request.inputs
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=len(picked))])
    for name, values in columns.items():
        chosen = values[picked]
        if values.dtype == object:
            tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, tensor_shape=shape, string_val=chosen.tolist())
        elif values.dtype == np.float32:
            tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_shape=shape, float_val=chosen.tolist())
        else:
            tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64, tensor_shape=shape, int64_val=chosen.tolist())
        inputs[name].CopyFrom(tensor)
    log.predict_log.response.outputs["probabilities"].CopyFrom(tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, tensor_shape=shape, float_val=[0.5] * len(picked)))
    return log.SerializeToString()


def prepare(root: Path, requests: int, rows_per_request: int) -> dict[str, str]:
    """The model repository (a tiny SavedModel with the sample's schema and statistics) and the logs; the config
    overrides that point `mlops monitor` at them."""
    import tensorflow as tf  # after benchmarks.taxi_data's import of pipeline, which selects Keras 2

    from components.publisher.publish import TrainingData, publish_model
    from monitoring.logs import WindowStatistics
    from serving.server.request_log import log_file_name
    from settings.config import load_config

    config = load_config(None, [f"output_root={root}"])
    schema = tf.io.gfile.GFile(config.schema_path).read()
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    types = {f.name: f.type for f in text_format.Parse(schema, schema_pb2.Schema()).feature if f.name in
             config.features}
    header, rows = read_sample()
    columns = _columns(header, rows, types)
    training = WindowStatistics()
    # The whole sample, in requests of 1,000 rows, is the training data.
    training.add(_log(columns, np.arange(i, min(i + 1000, len(rows))), 1) for i in range(0, len(rows), 1000))
    data = root / "training"
    data.mkdir(parents=True)
    (data / "schema.pbtxt").write_text(schema)
    (data / "statistics.pb").write_bytes(training.statistics(1).SerializeToString())
    model = tf.Module()
    model.serve = tf.function(lambda x: {"y": x}, input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(model, str(root / "export"))
    (root / "export" / "export_report.json").write_text(json.dumps({"passed": True}))
    publish_model(str(root / "export"), config.serving_base_dir, MODEL, {"blessed": True},
                  TrainingData(str(data / "schema.pbtxt"), str(data / "statistics.pb")))

    rng = np.random.default_rng(0)
    folder = root / "logs" / MODEL
    folder.mkdir(parents=True)
    for index, first in enumerate(range(0, requests, REQUESTS_PER_FILE)):
        count = min(REQUESTS_PER_FILE, requests - first)
        picked = rng.integers(0, len(rows), size=(count, rows_per_request))
        path = folder / log_file_name((START + timedelta(minutes=index)).timestamp(), 4242, index)
        with tf.io.TFRecordWriter(str(path)) as writer:
            for chosen in picked:
                writer.write(_log(columns, chosen, 1))
        # Closed files: each ends a minute after it began (its successor's start; the last one's modification time).
        end = (START + timedelta(minutes=index + 1)).timestamp()
        os.utime(path, (end, end))
    return {"output_root": str(root), "serving.request_log.directory": str(root / "logs"),
            "monitoring.output_dir": str(root / "monitoring")}


def measure(last: int, overrides: dict[str, str], root: Path) -> dict:
    command = [sys.executable, "-m", "pipeline.cli", "monitor", "--last", str(last),
               *[flag for key, value in overrides.items() for flag in ("--set", f"{key}={value}")]]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    load = os.getloadavg()[0]
    wall, peak, cpu = run_measured(command, env, root / f"monitor-last-{last}.log")
    [record] = sorted((root / "monitoring" / MODEL).glob("*/monitor.json"), key=os.path.getmtime)[-1:]
    figures = json.loads(record.read_text())
    read = figures["window"]["requests"] + figures["previous"]["requests"]
    return {"last": last, "judged_requests": figures["window"]["requests"], "rows": figures["window"]["rows"],
            "previous_requests": figures["previous"]["requests"], "drift_judged": figures["previous"]["judged"],
            "flagged": figures["flagged"], "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
            "requests_per_second": round(read / wall), "peak_rss_gib": round(peak, 2),
            "load_average": round((load + os.getloadavg()[0]) / 2, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.monitor", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rows-per-request", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "bench")
    args = parser.parse_args(argv)
    root = args.out / "monitor"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    started = time.monotonic()
    print(f"logging {args.requests:,} requests of {args.rows_per_request} row(s) under {root / 'logs'} ...", flush=True)
    overrides = prepare(root, args.requests, args.rows_per_request)
    print(f"  written in {time.monotonic() - started:.1f}s", flush=True)
    results = []
    for last in (args.requests, args.requests // 2):
        print(f"mlops monitor --last {last:,} ...", flush=True)
        results.append(measure(last, overrides, root))
    print(f"\n{'--last':>8}{'judged':>9}{'before':>9}{'wall s':>8}{'CPU s':>8}{'requests/s':>12}{'peak GiB':>10}"
          f"{'load':>6}  flagged")
    for r in results:
        print(f"{r['last']:>8}{r['judged_requests']:>9}{r['previous_requests']:>9}{r['wall_seconds']:>8.1f}"
              f"{r['cpu_seconds']:>8.1f}{r['requests_per_second']:>12,}{r['peak_rss_gib']:>10.2f}"
              f"{r['load_average']:>6.1f}  {', '.join(r['flagged']) or '-'}")
    report = args.out / "monitor.json"
    report.write_text(json.dumps({"cpus": os.cpu_count(), "requests": args.requests,
                                  "rows_per_request": args.rows_per_request, "results": results}, indent=1))
    print(f"\n{report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
