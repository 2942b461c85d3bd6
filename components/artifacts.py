"""Where every artifact keeps its files, and the only functions that read and write them.

Any path here may be a local folder or a URI (gs://, ram://, s3:// where a TensorFlow file-system plug-in serves it):
all I/O goes through `tf.io.gfile`, which serves every scheme TensorFlow knows, so a pipeline root on object storage
works as a local one does. Components, the run summary and the command line take names and paths from here and never
open, glob or stat an artifact path themselves.
"""
from __future__ import annotations

import json
import os
import posixpath
from typing import Any

import tensorflow as tf

from reports.records import CalibrationRecord, ExportReport, OptimizationReport

# The file names other packages read too, under the names components know them by.
from settings.files import EXPORT_REPORT_HTML as EXPORT_REPORT_HTML
from settings.files import EXPORT_REPORT_JSON as EXPORT_REPORT_JSON
from settings.files import SCHEMA_FILE as SCHEMA_FILE

# A Model artifact (Trainer, Optimizer, Exporter): the SavedModel TF Serving loads, in TFX's folder ...
SERVING_MODEL_DIR = "Format-Serving"
# ... and beside it the bare Keras model over transformed features, which the Optimizer fine-tunes and the Exporter
# converts.
KERAS_MODEL_FILE = "keras/model.keras"
# The Optimizer's figures, at the root of its Model artifact.
OPTIMIZATION_REPORT_FILE = "optimization_report.json"
# The Trainer's per-epoch figures (train and validation) and the settings it trained with, at its artifact's root.
TRAINING_HISTORY_JSON = "training_history.json"
# The calibration step's figures and chosen decision threshold, at the root of the Model artifact it writes.
CALIBRATION_REPORT_JSON = "calibration.json"
# The Exporter's Model artifact: every format inside Format-Serving (the Pusher copies that folder to a version) ...
FORMAT_DIRS = {"tflite": "tflite", "onnx": "onnx", "tfjs": "tfjs"}
# Examples, statistics and anomalies keep one folder per split.
SPLIT_PREFIX = "Split-"
# The split (data.calibration_buckets) that probabilities are calibrated and the decision threshold chosen on.
CALIBRATION_SPLIT = "calibration"
# ExampleValidator's report in each split folder of an ExampleAnomalies artifact.
SCHEMA_DIFF_FILE = "SchemaDiff.pb"
# StatisticsGen's TFDV statistics in each split folder, and SchemaGen's schema at its artifact's root.
STATISTICS_FILE = "FeatureStats.pb"
# At the root of ExampleGen's Examples: how many rows it left out for a missing label (components/example_gen).
MISSING_LABEL_FILE = "missing_label_rows.json"
# ExampleGen and Transform write gzipped TFRecord files of tf.Examples.
RECORD_FILE_PATTERN = "*.gz"
# The curated schema is copied below the pipeline root into a folder named by its content (see pipeline.py).
STAGED_SCHEMAS_DIR = "_schemas"


def is_uri(path: str) -> bool:
    """True for gs://bucket/..., ram://..., s3://...; False for a local path."""
    return "://" in path


def absolute(path: str) -> str:
    """A local path made absolute; a URI unchanged."""
    return path if is_uri(path) else os.path.abspath(path)


def join(base: str, *parts: str) -> str:
    """`base`/`parts` with forward slashes, for URIs and local paths alike."""
    return posixpath.join(base, *parts)


def parent(path: str) -> str:
    """The folder holding `path` (for the Format-Serving folder: its Model artifact)."""
    return posixpath.dirname(path.rstrip("/"))


def serving_model_dir(model_uri: str) -> str:
    return join(model_uri, SERVING_MODEL_DIR)


def keras_model_path(model_uri: str) -> str:
    return join(model_uri, KERAS_MODEL_FILE)


def split_uri(artifact_uri: str, split: str) -> str:
    """The folder of one split ("train", "eval") of an Examples, statistics or anomalies artifact."""
    return join(artifact_uri, f"{SPLIT_PREFIX}{split}")


def split_pattern(split_folder: str) -> str:
    """The file pattern TFX's data accessors take for one split folder."""
    return join(split_folder, "*")


def split_files(split_folder: str) -> list[str]:
    """The record files of one split folder, in name order; raises FileNotFoundError naming the folder if none."""
    files = sorted(tf.io.gfile.glob(join(split_folder, RECORD_FILE_PATTERN)))
    if not files:
        raise FileNotFoundError(f"no example files ({RECORD_FILE_PATTERN}) in {split_folder}; the component that "
                                "writes this split did not finish.")
    return files


def record_dataset(split_folder: str) -> tf.data.Dataset:
    """The serialized tf.Examples of one split folder, file by file: the one reader of example splits."""
    return tf.data.TFRecordDataset(split_files(split_folder), compression_type="GZIP")


def read_records(split_folder: str, limit: int | None = None) -> list[bytes]:
    """Up to `limit` (all when None) serialized tf.Examples of one split folder."""
    dataset = record_dataset(split_folder)
    if limit is not None:
        dataset = dataset.take(limit)
    return [record.numpy() for record in dataset]


# Distributed training keeps its files below the Trainer's model_run folder.
def workers_dir(model_run_dir: str) -> str:
    """The worker spec and the per-attempt worker logs."""
    return join(model_run_dir, "workers")


def scratch_dir(model_run_dir: str, index: int) -> str:
    """A non-chief worker's SavedModel and TensorBoard logs, which nobody reads; removed after training."""
    return join(workers_dir(model_run_dir), "scratch", f"worker-{index}")


def backup_dir(model_run_dir: str) -> str:
    """BackupAndRestore's state at the last epoch end; removed when training ends normally."""
    return join(model_run_dir, "backup")


def only_file(folder: str) -> str:
    """The one file in `folder` (TFX writes single-file artifacts such as the Tuner's hyperparameters so)."""
    files = [name for name in tf.io.gfile.listdir(folder) if not tf.io.gfile.isdir(join(folder, name))]
    if len(files) != 1:
        raise FileNotFoundError(f"{folder} should hold exactly one file, but holds {len(files)}.")
    return join(folder, files[0])


def exists(path: str) -> bool:
    return tf.io.gfile.exists(path)


def make_dirs(path: str) -> None:
    tf.io.gfile.makedirs(path)


def read_bytes(path: str) -> bytes:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    with tf.io.gfile.GFile(path, "r") as f:
        return f.read()


def write_text(path: str, text: str) -> None:
    """Writes `text` to `path`, creating its folder."""
    make_dirs(posixpath.dirname(path))
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(text)


def write_bytes(path: str, data: bytes) -> None:
    make_dirs(posixpath.dirname(path))
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)


def read_json(path: str) -> Any:
    return json.loads(read_text(path))


def write_json(path: str, value: Any, indent: int = 1) -> None:
    write_text(path, json.dumps(value, indent=indent, sort_keys=True))


def read_optimization_report(model_uri: str) -> OptimizationReport | None:
    """The Optimizer's report at the root of its Model artifact; None for a Model artifact it did not write."""
    path = join(model_uri, OPTIMIZATION_REPORT_FILE)
    return OptimizationReport.from_dict(read_json(path)) if exists(path) else None


def read_calibration_record(model_uri: str) -> CalibrationRecord | None:
    """The calibration record at the root of the Optimizer's Model artifact; None when no calibration ran."""
    path = join(model_uri, CALIBRATION_REPORT_JSON)
    return CalibrationRecord.from_dict(read_json(path)) if exists(path) else None


def read_export_report(folder: str) -> ExportReport | None:
    """The export report in an exported (or published) SavedModel folder; None when there is none."""
    path = join(folder, EXPORT_REPORT_JSON)
    return ExportReport.from_dict(read_json(path)) if exists(path) else None


def copy_tree(source: str, destination: str) -> None:
    """Copies every file below `source` to the same relative path below `destination`, across schemes (a local
    staging folder to gs://, or back), overwriting files that exist there."""
    source = source.rstrip("/")
    if not tf.io.gfile.isdir(source):
        raise FileNotFoundError(f"{source} is not a folder to copy")
    make_dirs(destination)
    for folder, _, files in tf.io.gfile.walk(source):
        relative = folder.rstrip("/")[len(source):].lstrip("/")
        target = join(destination, relative) if relative else destination
        make_dirs(target)
        for name in files:
            tf.io.gfile.copy(join(folder, name), join(target, name), overwrite=True)


def remove_tree(path: str) -> None:
    """Removes a folder and everything in it; nothing happens when it does not exist."""
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)
