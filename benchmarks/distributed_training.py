"""Training throughput and eval AUC with 1 and 2 local MultiWorkerMirroredStrategy workers on this machine.

Trains from the pipeline's latest Transform output (running the pipeline first when there is none), with the
same config for every worker count: the same global batch and steps, so the AUCs should agree and the
examples per second show what the extra worker buys (or costs: on a couple of CPU cores the workers share the
cores and pay for gRPC all-reduces). Prints a table and writes distributed_training.png and .json under --out.

    .venv/bin/python benchmarks/distributed_training.py [--workers 1 2] [--set training.train_steps=400 ...]
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import components  # noqa: E402,F401  (Keras 2 before TensorFlow)
from pipeline.training import NoTransformOutputError, latest_transform_output, train  # noqa: E402
from settings.config import load_config  # noqa: E402

# Logged by run_fn for every epoch: "epoch 2: 50 steps of 256 examples in 3.21s, 3987 examples/s".
EPOCH = re.compile(r"epoch (\d+): (\d+) steps of (\d+) examples in ([\d.]+)s")


def eval_auc(model_dir: str, examples_root: str, label: str) -> float:
    """AUC of the SavedModel on the eval split's raw tf.Examples, labels from the model's own Transform graph."""
    import tensorflow as tf

    files = glob.glob(os.path.join(examples_root, "*", "Split-eval", "*"))
    model = tf.saved_model.load(model_dir)
    auc = tf.keras.metrics.AUC()
    for batch in tf.data.TFRecordDataset(files, compression_type="GZIP").batch(512):
        labels = model.signatures["transform_features"](examples=batch)[label]
        probabilities = model.signatures["serving_examples"](examples=batch)["probabilities"]
        auc.update_state(tf.reshape(labels, [-1]), probabilities)
    return float(auc.result())


def throughput(chief_log: str) -> tuple[float, float]:
    """Examples per second over all epochs, and over the epochs after the first (which includes tracing)."""
    epochs = [(int(steps) * int(batch), float(seconds)) for _, steps, batch, seconds in EPOCH.findall(
        open(chief_log, errors="replace").read())]
    if not epochs:
        raise RuntimeError(f"no epoch timings in {chief_log}")
    later = epochs[1:] or epochs
    return (sum(e for e, _ in epochs) / sum(s for _, s in epochs), sum(e for e, _ in later) / sum(s for _, s in later))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config (default: the taxi job)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default=os.path.join("outputs", "benchmarks"))
    args = parser.parse_args(argv)
    defaults = ["training.train_steps=200", "training.steps_per_epoch=50", "training.eval_steps=10",
                "training.early_stopping_patience=100", "beam.direct_running_mode=in_memory"]
    config = load_config(args.config, defaults + args.overrides)
    try:
        latest_transform_output(config)
    except NoTransformOutputError:
        from pipeline.runner import run_local

        print("no Transform output yet: running the pipeline once", flush=True)
        run_local(config)

    rows = []
    for workers in args.workers:
        run_config = load_config(args.config, defaults + args.overrides + [f"training.workers={workers}"])
        print(f"training with {workers} worker(s) ...", flush=True)
        started = time.monotonic()
        result = train(run_config, out=io.StringIO())
        wall = time.monotonic() - started
        overall, steady = throughput(os.path.join(result.logs, "attempt-0", "worker-0.log"))
        auc = eval_auc(result.serving_model_dir, os.path.join(config.pipeline_root, "CsvExampleGen", "examples"),
                       config.label.name)
        rows.append({"workers": workers, "examples_per_second": round(overall, 1),
                     "examples_per_second_after_first_epoch": round(steady, 1), "wall_seconds": round(wall, 1),
                     "eval_auc": round(auc, 4)})
        time.sleep(1)  # train() names its folder by the second

    header = f"{'workers':>7}  {'examples/s':>10}  {'after epoch 1':>13}  {'wall s':>7}  {'eval AUC':>8}"
    print(f"\nglobal batch {config.training.batch_size}, {config.training.train_steps} steps, "
          f"{os.cpu_count()} CPUs\n{header}")
    for row in rows:
        print(f"{row['workers']:>7}  {row['examples_per_second']:>10.0f}  "
              f"{row['examples_per_second_after_first_epoch']:>13.0f}  {row['wall_seconds']:>7.1f}  "
              f"{row['eval_auc']:>8.4f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.out, exist_ok=True)
    labels = [str(row["workers"]) for row in rows]
    figure, (speed, quality) = plt.subplots(1, 2, figsize=(9, 3.5))
    speed.bar(labels, [row["examples_per_second_after_first_epoch"] for row in rows], color="#4c72b0")
    speed.set(title="training throughput (after epoch 1)", xlabel="workers", ylabel="examples / second")
    quality.bar(labels, [row["eval_auc"] for row in rows], color="#55a868")
    quality.set(title="eval AUC", xlabel="workers", ylim=(min(r["eval_auc"] for r in rows) - 0.05, 1.0))
    figure.suptitle(f"MultiWorkerMirroredStrategy on 127.0.0.1, {os.cpu_count()} CPUs, "
                    f"global batch {config.training.batch_size}")
    figure.tight_layout()
    png = os.path.join(args.out, "distributed_training.png")
    figure.savefig(png, dpi=120)
    with open(os.path.join(args.out, "distributed_training.json"), "w") as f:
        json.dump({"batch_size": config.training.batch_size, "train_steps": config.training.train_steps,
                   "cpus": os.cpu_count(), "rows": rows}, f, indent=2)
    print(f"\nwrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
