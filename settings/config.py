"""The one typed configuration of the pipeline, loaded from YAML with `key.sub=value` overrides."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from settings.csv_header import FEATURE_NAME, feature_name
from settings.errors import UserError
from settings.tasks import TASK_METRICS, TaskKind, task_metric

if typing.TYPE_CHECKING:
    from tensorflow_metadata.proto.v0 import schema_pb2

DEFAULT_CONFIG = Path(__file__).parent.parent / "pipeline" / "configs" / "taxi.yaml"


class ConfigError(UserError, ValueError):
    """A configuration a user wrote is wrong; the message says which key and what is allowed."""

    exit_code = 2
    prefix = "config error"


# The fields a date or timestamp format can name, as strptime writes them.
DATETIME_DIRECTIVES = {"%Y": "year", "%m": "month", "%d": "day", "%H": "hour", "%M": "minute", "%S": "second"}
# Seconds since 1970-01-01 00:00 UTC, in an integer column.
EPOCH_FORMAT = "%s"
# What the Transform graph derives from a date: the year as a number, the others as ids (one more for missing).
DATETIME_ID_PARTS = {"month": 12, "day_of_week": 7, "hour": 24}


def usable_name(name: str) -> str:
    """The feature a CSV column named `name` becomes, for a message to propose."""
    return feature_name(name) if name else "feature"


def datetime_fields(fmt: str, key: str = "data.datetime_features") -> list[str]:
    """The fields a format writes, in order (["epoch"] for %s). Any run of characters other than digits separates two
    fields, so the format's own separators only document the data; fields beyond the ones it names are ignored."""
    if fmt.strip() == EPOCH_FORMAT:
        return ["epoch"]
    pieces = re.split(r"(%.)", fmt)
    fields = []
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            if re.search(r"[0-9]", piece) or (0 < i < len(pieces) - 1 and not piece):
                raise ConfigError(f"{key} '{fmt}' must separate its fields with characters other than digits (as in "
                                  "%Y-%m-%d %H:%M); fields written side by side, such as %Y%m%d, are not read.")
            continue
        if piece not in DATETIME_DIRECTIVES:
            raise ConfigError(f"{key} '{fmt}' uses {piece}; a format is built from "
                              f"{', '.join(DATETIME_DIRECTIVES)} (or is {EPOCH_FORMAT}, seconds since 1970).")
        if DATETIME_DIRECTIVES[piece] in fields:
            raise ConfigError(f"{key} '{fmt}' names {piece} twice; name each field once.")
        fields.append(DATETIME_DIRECTIVES[piece])
    if not {"year", "month", "day"} <= set(fields):
        raise ConfigError(f"{key} '{fmt}' must name the year, the month and the day (%Y, %m and %d).")
    return fields


def datetime_parts(fields: list[str]) -> list[str]:
    """The features derived from a date with these fields: year, month, day of week, and the hour when there is one."""
    return ["year", "month", "day_of_week"] + (["hour"] if "hour" in fields or fields == ["epoch"] else [])


@dataclass
class DataConfig:
    """Where the CSV data is and how each column becomes a feature; how the rows are split."""
    # Folder of CSV files sharing one header; empty means the Chicago taxi sample inside the tfx wheel.
    path: str = ""
    # Numeric columns: missing values filled with the training mean, then z-scored.
    numeric_features: list[str] = field(default_factory=list)
    # Numeric columns cut into transform.bucket_count quantile buckets (long tails, coordinates), plus one bucket for
    # missing.
    bucket_features: list[str] = field(default_factory=list)
    # String columns, and integer codes, mapped to ids by a vocabulary of the training split's most frequent values.
    vocab_features: list[str] = field(default_factory=list)
    # Integer columns whose values are the ids themselves (hours, weekdays, area codes): no vocabulary to compute;
    # 0 to the training split's largest value, and one more id for missing, negative or larger values.
    category_features: list[str] = field(default_factory=list)
    # Date and timestamp columns, each with its format: the Transform graph derives <column>_year (a number),
    # <column>_month, <column>_day_of_week and, when the format has %H, <column>_hour (ids); see datetime_fields.
    datetime_features: dict[str, str] = field(default_factory=dict)
    # Cell values that mean "missing" besides the empty cell (which always does), in every column: e.g. [NA, "?"].
    # ExampleGen reads them as empty cells, so a numeric column with such markers stays numeric.
    missing_values: list[str] = field(default_factory=list)
    # Hash split of the rows: train and eval buckets ...
    train_buckets: int = 4
    # ... the eval split's share of the buckets (the Evaluator's and the Exporter's rows).
    eval_buckets: int = 1
    # ... and a third split, calibration, that the model never trains on and the Evaluator never measures: a
    # classifier's probabilities are calibrated and its decision threshold chosen on it (the calibration section).
    # 0: no such split, and no calibration.
    calibration_buckets: int = 0
    # Split each class of a binary or multiclass label by those shares, so that every split holds the data's label
    # rates and the splits differ by sampling only within a class (a regression label: a hash split of whole rows).
    # false: a hash split of whole rows.
    stratify: bool = True


@dataclass
class LabelConfig:
    """What the model predicts and how the label is computed from a raw column."""
    # What the model predicts: binary (one probability), multiclass (a probability per class of the label column,
    # the classes taken from the data) or regression (the label column's number).
    kind: TaskKind = "binary"
    # Name of the label the pipeline computes; never a raw column a request must carry.
    name: str = "label"
    # Raw column the label is computed from; it is dropped from the features and from serving.
    column: str = ""
    # binary only: label = column > threshold * relative_to (or > threshold when relative_to is empty) ...
    threshold: float = 0.5
    # binary only: a column the threshold is a share of (the taxi job: tips > 0.2 * fare); empty: an absolute threshold.
    relative_to: str = ""
    # ... or, when set, label = (column == positive_value) for a string column.
    positive_value: str = ""


@dataclass
class TransformConfig:
    """The Transform stage (TF Transform): buckets, vocabularies and its execution mode."""
    # Quantile buckets of each data.bucket_features column.
    bucket_count: int = 10
    # Most frequent values each vocabulary keeps; the others share the out-of-vocabulary id(s).
    vocab_size: int = 1000
    # Ids for values outside the vocabulary. With 1, every unseen value gets id vocab_size and each runtime can
    # reproduce it; more buckets spread unseen values by a FarmHash only TensorFlow computes (SavedModel only).
    oov_buckets: int = 1
    # TFX's pre- and post-transform statistics and anomalies beside the Transform output: two more TFDV passes over
    # the data (5 of the taxi job's 39 Transform seconds) that nothing in the pipeline reads; true keeps them.
    statistics: bool = False
    # TF Transform's TF1 graph mode: builds the same transform graph without tracing preprocessing_fn as a
    # tf.function in each phase (the taxi job's Transform: 16 s instead of 21 s). false: TF2 mode, which
    # preprocessing_fn needs for AutoGraph control flow on tensors or TF2-only analyzers.
    tf_compat_v1: bool = True


@dataclass
class TFJobConfig:
    """How `training.backend: tfjob` runs the workers as a Kubernetes TFJob (docs/tutorials/kubeflow.md)."""
    # kubeflow: Kubeflow's training operator (kubeflow.org/v1); kubedl: KubeDL (training.kubedl.io/v1alpha1).
    operator: Literal["kubeflow", "kubedl"] = "kubeflow"
    # Where the TFJob is created.
    namespace: str = "mlops"
    # The project's image (the Dockerfile at the repository root), pushed where the cluster can pull it.
    image: str = "tfx-mlops:latest"
    # The worker containers' imagePullPolicy.
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    # The workers' service account (k8s/training creates it).
    service_account: str = "mlops-trainer"
    # Claim holding the pipeline root; every worker mounts it at mount_path ...
    pvc: str = "mlops-pipeline-root"
    # ... which must be where output_root lives, so that artifact paths mean the same in every pod; empty means
    # the absolute output_root itself.
    mount_path: str = ""
    # Each worker's CPU request and limit (a Kubernetes quantity) ...
    cpu: str = "1"
    # ... and its memory request and limit.
    memory: str = "2Gi"
    # ExitCode: exit codes 1-127 are permanent failures, 128 and above (a killed worker) are restarted.
    restart_policy: Literal["OnFailure", "ExitCode", "Never"] = "ExitCode"
    # Which pods the operator deletes when the job ends (the operator's cleanPodPolicy).
    clean_pod_policy: Literal["None", "Running", "All"] = "Running"
    # Retries of the whole job before it is marked failed (the operator's backoffLimit).
    backoff_limit: int = 3
    # The job fails when it runs longer than this (the operator's activeDeadlineSeconds).
    active_deadline_seconds: int = 7200
    # How often the Trainer reads the job's status while it waits.
    poll_seconds: float = 10.0
    # Empty: the in-cluster service account, else ~/.kube/config; or the path of a kubeconfig file.
    kubeconfig: str = ""
    # KubeDL only: when set, KubeDL records the chief's SavedModel as a ModelVersion of this model ...
    model_version_name: str = ""
    # ... builds an image of it pushed to this repository ...
    model_image_repo: str = ""
    # ... from this NFS export, which KubeDL mounts in the chief's pod.
    model_nfs_server: str = ""
    # ... and this path on it.
    model_nfs_path: str = ""


@dataclass
class TrainingConfig:
    """The Trainer: the tf_keras model (embeddings, an MLP), its optimizer and how many workers train it."""
    # Training steps in all (global batches).
    train_steps: int = 2000
    # Batches of the eval split read for validation at the end of each epoch.
    eval_steps: int = 100
    # Steps between two validations (one epoch); early stopping counts these epochs.
    steps_per_epoch: int = 200
    # The global batch: rows per training step, split evenly among the workers.
    batch_size: int = 128
    # Width of each hidden Dense layer of the MLP, input side first.
    hidden_units: list[int] = field(default_factory=lambda: [64, 32])
    # The hidden layers' activation (any Keras activation name).
    activation: str = "relu"
    # Dropout rate after each hidden layer (0: none).
    dropout: float = 0.0
    # Batch normalization after each hidden layer.
    batch_norm: bool = False
    # L2 weight penalty on the Dense kernels (0: none).
    l2: float = 0.0
    # adam, or sgd with momentum.
    optimizer: Literal["adam", "sgd"] = "adam"
    # The optimizer's initial learning rate.
    learning_rate: float = 0.001
    # sgd only: the momentum.
    momentum: float = 0.9
    # How the learning rate changes over the steps: constant, exponential decay or cosine decay.
    lr_schedule: Literal["constant", "exponential", "cosine"] = "constant"
    # exponential and cosine: the decay's period in steps ...
    decay_steps: int = 1000
    # ... and exponential's factor per period.
    decay_rate: float = 0.9
    # Clip each gradient to this norm (null: no clipping).
    clipnorm: float | None = None
    # Compile the training step with XLA.
    jit_compile: bool = False
    # Keras' dtype policy; the mixed policies pay off on accelerators only.
    mixed_precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    # Weight the classes inversely to their frequency in the loss, so each counts equally.
    class_weights: bool = True
    # Epochs without a better validation metric before training stops (the best weights are kept).
    early_stopping_patience: int = 3
    # Seeds weight initialisation and the input order; all workers must shuffle alike (see components/model.py).
    seed: int = 42
    # Number of MultiWorkerMirroredStrategy workers. batch_size is the global batch, split evenly among them, so
    # the learning rate and steps stay those of one worker and the result does not depend on this number.
    workers: int = 1
    # local: worker processes on this machine (127.0.0.1); tfjob: a TFJob on Kubernetes.
    backend: Literal["local", "tfjob"] = "local"
    # How often the local launcher restarts the whole group after a worker was killed (signal or exit code >= 128).
    max_restarts: int = 2
    tfjob: TFJobConfig = field(default_factory=TFJobConfig)


@dataclass
class TunerConfig:
    """The Tuner (KerasTuner), off by default: a search over layer width, depth and learning rate."""
    # Run KerasTuner before the Trainer; the best width, depth and learning rate go to the Trainer.
    enabled: bool = False
    # random or bayesian (Bayesian optimisation) search.
    algorithm: Literal["random", "bayesian"] = "random"
    # Models the search trains.
    max_trials: int = 4
    # Training steps of each trial ...
    train_steps: int = 200
    # ... and its validation batches.
    eval_steps: int = 50


BASELINES = ("previous_blessed", "latest_blessed", "stable", "published_blessed", "none")
# The baselines read from the model repository (components/serving_baseline), not from ML Metadata.
REPOSITORY_BASELINES = ("stable", "published_blessed")
# The limits on how much worse evaluation.metric may get: each judges its own comparison (pruned against trained,
# quantized against float, candidate against baseline), all in the metric's units.
TOLERANCE_KEYS = ("optimize.max_degradation", "export.max_quantized_degradation", "evaluation.max_degradation")
# A regression's errors are in the label's units: `mlops init` writes each tolerance as this share of the label's
# standard deviation (the shipped diabetes job: 2.0 against about 77).
REGRESSION_TOLERANCE_SHARE = 0.025


def tolerance_note(key: str, kind: str, metric: str = "auto", label_std: float | None = None) -> str:
    """The clause a failed tolerance adds to its message: the other keys that limit the same metric, and for a
    regression error the label's spread, so that one edit fixes every gate."""
    metric = task_metric(kind, metric)
    others = " and ".join(k for k in TOLERANCE_KEYS if k != key)
    note = f"{others} limit the same eval {metric} in the same units, so raise them alike"
    if kind == "regression" and metric in ("rmse", "mae"):
        spread = f" (its standard deviation is {label_std:.4g})" if label_std else ""
        note += (f"; a regression's {metric} is in the label's units{spread}, and {REGRESSION_TOLERANCE_SHARE:.1%} of "
                 "that spread is a usual tolerance")
    return note


@dataclass
class EvaluationConfig:
    """The Evaluator (TFMA): the metric and the thresholds that bless a model, and the baseline it is compared with."""
    # A feature whose every value also gets its own metrics (empty: overall only).
    slice_feature: str = ""
    # The metric that blesses a model, also the one the Optimizer's and the Exporter's gates watch. auto: auc
    # (binary), macro_auc (multiclass, one-vs-rest) or rmse (regression); TASK_METRICS lists the others.
    metric: str = "auto"
    # The candidate is blessed only when its metric is at least lower_bound and at most upper_bound (null: no
    # bound) ...
    lower_bound: float | None = None
    # ... (upper_bound bounds an error metric such as rmse, where lower is better).
    upper_bound: float | None = None
    # ... and, on each metric named here, only when it beats this figure, what a predictor that ignores the
    # features scores (`mlops init` writes them from the data: the class shares' log loss, the most common class's
    # accuracy, the mean's RMSE) ...
    no_skill: dict[str, float] = field(default_factory=dict)
    # ... by this share of the gap between the figure and a perfect score (0.1: a log loss at most 0.9 times the
    # class shares', an accuracy a tenth of the way from the most common class's share to 1).
    no_skill_margin: float = 0.1
    # ... and at most this much worse than the baseline model's, in the metric's units: lower for a metric where
    # higher is better (AUC, accuracy, R²), higher for an error (RMSE, MAE, log loss).
    max_degradation: float = 0.01
    # The baseline: previous_blessed, the newest blessed model other than the candidate (a cached re-run compares
    # with what the first run compared with); latest_blessed, TFX's LatestBlessedModelStrategy, the only ML Metadata
    # resolver Vertex AI Pipelines runs; stable, the version labelled stable in the model repository the pipeline
    # publishes to, and published_blessed, its newest blessed version (both read the repository, so they run the
    # same locally, on open-source KFP and on Vertex); none, no comparison (the bounds only).
    baseline: Literal["previous_blessed", "latest_blessed", "stable", "published_blessed", "none"] = \
        "previous_blessed"


@dataclass
class DistillConfig:
    """Knowledge distillation in the Optimizer, off by default: a smaller student trained on the model's soft
    targets."""
    # A smaller student learns from the trained model's soft targets, then goes on to pruning and export.
    enabled: bool = False
    # The student's hidden layer widths.
    hidden_units: list[int] = field(default_factory=lambda: [16])
    # Softens both models' logits: higher passes more of the teacher's ranking between examples.
    temperature: float = 4.0
    # loss = alpha * hard-label loss + (1 - alpha) * temperature^2 * soft-target loss
    alpha: float = 0.3
    # Training steps of the student ...
    steps: int = 1000
    # ... at this learning rate.
    learning_rate: float = 0.005


@dataclass
class OptimizeConfig:
    """The Optimizer: magnitude pruning (and optional distillation) with a gate on the eval metric."""
    # Magnitude pruning of the Dense kernels (tensorflow-model-optimization), then strip_pruning.
    prune: bool = True
    # Fraction of each Dense kernel's weights set to zero, reached by a polynomial schedule while fine-tuning.
    target_sparsity: float = 0.5
    # Training steps while the pruning schedule runs ...
    fine_tune_steps: int = 400
    # ... at this learning rate ...
    learning_rate: float = 0.0005
    # ... on batches of this many rows.
    batch_size: int = 128
    # The pruned model fails the Optimizer when its eval metric (evaluation.metric) is more than this worse than
    # the unpruned model's, in the metric's units.
    max_degradation: float = 0.01
    distill: DistillConfig = field(default_factory=DistillConfig)


THRESHOLD_OBJECTIVES = ("f1", "min_precision")


@dataclass
class CalibrationConfig:
    """Calibration of a classifier's probabilities and its decision threshold, on the calibration split."""
    # Fitted on the data.calibration_buckets split after the Optimizer and folded into the model's output layer, so
    # every exported format serves calibrated probabilities. auto: Platt scaling (binary), temperature scaling
    # (multiclass), nothing for regression; none: the probabilities stay as trained.
    method: Literal["auto", "none"] = "auto"
    # The binary decision threshold, chosen on the calibration split's calibrated probabilities: f1, the highest
    # F1; min_precision, the highest recall whose precision is at least min_precision (the run fails when no
    # threshold reaches it). Multiclass models decide by the highest probability.
    threshold_objective: str = "f1"
    # threshold_objective min_precision: the precision the threshold must reach.
    min_precision: float = 0.8


EXPORT_FORMATS = ("saved_model", "tflite", "onnx", "tfjs")
TFLITE_VARIANTS = ("float32", "dynamic", "float16", "int8")


@dataclass
class ExportConfig:
    """The Exporter: the formats written into every version, and the tolerances that verify them."""
    # The formats written into every version: saved_model (always), tflite, onnx, tfjs.
    formats: list[str] = field(default_factory=lambda: list(EXPORT_FORMATS))
    # The TFLite variants: float32, dynamic (int8 weights), float16 (float16 weights), int8 (weights and activations).
    tflite_variants: list[str] = field(default_factory=lambda: list(TFLITE_VARIANTS))
    # Float formats (ONNX, TF.js, TFLite float32) must match every output of the SavedModel this closely (for a
    # regression model relative to the value's size: |difference| / max(1, |value|)) ...
    max_abs_diff: float = 1e-4
    # ... and the quantized TFLite variants (dynamic, float16, int8) may be at most this much worse on the eval
    # metric (evaluation.metric), in the metric's units.
    max_quantized_degradation: float = 0.01
    # Most eval rows every artifact runs on (all when the eval split is smaller), and how many of them are timed
    # one row at a time for latency.
    eval_rows: int = 2000
    # ... timed one at a time.
    latency_rows: int = 200
    # The ONNX opset tf2onnx converts to.
    onnx_opset: int = 17
    # Rows of the training split int8 quantization calibrates its ranges on.
    representative_rows: int = 1000


BEAM_RUNNERS = ("DirectRunner", "PortableRunner", "FlinkRunner", "SparkRunner", "DataflowRunner")


@dataclass
class RolloutLocalConfig:
    """`mlops serve` processes on this machine: the stable ones read <serving>/models.config, the canary ones
    <serving>/models.canary.config. One REST URL and one gRPC target per process, in the same order."""
    # REST URLs of the stable track's processes.
    stable_rest: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8501"])
    # gRPC targets of the stable track's processes.
    stable_grpc: list[str] = field(default_factory=lambda: ["127.0.0.1:8500"])
    # REST URLs of the canary track's processes.
    canary_rest: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8511"])
    # gRPC targets of the canary track's processes.
    canary_grpc: list[str] = field(default_factory=lambda: ["127.0.0.1:8510"])
    # `mlops deploy local` (rollout/local_stack.py): while it runs, its servers, router and Prometheus replace
    # the endpoints above. Its state folder (empty: <serving>/.stack), its `mlops serve` processes per track, and the
    # ports of the router's REST and gRPC frontends and of Prometheus (0: any free one).
    stack_dir: str = ""
    # `mlops deploy local`: `mlops serve` processes per track.
    servers_per_track: int = 1
    # `mlops deploy local`: the router's REST listener port ...
    router_rest_port: int = 8601
    # ... its gRPC frontend port ...
    router_grpc_port: int = 8600
    # ... and Prometheus's port.
    prometheus_port: int = 9190


@dataclass
class RolloutKubernetesConfig:
    """The objects of k8s/serving (docs/tutorials/kubernetes.md); the controller reads and patches them through the
    API."""
    # The namespace of k8s/serving's objects.
    namespace: str = "mlops-serving"
    # Empty: the in-cluster service account, else ~/.kube/config; or the path of a kubeconfig file.
    kubeconfig: str = ""
    # The ConfigMap holding the stable track's models.config ...
    stable_config_map: str = "tfserving-stable-config"
    # ... and the canary track's.
    canary_config_map: str = "tfserving-canary-config"
    # The rollout's state and recorded outcomes live in this ConfigMap, not in the controller.
    state_config_map: str = "tfserving-rollout"
    # Label selector of the stable track's pods ...
    stable_selector: str = "app.kubernetes.io/name=tfserving,app.kubernetes.io/track=stable"
    # ... and of the canary track's.
    canary_selector: str = "app.kubernetes.io/name=tfserving,app.kubernetes.io/track=canary"
    # The stable track's Service ...
    stable_service: str = "tfserving-stable"
    # ... and the canary track's, the backends the routes weigh.
    canary_service: str = "tfserving-canary"
    # The Gateway API HTTPRoute whose weights split REST traffic ...
    http_route: str = "tfserving"
    # ... and the GRPCRoute that splits gRPC traffic.
    grpc_route: str = "tfserving-grpc"
    # Where the pods mount the model repository: models.config names <served_base_dir>/<model>.
    served_base_dir: str = "/models"
    # The pods' REST port, where their metrics are read.
    rest_port: int = 8501
    # TF Serving's Prometheus page on that port.
    metrics_path: str = "/monitoring/prometheus/metrics"
    # How the controller reads each pod's model status: "pod_ip" GETs the REST port at the pod's IP (a controller in
    # the cluster, which the NetworkPolicy admits there), "api_server_proxy" goes through the API server's pod proxy
    # (a controller outside; NetworkPolicy-enforcing clusters may refuse it); "auto": pod_ip in a pod, else the proxy.
    status_reads: Literal["auto", "pod_ip", "api_server_proxy"] = "auto"
    # Golden requests go to the two Services (the controller runs in the cluster, or behind port-forwards).
    stable_rest: list[str] = field(default_factory=lambda: ["http://tfserving-stable.mlops-serving.svc:8501"])
    # The stable Service's gRPC target.
    stable_grpc: list[str] = field(default_factory=lambda: ["tfserving-stable.mlops-serving.svc:8500"])
    # The canary Service's REST URL ...
    canary_rest: list[str] = field(default_factory=lambda: ["http://tfserving-canary.mlops-serving.svc:8501"])
    # ... and its gRPC target.
    canary_grpc: list[str] = field(default_factory=lambda: ["tfserving-canary.mlops-serving.svc:8500"])


# KubeDL's Service of an Inference's predictor: <inference>-<predictor>, ports 8080 and 9000; {inference} is the
# version's Inference, <rollout.kubedl.inference>-v<version>.
KUBEDL_SERVICE_REST = "http://{inference}-{predictor}.{namespace}.svc:8080"
KUBEDL_SERVICE_GRPC = "{inference}-{predictor}.{namespace}.svc:9000"


@dataclass
class RolloutKubeDLConfig:
    """KubeDL (k8s/kubedl): one Inference per model version, `<inference>-v<version>`, behind the project's Gateway
    API routes, whose weights split the traffic (KubeDL's own trafficWeight splits nothing:
    docs/tutorials/kubedl.md)."""
    # KubeDL looks a predictor's ModelVersion up in the Inference's namespace, and a TFJob records it in its own.
    namespace: str = "mlops"
    # Empty: the in-cluster service account, else ~/.kube/config; or the path of a kubeconfig file.
    kubeconfig: str = ""
    # Each version's Inference is named <inference>-v<version>.
    inference: str = "taxi"
    # The one predictor of each version's Inference.
    predictor: str = "serve"
    # The Gateway API HTTPRoute whose weights split REST traffic between the versions' Services ...
    http_route: str = "taxi"
    # ... and the GRPCRoute for gRPC.
    grpc_route: str = "taxi-grpc"
    # The TFJob that trained version {version} (its status.modelVersionName names the ModelVersion KubeDL recorded,
    # mv-<job>-<uid>); empty: the ModelVersion is named by model_version_name (registered by hand).
    tfjob: str = ""
    # The ModelVersion of version {version}, when tfjob is empty.
    model_version_name: str = "taxi-v{version}"
    # The labels KubeDL puts on a predictor's pods ({namespace}, {inference}, {predictor} filled in).
    predictor_selector: str = "kubedl.io/inference-name={inference},kubedl.io/predictor-name={predictor}"
    # The predictor pods' REST port, where their metrics are read.
    rest_port: int = 8501
    # TF Serving's Prometheus page on that port.
    metrics_path: str = "/monitoring/prometheus/metrics"
    # How the controller reads each pod's model status: "pod_ip" GETs the REST port at the pod's IP (a controller in
    # the cluster, which the NetworkPolicy admits there), "api_server_proxy" goes through the API server's pod proxy
    # (a controller outside; NetworkPolicy-enforcing clusters may refuse it); "auto": pod_ip in a pod, else the proxy.
    status_reads: Literal["auto", "pod_ip", "api_server_proxy"] = "auto"
    # The stable version's predictor Service, REST ({inference}, {predictor}, {namespace} filled in) ...
    stable_rest: list[str] = field(default_factory=lambda: [KUBEDL_SERVICE_REST])
    # ... and gRPC.
    stable_grpc: list[str] = field(default_factory=lambda: [KUBEDL_SERVICE_GRPC])
    # The canary version's predictor Service, REST ...
    canary_rest: list[str] = field(default_factory=lambda: [KUBEDL_SERVICE_REST])
    # ... and gRPC.
    canary_grpc: list[str] = field(default_factory=lambda: [KUBEDL_SERVICE_GRPC])


@dataclass
class RolloutPrometheusConfig:
    """The Prometheus whose HTTP API the verifier queries for the servers' own TF Serving metrics, per track
    (rollout/prometheus.py); the scrape configuration that feeds it ships with k8s/serving and the local
    stack."""
    # Empty: none (the local backend without the local stack then measures the verifier's own requests).
    url: str = ""
    # The series label that names a server's track (stable or canary), as the scrape configuration sets it.
    track_label: str = "track"
    # Further PromQL label matchers that select this deployment's servers, e.g. namespace="mlops-serving".
    selector: str = ""
    # How often Prometheus scrapes the servers: a window waits at most a few of these for samples fresher than its end.
    scrape_interval_seconds: float = 5.0
    # Each query's timeout.
    request_timeout_seconds: float = 10.0


@dataclass
class RolloutShadowConfig:
    """The shadow step before the first user step (rollout/shadow.py): the router copies a share of the live requests
    to the candidate, whose answers no user gets, and they are compared with stable's answers to the same requests.
    Needs a router that mirrors: the local stack's Envoy (`mlops deploy local`) or a Gateway API implementation of
    HTTPRoute and GRPCRoute RequestMirror (k8s/serving); without one the 0% step is the verifier's own window."""
    # Percent of the live requests copied to the candidate; 0: no shadow step.
    percent: int = 100
    # Requests answered by both versions a shadow window needs before it can pass (it is extended, then inconclusive).
    min_requests: int = 200
    # The largest share of rows on which the candidate's decision (binary: at each version's calibrated threshold;
    # multiclass: the class) differs from stable's, or its value by more than max_relative_error (regression) ...
    max_disagreement_rate: float = 0.01
    # ... that relative error (regression). Both also judge the golden rows at every step, with or without a mirror.
    max_relative_error: float = 0.05
    # The largest distance between the two versions' score distributions on the same requests: Wasserstein (binary
    # probabilities; for regression values, relative to stable's mean absolute value) or total variation (multiclass).
    max_score_distance: float = 0.05
    # The candidate's p99 time to answer may be at most this many times stable's on the same requests.
    max_latency_ratio: float = 3.0
    # The rows that disagree most, kept in the state and the report.
    examples: int = 5


@dataclass
class RolloutConfig:
    """`mlops rollout`: how a candidate version is verified and moved through traffic steps (rollout)."""
    # local: `mlops serve` processes on this machine; kubernetes: k8s/serving; kubedl: k8s/kubedl.
    backend: Literal["local", "kubernetes", "kubedl"] = "local"
    # Percent of traffic on the canary after each verified step; the last must be 100, then the candidate is promoted.
    steps: list[int] = field(default_factory=lambda: [10, 50, 100])
    # Golden requests: eval rows (a CSV file or folder; empty: the pipeline's newest eval split) ...
    golden_data: str = ""
    # ... this many of them ...
    golden_rows: int = 64
    # ... which the candidate must answer over REST and over gRPC this close to each other; its decisions on them are
    # held to stable's by shadow.max_disagreement_rate (a retrained version's probabilities differ from stable's).
    max_abs_diff: float = 0.001
    # Each step watches the users' requests for this long, then judges them; a window with too few canary requests
    # to decide is watched this much longer again, up to max_window_extensions times.
    window_seconds: float = 30.0
    # ... after which a window still short of the canary user requests its step needs is inconclusive, never passed.
    max_window_extensions: int = 4
    # Without a metrics source (rollout.prometheus.url, or the stack of `mlops deploy local`) the window is the
    # verifier's own requests to the canary, at most this many per second.
    window_requests_per_second: float = 20.0
    # The canary's largest error rate over its user requests: failed when an exact binomial test finds it above.
    max_error_rate: float = 0.01
    # ... and its largest 99th-percentile latency, in milliseconds.
    max_p99_ms: float = 250.0
    # Beside the absolute limits, the canary against stable over the same window: its error rate may exceed stable's
    # by at most this much, and its p99 may be at most this many times stable's (TF Serving's latency buckets grow
    # 1.8x each: 3.0 allows one bucket up, not two; judged when stable served 20 predictions or more).
    max_error_rate_increase: float = 0.005
    # ... and its p99 at most this many times stable's.
    max_p99_ratio: float = 3.0
    # The smallest rise of the canary's user error rate over stable's worth catching: a step passes only with enough
    # canary user requests to catch it (failing 5% of requests more than stable) with probability detection_power;
    # docs/concepts/rollout.md lists the requests that takes at each step.
    min_error_rate_regression: float = 0.05
    # ... that probability.
    detection_power: float = 0.95
    # The chance that a healthy canary (failing as often as stable, within max_error_rate) is rolled back on its error
    # rate over a whole rollout; the exact tests' significance is shared out from it (rollout/evidence.py).
    false_rollback_rate: float = 0.01
    # A window whose figures cannot be trusted (no data, a partial scrape, a counter reset, a canary share of the
    # traffic further than this many binomial standard deviations from the step's weight) is inconclusive, never a
    # pass; after this many in a row the rollout rolls back, or pauses with its state saying why.
    max_inconclusive_windows: int = 3
    # What too many inconclusive windows in a row do: roll back, or pause with the reason in the state.
    on_inconclusive: Literal["rollback", "pause"] = "rollback"
    # How far the canary's measured share of the traffic may be from the step's weight, in binomial standard deviations.
    share_tolerance_sigmas: float = 4.0
    # Before each step, the candidate's own logged requests since the rollout began judged for skew against its
    # training statistics at the monitoring section's thresholds (rollout/skew.py): a candidate trained on data
    # unlike what it now receives is rolled back, whatever its error rate. Needs serving.request_log on the canary.
    skew_check: bool = False
    # Fewer logged candidate requests than this leave the skew check inconclusive, never passed: a small sample's
    # distances are mostly sampling noise.
    skew_min_requests: int = 1000
    # Only this many finished rollouts stay in the state document (a ConfigMap holds at most 1 MiB); every outcome
    # is also written to the reports.
    history_limit: int = 20
    # A second controller for the same model waits this long for the first's lease (0: refuses at once).
    lease_wait_seconds: float = 0.0
    # How long a controller's Kubernetes Lease stays valid without a renewal.
    lease_duration_seconds: float = 30.0
    # How long a loading version may take to become AVAILABLE before the rollout is rolled back.
    load_timeout_seconds: float = 300.0
    # After a promotion the previous version stays loaded this long, so a rollback needs no load.
    keep_previous_seconds: float = 300.0
    # Each request the controller makes (golden requests, version status, Prometheus, the backend's API).
    request_timeout_seconds: float = 5.0
    # How often the controller polls a loading version's status.
    poll_seconds: float = 0.5
    prometheus: RolloutPrometheusConfig = field(default_factory=RolloutPrometheusConfig)
    shadow: RolloutShadowConfig = field(default_factory=RolloutShadowConfig)
    local: RolloutLocalConfig = field(default_factory=RolloutLocalConfig)
    kubernetes: RolloutKubernetesConfig = field(default_factory=RolloutKubernetesConfig)
    kubedl: RolloutKubeDLConfig = field(default_factory=RolloutKubeDLConfig)


@dataclass
class RequestLogConfig:
    """Sampled predictions and their answers as TF Serving's PredictionLog TFRecords, written by `mlops serve` and
    `mlops log-proxy` under <directory>/<model>/ (serving/server/request_log.py, docs/tutorials/monitoring.md)."""
    # Log sampled predictions at all.
    enabled: bool = False
    # Any folder or URI tf.io.gfile writes (gs://bucket/logs); empty: <output_root>/request_logs.
    directory: str = ""
    # Share of successful predictions logged, drawn per request (TF Serving's SamplingConfig.sampling_rate).
    sampling_rate: float = 1.0
    # A file is closed and the next one started at this size or this age, whichever comes first ...
    max_file_bytes: int = 64 * 1024 * 1024
    # ... or this many seconds after its first record.
    max_file_seconds: float = 300.0
    # ... and a model's folder keeps at most this many files, the oldest deleted first.
    max_files: int = 100
    # Records waiting for the writer thread; beyond this, records are dropped and counted, never waited for.
    queue_size: int = 10000


@dataclass
class ServingConfig:
    """`mlops serve` and `mlops log-proxy` (serving/): what the servers do beside answering."""
    request_log: RequestLogConfig = field(default_factory=RequestLogConfig)


# The CSV rows up to which beam.direct_running_mode=auto runs Beam in this process: on 2 cores the data stages took
# as long in_memory (one worker) as multi_processing at about 470,000 rows (benchmarks.data_stages --modes;
# docs/benchmarks.md).
IN_MEMORY_MAX_ROWS = 450_000


@dataclass
class BeamConfig:
    """The Beam runner of the data stages (ExampleGen, StatisticsGen, Transform, Evaluator); pipeline/beam.py turns
    it into beam_pipeline_args. Each runner's keys are grouped below; docs/concepts/beam.md says what to supply."""
    # The short names (direct, flink, spark, dataflow) stand for Beam's runner classes; load_config turns them into
    # the class names.
    runner: Literal["DirectRunner", "PortableRunner", "FlinkRunner", "SparkRunner", "DataflowRunner",
                    "direct", "flink", "spark", "dataflow"] = "DirectRunner"
    # DirectRunner: one process, threads, or worker processes; 0 workers means one per CPU (in_memory: always one
    # worker, pipeline/beam.py). auto: in_memory for
    # local CSV data of at most in_memory_max_rows rows (each worker process would import TensorFlow for seconds),
    # multi_processing above or where the rows cannot be counted (docs/benchmarks.md measured the crossover).
    direct_running_mode: Literal["auto", "in_memory", "multi_threading", "multi_processing"] = "auto"
    # DirectRunner's worker count (0: one per CPU).
    direct_num_workers: int = 0
    # direct_running_mode auto: the CSV rows up to which Beam runs in this process.
    in_memory_max_rows: int = IN_MEMORY_MAX_ROWS
    # PortableRunner: a Beam job service (host:port), such as Flink's or Spark's job server, or Beam's own.
    # FlinkRunner: a standing Flink job server (`mlops cluster flink status` prints it), or else flink_master.
    job_endpoint: str = ""
    # FlinkRunner without job_endpoint: the Flink REST endpoint (host:8081), for which Beam starts a job server of its
    # own; SparkRunner: the Spark master (spark://host:7077).
    flink_master: str = ""
    # SparkRunner: the Spark master, spark://host:7077.
    spark_master_url: str = ""
    # Portable runners (Portable, Flink, Spark): where the Python SDK workers run. DOCKER: a container of
    # environment_config (an image with Beam 2.61 and requirements.lock); EXTERNAL: a worker pool at
    # environment_config (host:port); PROCESS: a command; LOOPBACK: this process (tests only).
    environment_type: Literal["DOCKER", "EXTERNAL", "PROCESS", "LOOPBACK"] = "DOCKER"
    # The image (DOCKER), the pool's host:port (EXTERNAL) or the boot command (PROCESS).
    environment_config: str = ""
    # Flink and Spark parallelism (0: the runner's default).
    parallelism: int = 0
    # DataflowRunner: the Google Cloud project and region, a gs:// folder for temporary and staged files, and the
    # SDK container image (empty: Dataflow's own, which installs the project from setup.py).
    project: str = ""
    # DataflowRunner: the region ...
    region: str = ""
    # ... a gs:// folder for temporary and staged files ...
    temp_location: str = ""
    # ... and the SDK container image (empty: Dataflow's own).
    sdk_container_image: str = ""
    # Any other Beam option, passed as written, after the ones above (for example --max_num_workers=20).
    extra_args: list[str] = field(default_factory=list)


@dataclass
class FlinkClusterConfig:
    """`mlops cluster flink start|stop|status` (pipeline/flink_cluster.py): a standing Flink cluster on this machine,
    one JobManager and `taskmanagers` TaskManagers on loopback ports, with Beam's Flink job server and a pool of
    Python SDK workers from this project's environment beside it."""
    # Where the cluster keeps its generated Flink conf, logs and state file (ports, process ids). Empty:
    # <output_root>/flink-cluster.
    state_dir: str = ""
    # The folder `make flink` fills: Flink 1.19 from PyPI (requirements-flink.lock) and the job server's classpath
    # from the local Maven repository; a relative path is read from the project's root.
    flink_env: str = ".venv-flink"
    # TaskManager processes ...
    taskmanagers: int = 2
    # ... and the task slots of each.
    slots_per_taskmanager: int = 1
    # Flink's total process memory per JVM (Flink's memory syntax): sized to fit four JVMs beside the pipeline.
    jobmanager_memory: str = "1024m"
    # Each TaskManager's total process memory.
    taskmanager_memory: str = "1536m"
    # Each TaskManager's task off-heap memory (Flink's default 0m), which raises its JVM's direct-memory cap: Beam's
    # Fn API buffers (gRPC on Netty) are direct memory, and 10x the taxi sample ran out of it at the default
    # (benchmarks/beam_runners.py sets 512m with taskmanager_memory=3072m).
    taskmanager_task_off_heap_memory: str = "0m"
    # How long `start` waits for every TaskManager to register and the job server to listen.
    start_timeout_s: float = 180.0


@dataclass
class ClusterConfig:
    """Engines `mlops cluster` starts on this machine for the Beam stages (docs/concepts/beam.md)."""
    flink: FlinkClusterConfig = field(default_factory=FlinkClusterConfig)


@dataclass
class KubeflowTaskConfig:
    """What Kubernetes and KFP give a task of the compiled pipeline; empty or null: not set (the cluster's default,
    or for a component, the value of kubeflow.tasks)."""
    # Kubernetes quantities: CPU in cores ("2", "500m"), memory in bytes with a unit ("4Gi", "512Mi", "8G").
    cpu_request: str | float = ""
    # The CPU limit (cpu_request above is the request).
    cpu_limit: str | float = ""
    # The memory request ...
    memory_request: str = ""
    # ... and limit.
    memory_limit: str = ""
    # How often KFP starts a failed task again, the first time after retry_backoff_seconds, then twice as long.
    retries: int | None = None
    # ... and the wait before the first retry, in seconds.
    retry_backoff_seconds: int | None = None


@dataclass
class KubeflowConfig:
    """`mlops compile kubeflow` and `mlops submit kubeflow`: the same DAG on Kubeflow Pipelines V2
    (docs/tutorials/kubeflow.md)."""
    # The project's image (the Dockerfile at the repository root), pushed where the cluster pulls it; every
    # component runs in it. Tag it per build: KFP's cache keys on the image.
    image: str = "tfx-mlops:latest"
    # Where runs on the cluster write, as output_root does locally: <output_root>/pipelines/<name> (the pipeline
    # root) and <output_root>/serving/<model_name> (published versions). A gs:// bucket the cluster writes, such as
    # gs://bucket/tfx-mlops: the Publisher refuses other object stores (no atomic publish there).
    output_root: str = ""
    # The CSV folder as the cluster reads it (a URI); empty: the Chicago taxi sample inside the image.
    data_path: str = ""
    # mlops submit kubeflow: the KFP API (overridden by --host), the experiment and the user namespace of a
    # multi-user deployment (empty for a single-user one).
    host: str = ""
    # ... the KFP experiment runs are filed under ...
    experiment: str = "tfx-mlops"
    # ... and the user namespace (empty on a single-user deployment).
    namespace: str = ""
    # KFP's cache for every task of the compiled pipeline (ServingBaseline never: it reads the repository, no input).
    enable_cache: bool = True
    # Resources and retries of every task ...
    tasks: KubeflowTaskConfig = field(default_factory=KubeflowTaskConfig)
    # ... and per component, by node id (Trainer, Transform, Evaluator, ...), over those of `tasks`.
    components: dict[str, KubeflowTaskConfig] = field(default_factory=dict)


@dataclass
class MonitoringFeatureConfig:
    """One feature's thresholds over the monitoring section's defaults for its kind (null: that default)."""
    # This feature's skew threshold ...
    skew: float | None = None
    # ... and its drift threshold.
    drift: float | None = None


@dataclass
class MonitoringConfig:
    """`mlops monitor` (monitoring/): the logged requests' TFDV statistics against the serving version's training
    statistics (skew) and against the window before (drift), each distance held to a threshold. It reads the logs
    where the servers write them: serving.request_log.directory."""
    # Each run writes monitor.html, monitor.json and metrics.prom into <output_dir>/<model_name>/<UTC time>/, and the
    # metrics also to <output_dir>/<model_name>.prom for node-exporter's textfile collector; empty:
    # <output_root>/monitoring.
    output_dir: str = ""
    # The window without --since or --last: the last this many logged requests.
    window_requests: int = 10000
    # A window with fewer requests is reported but not judged (exit code 0): the L-infinity distance between two
    # samples of 400 taxi rows reaches 0.07 on company by chance alone.
    min_requests: int = 1000
    # Skew: the L-infinity distance between a categorical (string) feature's value shares in training and in the
    # window ...
    categorical_skew: float = 0.1
    # ... and the approximate Jensen-Shannon divergence between a numeric feature's quantile histograms (two samples
    # of the same taxi data reach 0.18: TFDV compares 10-bucket histograms).
    numeric_skew: float = 0.25
    # Drift: the same distances between the window and the window of the same length just before it.
    categorical_drift: float = 0.1
    # ... and for numeric features.
    numeric_drift: float = 0.25
    # Per feature, over the defaults of its kind: e.g. fare: {skew: 0.3}.
    features: dict[str, MonitoringFeatureConfig] = field(default_factory=dict)
    # A Prometheus Pushgateway (http://host:9091) the distances are PUT to as the group job/<pushgateway_job>/model/
    # <model_name>; empty: none (--pushgateway sets one).
    pushgateway: str = ""
    # The Pushgateway job name.
    pushgateway_job: str = "mlops_monitor"
    # The Pushgateway PUT's timeout.
    request_timeout_seconds: float = 10.0
    # `mlops monitor --retrain` runs the pipeline when a threshold is crossed, but not when a monitor run of the last
    # this many hours already started a retrain for the same serving version: until the new version is rolled out
    # the same traffic crosses the same threshold at every scheduled run. 0: every crossing retrains.
    retrain_cooldown_hours: float = 24.0


@dataclass
class PipelineConfig:
    """The pipeline's name, where it writes, and the keys every section below hangs from."""
    # The pipeline's name in ML Metadata, its root (<artifact_root>/<name>) and its run logs.
    name: str = "pipeline"
    # Name of the served model: <output_root>/serving/<model_name>/<version>/.
    model_name: str = "model"
    # Everything the pipeline writes lands below this folder ...
    output_root: str = "outputs"
    # ... except the artifacts, when this is set: a folder or a URI that TensorFlow and Beam both write (gs://bucket
    # /path). Empty: <output_root>/pipelines. ML Metadata's SQLite database stays below output_root.
    artifact_root: str = ""
    # Curated schema; a relative path is looked up beside the config file.
    schema_path: str = ""
    # TFX's cache: a stage whose inputs, properties and module code are unchanged reuses its last output.
    enable_cache: bool = True
    # Local runs: how many stages may run at once, each as soon as the stages it needs are done (the Exporter
    # beside the Evaluator); 1 runs them one after another, as TFX's LocalDagRunner does.
    parallel_stages: int = 2
    data: DataConfig = field(default_factory=DataConfig)
    label: LabelConfig = field(default_factory=LabelConfig)
    transform: TransformConfig = field(default_factory=TransformConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    tuner: TunerConfig = field(default_factory=TunerConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    optimize: OptimizeConfig = field(default_factory=OptimizeConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    beam: BeamConfig = field(default_factory=BeamConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    kubeflow: KubeflowConfig = field(default_factory=KubeflowConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)

    @property
    def features(self) -> list[str]:
        return (self.data.numeric_features + self.data.bucket_features + self.data.vocab_features
                + self.data.category_features + list(self.data.datetime_features))

    @property
    def pipeline_root(self) -> str:
        """Where TFX writes this pipeline's artifacts: a local folder or a URI."""
        return posixpath.join(self.artifact_root or os.path.join(self.output_root, "pipelines"), self.name)

    @property
    def flink_cluster_dir(self) -> str:
        """Where `mlops cluster flink` keeps the standing cluster's conf, logs and state file."""
        return self.cluster.flink.state_dir or os.path.join(self.output_root, "flink-cluster")

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.output_root, "metadata", self.name, "metadata.db")

    @property
    def serving_base_dir(self) -> str:
        """The model repository: <model>/<version>/ folders, models.config and models.canary.config."""
        return os.path.join(self.output_root, "serving")

    @property
    def monitoring_dir(self) -> str:
        """Where `mlops monitor` writes its pages, records and metrics."""
        return self.monitoring.output_dir or os.path.join(self.output_root, "monitoring")

    @property
    def serving_dir(self) -> str:
        return os.path.join(self.serving_base_dir, self.model_name)

    @property
    def request_log_dir(self) -> str:
        """Where request logs go: <request_log_dir>/<model>/requests-*.tfrecord (a folder or a URI)."""
        return self.serving.request_log.directory or os.path.join(self.output_root, "request_logs")

    def resolved_training(self) -> TrainingConfig:
        """The training section as the Trainer receives it: a TFJob mounts the pipeline root where this machine
        sees it unless training.tfjob.mount_path says otherwise."""
        if self.training.backend != "tfjob" or self.training.tfjob.mount_path:
            return self.training
        tfjob = dataclasses.replace(self.training.tfjob, mount_path=os.path.abspath(self.output_root))
        return dataclasses.replace(self.training, tfjob=tfjob)

    def sections(self, *names: str) -> dict[str, Any]:
        """The named sections as plain values, the form they cross a component boundary in (`read_section` turns
        each back into its dataclass). Each component gets only the sections it reads, so that editing a later
        stage's settings keeps the earlier stages cached."""
        values = {}
        for name in names:
            section = self.resolved_training() if name == "training" else getattr(self, name)
            if not dataclasses.is_dataclass(section):
                raise KeyError(f"'{name}' is not a config section; sections are {', '.join(SECTION_TYPES)}.")
            values[name] = dataclasses.asdict(section)
        return values


T = TypeVar("T")
# Section name -> its dataclass: what `sections` writes and `read_section` reads back.
SECTION_TYPES: dict[str, type] = {
    name: tp for name, tp in typing.get_type_hints(PipelineConfig).items() if dataclasses.is_dataclass(tp)
}


def read_section(properties: Mapping[str, Any], name: str, cls: type[T]) -> T:
    """The typed section `name` from a component's properties or custom_config (a dict or its JSON), validated as
    the YAML is; raises ConfigError naming the key when it is missing or malformed."""
    if name not in properties or properties[name] is None:
        raise ConfigError(f"the component received no '{name}' section; build the pipeline with create_pipeline.")
    value = properties[name]
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        raise ConfigError(f"config section '{name}' must be a mapping, got {type(value).__name__}.")
    return _build(cls, dict(value), f"{name}.")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping of column names to {_type_name(typing.get_args(tp)[1])}"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false",
            type(None): "null"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is dict:
        if isinstance(value, dict):
            item_type = typing.get_args(tp)[1]
            return {str(name): _coerce(item, item_type, f"{key}.{name}") for name, item in value.items()}
    elif origin is Literal:
        if value in typing.get_args(tp):
            return value
    elif origin in (typing.Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _coerce(value, option, key)
            except ConfigError:
                pass
    elif origin is list:
        if isinstance(value, list):
            (item_type,) = typing.get_args(tp)
            return [_coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            # YAML 1.1 reads exponents without a dot (1e-4) as strings.
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"config key '{key}' must be {_type_name(tp)}, got {value!r}.")


# Keys a newer version renamed: a config that still uses one is told the new name.
RENAMED_KEYS = {
    "evaluation.min_auc": "evaluation.lower_bound (with evaluation.metric: auc)",
    "evaluation.min_accuracy": "evaluation.no_skill.accuracy (the most common class's share; the bound lies "
                               "evaluation.no_skill_margin beyond it)",
    "evaluation.max_auc_drop": "evaluation.max_degradation",
    "optimize.max_auc_drop": "optimize.max_degradation",
    "export.max_quantized_auc_drop": "export.max_quantized_degradation",
}


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        full = f"{prefix}{key}"
        if full in RENAMED_KEYS:
            raise ConfigError(f"config key '{full}' is now {RENAMED_KEYS[full]}; rename it.")
        if key not in names:
            raise ConfigError(
                f"unknown config key '{full}'; valid keys here are: {', '.join(prefix + n for n in names)}."
            )
        tp = hints[key]
        if typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            # A mapping of names to one section type (kubeflow.components): each value built like a section.
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{full}' must be a mapping of names to mappings.")
            item = typing.get_args(tp)[1]
            built = {}
            for name, entry in value.items():
                if not isinstance(entry, dict):
                    raise ConfigError(f"config key '{full}.{name}' must be a mapping of "
                                      f"{', '.join(_field_names(item))}.")
                built[str(name)] = _build(item, entry, f"{full}.{name}.")
            kwargs[key] = built
        elif dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"config key '{full}' must be a mapping of {', '.join(_field_names(tp))}.")
            kwargs[key] = _build(tp, value, f"{full}.")
        else:
            kwargs[key] = _coerce(value, tp, full)
    return cls(**kwargs)


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _apply_override(tree: dict[str, Any], override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override '{override}' must look like key.sub=value, for example training.train_steps=100.")
    dotted, raw = override.split("=", 1)
    parts = dotted.strip().split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{override}': '{part}' is not a section.")
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        # Text YAML cannot read as a value (a date format starting with %) is the string as typed.
        node[parts[-1]] = raw


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Reads the YAML config at `path` (the taxi default when None), applies `key=value` overrides, validates."""
    config_path = Path(path) if path else DEFAULT_CONFIG
    try:
        text = config_path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {config_path}: {e.strerror}; pass an existing YAML file.") from e
    try:
        tree = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {config_path} is not valid YAML: {e}") from e
    if not isinstance(tree, dict):
        valid = ", ".join(_field_names(PipelineConfig))
        raise ConfigError(f"config file {config_path} must hold a mapping of {valid}.")
    for override in overrides or []:
        _apply_override(tree, override)
    config = _build(PipelineConfig, tree, "")
    if config.schema_path and not os.path.isabs(config.schema_path):
        beside = config_path.parent / config.schema_path
        if beside.exists():
            config.schema_path = str(beside)
    _validate(config)
    return config


def _validate(config: PipelineConfig) -> None:
    if not config.features:
        raise ConfigError("no features configured: set data.numeric_features, data.bucket_features, "
                          "data.vocab_features, data.category_features or data.datetime_features.")
    if not config.label.column:
        raise ConfigError("label.column is empty: name the raw column the label is computed from.")
    if config.label.column in config.features:
        raise ConfigError(f"label.column '{config.label.column}' is also listed as a feature; remove it from data.*.")
    seen: dict[str, str] = {}
    for group in ("numeric_features", "bucket_features", "vocab_features", "category_features", "datetime_features"):
        for name in getattr(config.data, group):
            if name in seen:
                where = f"twice in data.{group}" if seen[name] == group else f"in data.{seen[name]} and data.{group}"
                raise ConfigError(f"feature '{name}' is listed {where}; keep one.")
            seen[name] = group
    for name in config.features:
        if not FEATURE_NAME.fullmatch(name):
            raise ConfigError(f"feature '{name}' cannot name a model input (every export format takes lower-case "
                              "letters, digits and _ only, a letter first); a CSV column named so is read as the "
                              f"feature '{usable_name(name)}': list it under that name.")
    for column, fmt in config.data.datetime_features.items():
        for part in datetime_parts(datetime_fields(fmt, f"data.datetime_features.{column}")):
            if f"{column}_{part}" in seen:
                raise ConfigError(f"data.datetime_features.{column} derives the feature '{column}_{part}', which is "
                                  f"also listed in data.{seen[f'{column}_{part}']}; rename or remove that column.")
    if config.evaluation.slice_feature and config.evaluation.slice_feature not in config.features:
        raise ConfigError(f"evaluation.slice_feature '{config.evaluation.slice_feature}' is not a feature.")
    _validate_task(config.label, config.evaluation)
    for key in ("train_steps", "eval_steps", "steps_per_epoch", "batch_size"):
        if getattr(config.training, key) < 1:
            raise ConfigError(f"training.{key} must be at least 1.")
    _validate_distribution(config)
    if not config.training.hidden_units:
        raise ConfigError("training.hidden_units must list at least one layer size.")
    if not 0.0 <= config.training.dropout < 1.0:
        raise ConfigError("training.dropout must be in [0, 1).")
    for key, rate in (("training.learning_rate", config.training.learning_rate),
                      ("optimize.learning_rate", config.optimize.learning_rate),
                      ("optimize.distill.learning_rate", config.optimize.distill.learning_rate)):
        if not rate > 0.0:  # NaN too: a run that learns nothing would only be found unblessed at its end
            raise ConfigError(f"{key} must be positive; got {rate}.")
    _validate_optimize_and_export(config)
    _validate_calibration(config)
    _validate_rollout(config.rollout)
    _validate_beam(config.beam)
    _absolute_paths_for_portable_workers(config)
    flink = config.cluster.flink
    if flink.taskmanagers < 1 or flink.slots_per_taskmanager < 1:
        raise ConfigError("cluster.flink.taskmanagers and cluster.flink.slots_per_taskmanager must be 1 or more.")
    _validate_kubeflow(config.kubeflow)
    _validate_request_log(config.serving.request_log)
    _validate_monitoring(config.monitoring, config.features)
    if config.parallel_stages < 1:
        raise ConfigError(f"parallel_stages must be 1 or more; got {config.parallel_stages}.")
    if not config.schema_path:
        raise ConfigError("schema_path is empty: point it at a curated schema.pbtxt.")
    if not os.path.isfile(config.schema_path):
        raise ConfigError(f"schema file {config.schema_path} does not exist; fix schema_path.")


def _validate_task(label: LabelConfig, evaluation: EvaluationConfig) -> None:
    if label.kind != "binary":
        for key in ("relative_to", "positive_value"):
            if getattr(label, key):
                raise ConfigError(f"label.{key} defines a binary label, but label.kind is {label.kind}; remove it or "
                                  "set label.kind=binary.")
    metrics = TASK_METRICS[label.kind]
    if evaluation.metric != "auto" and evaluation.metric not in metrics:
        raise ConfigError(f"evaluation.metric '{evaluation.metric}' does not judge a {label.kind} model; choose auto, "
                          f"{', '.join(metrics)}.")
    lower, upper = evaluation.lower_bound, evaluation.upper_bound
    if evaluation.baseline == "none" and lower is None and upper is None and not evaluation.no_skill:
        raise ConfigError("evaluation.baseline is none and no bound is set, so nothing could bless a model; set "
                          "evaluation.lower_bound, evaluation.upper_bound or evaluation.no_skill.")
    for name, figure in evaluation.no_skill.items():
        if name not in metrics:
            raise ConfigError(f"evaluation.no_skill.{name} names no metric of a {label.kind} model; name "
                              f"{', '.join(metrics)}, or remove it.")
        top = 1.0 if metrics[name] else math.inf
        if not 0.0 <= figure <= top:
            raise ConfigError(f"evaluation.no_skill.{name} ({figure}) is not a {name} a model can score (from 0 to "
                              f"{top:g}); write the figure a predictor that ignores the features scores, or remove it.")
    if not 0.0 <= evaluation.no_skill_margin < 1.0:
        raise ConfigError(f"evaluation.no_skill_margin ({evaluation.no_skill_margin}) must be from 0 (just beat "
                          "evaluation.no_skill) to below 1 (a perfect score).")
    if lower is not None and upper is not None and lower > upper:
        raise ConfigError(f"evaluation.lower_bound ({lower}) is above evaluation.upper_bound ({upper}), so no model "
                          "could be blessed; swap or remove one.")


def _validate_optimize_and_export(config: PipelineConfig) -> None:
    optimize, export = config.optimize, config.export
    if not 0.0 < optimize.target_sparsity < 1.0:
        raise ConfigError("optimize.target_sparsity must be between 0 and 1 (0.5 zeroes half of each kernel).")
    if optimize.prune and optimize.fine_tune_steps < 1:
        raise ConfigError("optimize.fine_tune_steps must be at least 1 when optimize.prune is true.")
    distill = optimize.distill
    if distill.enabled and (not distill.hidden_units or distill.steps < 1 or distill.temperature <= 0
                            or not 0.0 <= distill.alpha <= 1.0):
        raise ConfigError("optimize.distill needs hidden_units, steps >= 1, temperature > 0 and alpha in [0, 1].")
    unknown = [f for f in export.formats if f not in EXPORT_FORMATS]
    if unknown or "saved_model" not in export.formats:
        raise ConfigError(f"export.formats must include saved_model (TF Serving loads it) and may add tflite, onnx, "
                          f"tfjs; got {export.formats}.")
    unknown = [v for v in export.tflite_variants if v not in TFLITE_VARIANTS]
    if unknown or ("tflite" in export.formats and not export.tflite_variants):
        raise ConfigError(f"export.tflite_variants must be some of {', '.join(TFLITE_VARIANTS)}; got "
                          f"{export.tflite_variants}.")
    if export.eval_rows < 100:
        raise ConfigError("export.eval_rows must be at least 100 (default 2000): the formats are compared on that "
                          "many eval rows.")
    if not 1 <= export.latency_rows <= export.eval_rows:
        raise ConfigError("export.latency_rows must be between 1 and export.eval_rows.")
    if len(export.formats) > 1 and config.transform.oov_buckets != 1:
        raise ConfigError(f"transform.oov_buckets is {config.transform.oov_buckets}, but TFLite, ONNX and TF.js "
                          "cannot reproduce TensorFlow's hashing of unseen values into several buckets; set "
                          "transform.oov_buckets=1, or export.formats=[saved_model].")


def _validate_calibration(config: PipelineConfig) -> None:
    calibration, buckets = config.calibration, config.data.calibration_buckets
    if buckets < 0:
        raise ConfigError("data.calibration_buckets must be 0 (no calibration split) or more.")
    if calibration.threshold_objective not in THRESHOLD_OBJECTIVES:
        raise ConfigError(f"calibration.threshold_objective '{calibration.threshold_objective}' is unknown; choose "
                          f"{' or '.join(THRESHOLD_OBJECTIVES)}.")
    if not 0.0 < calibration.min_precision <= 1.0:
        raise ConfigError(f"calibration.min_precision must be in (0, 1], got {calibration.min_precision}.")
    if buckets and config.label.kind == "regression":
        raise ConfigError("data.calibration_buckets sets rows aside to calibrate probabilities, which a regression "
                          "model does not output; set data.calibration_buckets=0.")
    if buckets and calibration.method == "none":
        raise ConfigError("data.calibration_buckets sets rows aside that calibration.method=none never uses; set "
                          "data.calibration_buckets=0 or calibration.method=auto.")


# Kubernetes quantities as KFP takes them: cores or millicores; bytes with a decimal or binary unit.
CPU_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|[0-9]+m)$")
MEMORY_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$")


def quantity(value: str | float) -> str:
    """A CPU quantity as Kubernetes writes it: 2.0 is "2"."""
    return f"{value:g}" if isinstance(value, float) else value


def _validate_kubeflow(kubeflow: KubeflowConfig) -> None:
    for prefix, task in [("kubeflow.tasks", kubeflow.tasks),
                         *((f"kubeflow.components.{name}", t) for name, t in kubeflow.components.items())]:
        for key, pattern, example in (("cpu_request", CPU_QUANTITY, "2 or 500m"),
                                      ("cpu_limit", CPU_QUANTITY, "2 or 500m"),
                                      ("memory_request", MEMORY_QUANTITY, "4Gi or 512Mi"),
                                      ("memory_limit", MEMORY_QUANTITY, "4Gi or 512Mi")):
            value = getattr(task, key)
            if value != "" and not pattern.match(quantity(value)):
                raise ConfigError(f"{prefix}.{key} {value!r} is not a Kubernetes quantity; write it like {example}.")
        for key in ("retries", "retry_backoff_seconds"):
            if (getattr(task, key) or 0) < 0:
                raise ConfigError(f"{prefix}.{key} must be 0 or more; got {getattr(task, key)}.")


def _validate_request_log(request_log: RequestLogConfig) -> None:
    if not 0.0 <= request_log.sampling_rate <= 1.0:
        raise ConfigError(f"serving.request_log.sampling_rate must be a share from 0 to 1 (0.1 logs one request in "
                          f"ten); got {request_log.sampling_rate}.")
    for key in ("max_file_bytes", "max_file_seconds", "max_files", "queue_size"):
        if getattr(request_log, key) <= 0:
            raise ConfigError(f"serving.request_log.{key} must be positive; got {getattr(request_log, key)}.")


MONITORING_THRESHOLDS = ("categorical_skew", "numeric_skew", "categorical_drift", "numeric_drift")


def _validate_monitoring(monitoring: MonitoringConfig, features: list[str]) -> None:
    # Both distances lie between 0 (the same distribution) and 1 (no value in common).
    for key in MONITORING_THRESHOLDS:
        if not 0.0 <= getattr(monitoring, key) <= 1.0:
            raise ConfigError(f"monitoring.{key} is {getattr(monitoring, key)}, but the distance it bounds lies "
                              "between 0 and 1; set a value in [0, 1].")
    for name, thresholds in monitoring.features.items():
        if name not in features:
            raise ConfigError(f"monitoring.features.{name} is not a feature of this config; use one of "
                              f"{', '.join(features)}.")
        for key in ("skew", "drift"):
            value = getattr(thresholds, key)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ConfigError(f"monitoring.features.{name}.{key} is {value}, but the distance it bounds lies "
                                  "between 0 and 1; set a value in [0, 1] or null.")
    for key in ("window_requests", "min_requests"):
        if getattr(monitoring, key) < 1:
            raise ConfigError(f"monitoring.{key} must be at least 1; got {getattr(monitoring, key)}.")
    if monitoring.request_timeout_seconds <= 0:
        raise ConfigError("monitoring.request_timeout_seconds must be positive.")
    if not monitoring.pushgateway_job:
        raise ConfigError("monitoring.pushgateway_job is empty; name the Pushgateway job, e.g. mlops_monitor.")
    if not 0 <= monitoring.retrain_cooldown_hours < float("inf"):
        raise ConfigError(f"monitoring.retrain_cooldown_hours is {monitoring.retrain_cooldown_hours}; set 0 (every "
                          "crossing retrains) or a positive number of hours, e.g. 24.")


def _absolute_paths_for_portable_workers(config: PipelineConfig) -> None:
    """A portable runner's SDK workers run in a folder of their own (a local Flink cluster's, a worker pool's): a
    relative local data path or output root names nothing there, so each becomes absolute, read from this folder as
    a local run reads it."""
    if config.beam.runner not in ("PortableRunner", "FlinkRunner", "SparkRunner"):
        return
    for owner, key in ((config, "output_root"), (config, "artifact_root"), (config.data, "path")):
        value = getattr(owner, key)
        if value and "://" not in value and not os.path.isabs(value):
            setattr(owner, key, os.path.abspath(value))


RUNNER_CLASSES = {"direct": "DirectRunner", "flink": "FlinkRunner", "spark": "SparkRunner",
                  "dataflow": "DataflowRunner"}


def _validate_beam(beam: BeamConfig) -> None:
    beam.runner = RUNNER_CLASSES.get(beam.runner, beam.runner)
    # A standing job server knows its Flink cluster; without one Beam starts its own for flink_master.
    if beam.runner == "FlinkRunner" and not (beam.job_endpoint or beam.flink_master):
        raise ConfigError("beam.runner FlinkRunner needs beam.job_endpoint (a standing job server, such as "
                          "`mlops cluster flink start` prints) or beam.flink_master; set one in the config or with "
                          "--set (docs/concepts/beam.md).")
    required = {
        "PortableRunner": ["job_endpoint"],
        "SparkRunner": ["spark_master_url"],
        "DataflowRunner": ["project", "region", "temp_location"],
    }.get(beam.runner, [])
    missing = [f"beam.{key}" for key in required if not getattr(beam, key)]
    if missing:
        raise ConfigError(f"beam.runner {beam.runner} needs {' and '.join(missing)}; set them in the config or with "
                          "--set (docs/concepts/beam.md).")
    portable = beam.runner in ("PortableRunner", "FlinkRunner", "SparkRunner")
    if portable and beam.environment_type in ("DOCKER", "EXTERNAL", "PROCESS") and not beam.environment_config:
        raise ConfigError(f"beam.environment_type {beam.environment_type} needs beam.environment_config: the SDK "
                          "image (DOCKER), the worker pool's host:port (EXTERNAL) or the boot command (PROCESS).")
    if beam.runner == "DataflowRunner" and not beam.temp_location.startswith("gs://"):
        raise ConfigError(f"beam.temp_location must be a gs:// folder for Dataflow; got {beam.temp_location!r}.")
    if beam.parallelism < 0 or beam.direct_num_workers < 0 or beam.in_memory_max_rows < 0:
        raise ConfigError("beam.parallelism, beam.direct_num_workers and beam.in_memory_max_rows must be 0 or more.")


def _validate_distribution(config: PipelineConfig) -> None:
    training = config.training
    if training.workers < 1:
        raise ConfigError("training.workers must be at least 1.")
    if training.batch_size % training.workers:
        raise ConfigError(
            f"training.batch_size ({training.batch_size}) is the global batch and must be a multiple of "
            f"training.workers ({training.workers}); change one of them."
        )
    if training.max_restarts < 0:
        raise ConfigError("training.max_restarts must be 0 or more.")
    tfjob = training.tfjob
    if training.backend != "tfjob":
        return
    for key in ("namespace", "image", "pvc"):
        if not getattr(tfjob, key):
            raise ConfigError(f"training.tfjob.{key} is empty; the TFJob backend needs it.")
    if tfjob.poll_seconds <= 0 or tfjob.active_deadline_seconds < 1 or tfjob.backoff_limit < 0:
        raise ConfigError("training.tfjob.poll_seconds and active_deadline_seconds must be positive, "
                          "backoff_limit 0 or more.")
    if tfjob.mount_path:
        root = os.path.abspath(config.output_root)
        mount = os.path.abspath(tfjob.mount_path)
        if os.path.commonpath([root, mount]) != mount:
            raise ConfigError(f"output_root {root} is not below training.tfjob.mount_path {mount}; the workers could "
                              "not read the pipeline's artifacts. Put output_root on the mounted volume.")
    model_keys = ("model_version_name", "model_image_repo", "model_nfs_server", "model_nfs_path")
    given = [key for key in model_keys if getattr(tfjob, key)]
    if given and tfjob.operator != "kubedl":
        raise ConfigError("training.tfjob.model_version_name is a KubeDL feature; set training.tfjob.operator=kubedl "
                          "or leave the model_* keys empty.")
    if given and len(given) != len(model_keys):
        raise ConfigError("a KubeDL ModelVersion needs all of training.tfjob." + ", training.tfjob.".join(model_keys)
                          + "; set the missing ones or none.")


def _validate_rollout(rollout: RolloutConfig) -> None:
    steps = rollout.steps
    if not steps or steps[-1] != 100 or any(not 0 < s <= 100 for s in steps) or steps != sorted(set(steps)):
        raise ConfigError(f"rollout.steps must be rising percentages of traffic ending at 100, e.g. [10, 50, 100]; "
                          f"got {steps}.")
    if rollout.golden_rows < 1:
        raise ConfigError("rollout.golden_rows must be at least 1.")
    for key in ("max_abs_diff", "max_error_rate", "keep_previous_seconds", "window_seconds",
                "max_error_rate_increase", "lease_wait_seconds"):
        if getattr(rollout, key) < 0:
            raise ConfigError(f"rollout.{key} must be 0 or more.")
    for key in ("max_p99_ms", "load_timeout_seconds", "request_timeout_seconds", "poll_seconds",
                "window_requests_per_second", "max_p99_ratio", "share_tolerance_sigmas", "lease_duration_seconds"):
        if getattr(rollout, key) <= 0:
            raise ConfigError(f"rollout.{key} must be positive.")
    for key in ("min_error_rate_regression", "detection_power", "false_rollback_rate"):
        if not 0 < getattr(rollout, key) < 1:
            raise ConfigError(f"rollout.{key} must be between 0 and 1; got {getattr(rollout, key)}.")
    if rollout.min_error_rate_regression <= rollout.max_error_rate_increase:
        raise ConfigError(f"rollout.min_error_rate_regression ({rollout.min_error_rate_regression}) must be above "
                          f"rollout.max_error_rate_increase ({rollout.max_error_rate_increase}), the rise a canary is "
                          "allowed: no number of requests catches a smaller one.")
    if rollout.max_window_extensions < 0:
        raise ConfigError("rollout.max_window_extensions must be 0 or more.")
    for key in ("max_inconclusive_windows", "history_limit", "skew_min_requests"):
        if getattr(rollout, key) < 1:
            raise ConfigError(f"rollout.{key} must be at least 1.")
    for key in ("scrape_interval_seconds", "request_timeout_seconds"):
        if getattr(rollout.prometheus, key) <= 0:
            raise ConfigError(f"rollout.prometheus.{key} must be positive.")
    shadow = rollout.shadow
    if not 0 <= shadow.percent <= 100:
        raise ConfigError(f"rollout.shadow.percent must be between 0 and 100; got {shadow.percent}.")
    for key in ("min_requests", "examples"):
        if getattr(shadow, key) < 1:
            raise ConfigError(f"rollout.shadow.{key} must be at least 1.")
    if not 0 <= shadow.max_disagreement_rate < 1:
        raise ConfigError(f"rollout.shadow.max_disagreement_rate must be 0 or more and below 1; got "
                          f"{shadow.max_disagreement_rate}.")
    for key in ("max_relative_error", "max_score_distance", "max_latency_ratio"):
        if getattr(shadow, key) <= 0:
            raise ConfigError(f"rollout.shadow.{key} must be positive.")
    local = rollout.local
    if not local.stable_rest or len(local.stable_rest) != len(local.stable_grpc) or not local.canary_rest or len(
            local.canary_rest) != len(local.canary_grpc):
        raise ConfigError("rollout.local needs one gRPC target per REST URL, for at least one stable and one canary "
                          "server.")


# How `mlops monitor` compares a feature's distributions, and which of its thresholds (monitoring.*) apply.
CATEGORICAL = "categorical"
NUMERIC = "numeric"


def feature_kind(feature: schema_pb2.Feature) -> str:
    """How a schema feature's distributions are compared: categorical for strings, numeric otherwise."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    # Integers too, even those the schema marks categorical: StatisticsGen, given no schema, gives them histograms and
    # no value shares, and TFDV's L-infinity distance between two such statistics is always 0.
    return CATEGORICAL if feature.type == schema_pb2.BYTES else NUMERIC
