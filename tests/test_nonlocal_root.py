"""The whole pipeline with its artifacts on gs://, served by a GCS emulator on 127.0.0.1 (tests/gcs_emulator.py).

TensorFlow's own gs:// client (TF Transform, TFDV, TFMA, Keras, SavedModel, the project's code through tf.io.gfile)
and Beam's gcsio (ExampleGen, StatisticsGen, Transform and Evaluator writes) both talk to the emulator, so any
component that opened, globbed or stat-ed an artifact path as a local file would fail here. Only ML Metadata's
SQLite file, the logs and the model repository stay below the local output_root.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import as_cli_flags, small_overrides
from tests.gcs_emulator import GcsEmulator

BUCKET = "mlops"
REPO_ROOT = Path(__file__).resolve().parent.parent


def test_the_pipeline_runs_with_its_root_on_gcs(taxi_slice, tmp_path):
    output_root = tmp_path / "outputs"
    overrides = small_overrides(
        taxi_slice, output_root,
        f"artifact_root=gs://{BUCKET}/pipelines",
        # Few steps and formats: this test is about where every byte goes, not about the model.
        "training.train_steps=40", "optimize.fine_tune_steps=20", "evaluation.lower_bound=0.0",
        "transform.statistics=false", "export.formats=[saved_model,tflite,onnx]", "export.tflite_variants=[float32]",
    )
    with GcsEmulator() as gcs:
        gcs.create_bucket(BUCKET)
        env = {**os.environ, **gcs.environment(), "TF_CPP_MIN_LOG_LEVEL": "3"}
        result = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", *as_cli_flags(overrides)], cwd=REPO_ROOT,
                                env=env, capture_output=True, text=True, timeout=1200)
        assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        objects = gcs.list_objects(BUCKET)

    def written(component: str, *parts: str) -> bool:
        """Whether `component` wrote an object whose name holds every one of `parts`, in this order."""
        pattern = re.compile(".*".join(map(re.escape, [f"pipelines/taxi/{component}/", *parts])))
        return any(pattern.search(name) for name in objects)

    expected = [("_schemas", "/schema.pbtxt"), ("CsvExampleGen", "/Split-eval/", ".gz"),
                ("StatisticsGen", "/Split-train/FeatureStats.pb"), ("ExampleValidator", "/Split-eval/SchemaDiff.pb"),
                ("Transform", "/transform_fn/saved_model.pb"), ("Transform", "/Split-train/", ".gz"),
                ("Trainer", "/Format-Serving/saved_model.pb"), ("Trainer", "/keras/model.keras"),
                ("Optimizer", "/optimization_report.json"), ("Optimizer", "/keras/model.keras"),
                ("Evaluator", "/BLESSED"), ("Exporter", "/Format-Serving/export_report.json"),
                ("Exporter", "/Format-Serving/tflite/model_float32.tflite")]
    missing = [parts for parts in expected if not written(*parts)]
    assert not missing, f"not on gs://: {missing}; the bucket holds {sorted(objects)}"
    assert not (output_root / "pipelines").exists(), "no artifact may land on the local disk"

    # The run's summary came back from those objects, and the Publisher copied the version out of the bucket.
    assert "CsvExampleGen done in" in result.stdout and "Publisher done in" in result.stdout
    [summary_file] = (output_root / "runs").glob("*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["blessed"] is True and summary["model_path"].startswith(f"gs://{BUCKET}/pipelines/taxi/Exporter/")
    assert summary["export"]["passed"] and summary["optimization"]["stages"] == ["prune"]
    version = Path(summary["pushed_path"])
    assert version.parent == (output_root / "serving" / "taxi").resolve()
    for name in ("saved_model.pb", "export_report.json", "onnx/model.onnx", "tflite/model_float32.tflite"):
        assert (version / name).is_file(), name
