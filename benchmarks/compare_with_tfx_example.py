"""Our pipeline against TFX's own `taxi_pipeline_native_keras.py` on the same machine and the same data.

Runs each as a subprocess, sampling the resident memory of its whole process tree, then scores both pushed
models on the held-out rows that neither pipeline trained on (the two hash splits differ) and prints a table.
Figures land in <out>/compare_with_tfx_example.{json,png}.

    .venv/bin/python benchmarks/compare_with_tfx_example.py --out outputs/benchmarks
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tfx  # noqa: E402

import components  # noqa: E402,F401  (Keras 2 before TensorFlow)
from benchmarks.measure import run_measured  # noqa: E402
from pipeline.data import EMBEDDED_TAXI_DIR  # noqa: E402

TFX_EXAMPLE_DIR = Path(tfx.__file__).parent / "examples" / "chicago_taxi_pipeline"


def read_examples(split_dir: str) -> list[bytes]:
    import tensorflow as tf

    records = []
    for path in sorted(glob.glob(os.path.join(split_dir, "*.gz"))):
        records += [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type="GZIP")]
    return records


def newest(pattern: str) -> str:
    matches = sorted(glob.glob(pattern), key=lambda p: int(Path(p).name) if Path(p).name.isdigit() else 0)
    if not matches:
        raise SystemExit(f"nothing matches {pattern}")
    return matches[-1]


def big_tipper(serialized: list[bytes]) -> list[int]:
    import tensorflow as tf

    labels = []
    for record in serialized:
        example = tf.train.Example.FromString(record)
        fare = example.features.feature["fare"].float_list.value
        tips = example.features.feature["tips"].float_list.value
        labels.append(int(bool(fare) and bool(tips) and tips[0] > 0.2 * fare[0]))
    return labels


def score(model_dir: str, signature: str, output: str, serialized: list[bytes]) -> list[float]:
    import numpy as np
    import tensorflow as tf

    fn = tf.saved_model.load(model_dir).signatures[signature]
    scores = []
    for start in range(0, len(serialized), 512):
        batch = tf.constant(serialized[start : start + 512])
        scores.append(np.reshape(fn(examples=batch)[output].numpy(), [-1]))
    return list(np.concatenate(scores))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/benchmarks")
    parser.add_argument("--config", default=None, help="our pipeline's config (default: the taxi job)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="compare-", dir=out))
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "PYTHONWARNINGS": "ignore", "TF_CPP_MIN_LOG_LEVEL": "3"}

    ours_root = work / "ours"
    # What `make demo` runs: the pipeline, then a REST and a gRPC prediction from the served model.
    command = [sys.executable, "-m", "pipeline.cli", "run", "--serve-after", "--set", f"output_root={ours_root}"]
    if args.config:
        command += ["--config", args.config]
    print("running our pipeline ...", flush=True)
    ours_load = os.getloadavg()[0]
    ours_seconds, ours_gib, ours_cpu = run_measured(command, env, work / "ours.log")
    ours_load = (ours_load + os.getloadavg()[0]) / 2

    # TFX's example reads everything from $HOME/taxi and writes under $HOME/tfx.
    home = work / "tfx_example_home"
    (home / "taxi" / "data" / "simple").mkdir(parents=True)
    shutil.copy(EMBEDDED_TAXI_DIR / "data.csv", home / "taxi" / "data" / "simple" / "data.csv")
    shutil.copy(TFX_EXAMPLE_DIR / "taxi_utils_native_keras.py", home / "taxi")
    print("running TFX's taxi_pipeline_native_keras.py ...", flush=True)
    theirs_load = os.getloadavg()[0]
    theirs_seconds, theirs_gib, theirs_cpu = run_measured(
        [sys.executable, str(TFX_EXAMPLE_DIR / "taxi_pipeline_native_keras.py")], {**env, "HOME": str(home)},
        work / "tfx_example.log",
    )
    theirs_load = (theirs_load + os.getloadavg()[0]) / 2

    # Ours never trains on its eval or calibration split (the calibration split fits only the two Platt
    # parameters, which leave AUC unchanged); ours cuts each label class by hash order, TFX hashes whole rows into
    # 2/1 buckets, so about a third of ours' held-out rows are TFX's eval rows too.
    ours_examples = newest(str(ours_root / "pipelines/taxi/CsvExampleGen/examples/*"))
    ours_held_out = [r for split in sorted(glob.glob(ours_examples + "/Split-*")) if not split.endswith("-train")
                     for r in read_examples(split)]
    theirs_root = home / "tfx/pipelines/chicago_taxi_native_keras"
    theirs_eval = set(read_examples(newest(str(theirs_root / "CsvExampleGen/examples/*")) + "/Split-eval"))
    common = [r for r in ours_held_out if r in theirs_eval]
    if not common:
        raise SystemExit("no row is held out by both pipelines: check the two configs' hash buckets")
    labels = big_tipper(common)

    from sklearn.metrics import accuracy_score, roc_auc_score

    ours_model = newest(str(ours_root / "serving/taxi/*"))
    theirs_model = newest(str(home / "taxi/serving_model/chicago_taxi_native_keras/*"))
    results = {}
    for name, model, signature, output, seconds, cpu, load, gib in [
        ("ours", ours_model, "serving_examples", "probabilities", ours_seconds, ours_cpu, ours_load, ours_gib),
        ("tfx_example", theirs_model, "serving_default", "outputs", theirs_seconds, theirs_cpu, theirs_load,
         theirs_gib),
    ]:
        probabilities = score(model, signature, output, common)
        results[name] = {
            "wall_seconds": round(seconds, 1),
            "cpu_seconds": round(cpu, 1),
            "load_average": round(load, 1),
            "peak_rss_gib": round(gib, 2),
            "eval_auc": round(float(roc_auc_score(labels, probabilities)), 4),
            "eval_accuracy": round(float(accuracy_score(labels, [p > 0.5 for p in probabilities])), 4),
        }
    results["eval_rows"] = len(common)
    results["positive_rate"] = round(sum(labels) / len(labels), 4)

    print(f"\nscored on {len(common)} held-out rows that neither pipeline trained on")
    print(f"{'pipeline':<14}{'wall s':>9}{'CPU s':>9}{'load':>6}{'peak GiB':>10}{'eval AUC':>10}{'accuracy':>10}")
    for name in ("ours", "tfx_example"):
        r = results[name]
        print(f"{name:<14}{r['wall_seconds']:>9}{r['cpu_seconds']:>9}{r['load_average']:>6}{r['peak_rss_gib']:>10}"
              f"{r['eval_auc']:>10}{r['eval_accuracy']:>10}")
    print(f"ours / TFX's: wall {results['ours']['wall_seconds'] / results['tfx_example']['wall_seconds']:.2f}x, "
          f"CPU {results['ours']['cpu_seconds'] / results['tfx_example']['cpu_seconds']:.2f}x "
          "(load: the 1-minute load average over the run, this run's own processes included)")
    (out / "compare_with_tfx_example.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "compare_with_tfx_example.png")
    print(f"\nfigures: {out / 'compare_with_tfx_example.json'} and .png; logs and outputs: {work}")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["ours", "tfx_example"]
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    panels = [("wall_seconds", "wall time (s)"), ("peak_rss_gib", "peak RSS (GiB)"), ("eval_auc", "eval AUC")]
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.bar(names, [results[n][key] for n in names], color=["#2b7bba", "#999999"])
        ax.set_title(title)
        for i, n in enumerate(names):
            ax.text(i, results[n][key], f"{results[n][key]}", ha="center", va="bottom")
    fig.suptitle(f"Chicago taxi, {results['eval_rows']} shared held-out rows")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
