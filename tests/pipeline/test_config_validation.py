"""Config validation at its edges: each numeric limit just inside and just outside, each combination the pipeline
refuses, with the exact sentence the user reads; and the typing of YAML values and `--set` overrides."""
import os

import pytest

from settings.config import DEFAULT_CONFIG, ConfigError, PipelineConfig, load_config


def refusal(*overrides):
    with pytest.raises(ConfigError) as error:
        load_config(None, list(overrides))
    return str(error.value)


@pytest.mark.parametrize("key", ["train_steps", "eval_steps", "steps_per_epoch", "batch_size"])
def test_training_counts_need_at_least_one(key):
    assert getattr(load_config(None, [f"training.{key}=1"]).training, key) == 1
    assert refusal(f"training.{key}=0") == f"training.{key} must be at least 1."


@pytest.mark.parametrize("key", ["training.learning_rate", "optimize.learning_rate", "optimize.distill.learning_rate"])
def test_a_learning_rate_must_be_positive(key):
    section, _, name = key.rpartition(".")
    loaded = load_config(None, [f"{key}=1e-12"])
    for part in section.split("."):
        loaded = getattr(loaded, part)
    assert getattr(loaded, name) == 1e-12
    assert refusal(f"{key}=0") == f"{key} must be positive; got 0.0."
    assert refusal(f"{key}=-1") == f"{key} must be positive; got -1.0."
    assert refusal(f"{key}=.nan") == f"{key} must be positive; got nan."


@pytest.mark.parametrize("overrides, message", [
    (["training.dropout=1.0"], "training.dropout must be in [0, 1)."),
    (["training.dropout=-0.01"], "training.dropout must be in [0, 1)."),
    (["training.hidden_units=[]"], "training.hidden_units must list at least one layer size."),
    (["data.numeric_features=[]", "data.bucket_features=[]", "data.vocab_features=[]", "data.category_features=[]"],
     "no features configured: set data.numeric_features, data.bucket_features, data.vocab_features, "
     "data.category_features or data.datetime_features."),
    (["label.column="], "label.column is empty: name the raw column the label is computed from."),
    (["label.column=fare"], "label.column 'fare' is also listed as a feature; remove it from data.*."),
    (["data.vocab_features=[company, fare]"],
     "feature 'fare' is listed in data.numeric_features and data.vocab_features; keep one."),
    (["data.category_features=[trip_start_day, company]"],
     "feature 'company' is listed in data.vocab_features and data.category_features; keep one."),
    (["data.category_features=[trip_start_day, trip_start_day]"],
     "feature 'trip_start_day' is listed twice in data.category_features; keep one."),
    (["evaluation.slice_feature=tips"], "evaluation.slice_feature 'tips' is not a feature."),
    (["schema_path="], "schema_path is empty: point it at a curated schema.pbtxt."),
    (["schema_path=/no/such/schema.pbtxt"], "schema file /no/such/schema.pbtxt does not exist; fix schema_path."),
])
def test_training_data_and_label_refusals(overrides, message):
    assert refusal(*overrides) == message


def test_training_and_evaluation_values_just_inside_their_limits():
    config = load_config(None, ["training.dropout=0.0", "training.hidden_units=[4]",
                                "evaluation.slice_feature=company", "data.numeric_features=[fare]"])
    assert config.training.dropout == 0.0 and config.evaluation.slice_feature == "company"
    assert load_config(None, ["training.dropout=0.99"]).training.dropout == 0.99


SPARSITY = "optimize.target_sparsity must be between 0 and 1 (0.5 zeroes half of each kernel)."
DISTILL = "optimize.distill needs hidden_units, steps >= 1, temperature > 0 and alpha in [0, 1]."


@pytest.mark.parametrize("overrides, message", [
    (["optimize.target_sparsity=0.0"], SPARSITY),
    (["optimize.target_sparsity=1.0"], SPARSITY),
    (["optimize.fine_tune_steps=0"], "optimize.fine_tune_steps must be at least 1 when optimize.prune is true."),
    (["optimize.distill.enabled=true", "optimize.distill.hidden_units=[]"], DISTILL),
    (["optimize.distill.enabled=true", "optimize.distill.steps=0"], DISTILL),
    (["optimize.distill.enabled=true", "optimize.distill.temperature=0.0"], DISTILL),
    (["optimize.distill.enabled=true", "optimize.distill.alpha=-0.01"], DISTILL),
    (["optimize.distill.enabled=true", "optimize.distill.alpha=1.01"], DISTILL),
])
def test_optimize_refusals(overrides, message):
    assert refusal(*overrides) == message


def test_optimize_values_just_inside_their_limits():
    for sparsity in (0.01, 0.99):
        assert load_config(None, [f"optimize.target_sparsity={sparsity}"]).optimize.target_sparsity == sparsity
    assert load_config(None, ["optimize.fine_tune_steps=1"]).optimize.fine_tune_steps == 1
    # Without pruning the fine-tuning steps do not matter, nor do the student's settings without distillation.
    load_config(None, ["optimize.prune=false", "optimize.fine_tune_steps=0", "optimize.distill.steps=0",
                       "optimize.distill.temperature=0.0", "optimize.distill.hidden_units=[]"])
    for alpha in (0.0, 1.0):
        distill = load_config(None, ["optimize.distill.enabled=true", f"optimize.distill.alpha={alpha}",
                                     "optimize.distill.steps=1", "optimize.distill.temperature=0.01"]).optimize.distill
        assert (distill.alpha, distill.steps, distill.temperature) == (alpha, 1, 0.01)


FORMATS = ("export.formats must include saved_model (TF Serving loads it) and may add tflite, onnx, tfjs; got {}.")
VARIANTS = "export.tflite_variants must be some of float32, dynamic, float16, int8; got {}."


@pytest.mark.parametrize("overrides, message", [
    (["export.formats=[tflite, onnx]"], FORMATS.format(["tflite", "onnx"])),
    (["export.formats=[saved_model, coreml]"], FORMATS.format(["saved_model", "coreml"])),
    (["export.tflite_variants=[float32, int4]"], VARIANTS.format(["float32", "int4"])),
    (["export.tflite_variants=[]"], VARIANTS.format([])),
    (["export.eval_rows=99"], "export.eval_rows must be at least 100 (default 2000): the formats are compared on "
                              "that many eval rows."),
    (["export.latency_rows=0"], "export.latency_rows must be between 1 and export.eval_rows."),
    (["export.eval_rows=150", "export.latency_rows=151"],
     "export.latency_rows must be between 1 and export.eval_rows."),
    (["transform.oov_buckets=2"], "transform.oov_buckets is 2, but TFLite, ONNX and TF.js cannot reproduce "
                                  "TensorFlow's hashing of unseen values into several buckets; set "
                                  "transform.oov_buckets=1, or export.formats=[saved_model]."),
    (["transform.oov_buckets=0", "export.formats=[saved_model, onnx]"], "transform.oov_buckets is 0, but TFLite, "
     "ONNX and TF.js cannot reproduce TensorFlow's hashing of unseen values into several buckets; set "
     "transform.oov_buckets=1, or export.formats=[saved_model]."),
])
def test_export_refusals(overrides, message):
    assert refusal(*overrides) == message


def test_export_values_just_inside_their_limits():
    export = load_config(None, ["export.eval_rows=100", "export.latency_rows=100"]).export
    assert (export.eval_rows, export.latency_rows) == (100, 100)
    assert load_config(None, ["export.latency_rows=1"]).export.latency_rows == 1
    # The SavedModel alone runs TensorFlow's hashing itself, and needs no TFLite variants.
    config = load_config(None, ["export.formats=[saved_model]", "transform.oov_buckets=3",
                                "export.tflite_variants=[]"])
    assert config.transform.oov_buckets == 3 and config.export.formats == ["saved_model"]


@pytest.mark.parametrize("overrides, message", [
    (["training.workers=0"], "training.workers must be at least 1."),
    (["training.workers=3"], "training.batch_size (128) is the global batch and must be a multiple of "
                             "training.workers (3); change one of them."),
    (["training.max_restarts=-1"], "training.max_restarts must be 0 or more."),
    (["training.backend=tfjob", "training.tfjob.namespace="], "training.tfjob.namespace is empty; the TFJob backend "
                                                              "needs it."),
    (["training.backend=tfjob", "training.tfjob.pvc="], "training.tfjob.pvc is empty; the TFJob backend needs it."),
    (["training.backend=tfjob", "training.tfjob.poll_seconds=0"], "training.tfjob.poll_seconds and "
     "active_deadline_seconds must be positive, backoff_limit 0 or more."),
    (["training.backend=tfjob", "training.tfjob.active_deadline_seconds=0"], "training.tfjob.poll_seconds and "
     "active_deadline_seconds must be positive, backoff_limit 0 or more."),
    (["training.backend=tfjob", "training.tfjob.backoff_limit=-1"], "training.tfjob.poll_seconds and "
     "active_deadline_seconds must be positive, backoff_limit 0 or more."),
    (["training.backend=tfjob", "output_root=/data/outputs", "training.tfjob.mount_path=/data/out"],
     "output_root /data/outputs is not below training.tfjob.mount_path /data/out; the workers could not read the "
     "pipeline's artifacts. Put output_root on the mounted volume."),
    (["training.backend=tfjob", "training.tfjob.operator=kubedl", "training.tfjob.model_version_name=taxi",
      "training.tfjob.model_image_repo=r", "training.tfjob.model_nfs_server=s"],
     "a KubeDL ModelVersion needs all of training.tfjob.model_version_name, training.tfjob.model_image_repo, "
     "training.tfjob.model_nfs_server, training.tfjob.model_nfs_path; set the missing ones or none."),
    (["training.backend=tfjob", "training.tfjob.model_nfs_path=/exports"],
     "training.tfjob.model_version_name is a KubeDL feature; set training.tfjob.operator=kubedl or leave the "
     "model_* keys empty."),
])
def test_distribution_refusals(overrides, message):
    assert refusal(*overrides) == message


def test_distribution_values_just_inside_their_limits():
    config = load_config(None, ["training.workers=2", "training.max_restarts=0"])
    assert (config.training.workers, config.training.max_restarts) == (2, 0)
    config = load_config(None, [
        "training.backend=tfjob", "training.tfjob.poll_seconds=0.5", "training.tfjob.active_deadline_seconds=1",
        "training.tfjob.backoff_limit=0", "output_root=/data/out", "training.tfjob.mount_path=/data/out",
        "training.tfjob.operator=kubedl", "training.tfjob.model_version_name=taxi",
        "training.tfjob.model_image_repo=r", "training.tfjob.model_nfs_server=s", "training.tfjob.model_nfs_path=/e",
    ])
    assert config.training.tfjob.mount_path == "/data/out"
    assert config.resolved_training().tfjob.mount_path == "/data/out"
    # The TFJob settings are checked only for the TFJob backend.
    assert load_config(None, ["training.tfjob.image=", "training.tfjob.poll_seconds=0"]).training.backend == "local"


@pytest.mark.parametrize("override, value", [
    ("training.l2=1e-4", 1e-4),  # YAML 1.1 reads this as a string
    ("training.l2=2", 2.0),
    ("training.clipnorm=3", 3.0),
    ("training.clipnorm=null", None),
    ("optimize.distill.hidden_units=[8, 4]", [8, 4]),
    ("label.relative_to=", ""),
    ("name=a=b", "a=b"),
])
def test_values_are_coerced_to_the_declared_type(override, value):
    key = override.split("=", 1)[0]
    section, _, name = key.rpartition(".")
    config = load_config(None, [override])
    for part in filter(None, section.split(".")):
        config = getattr(config, part)
    got = getattr(config, name)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("override, message", [
    ("training.l2=tiny", "config key 'training.l2' must be a number, got 'tiny'."),
    ("training.l2=true", "config key 'training.l2' must be a number, got True."),
    ("training.workers=2.0", "config key 'training.workers' must be an integer, got 2.0."),
    ("training.workers=true", "config key 'training.workers' must be an integer, got True."),
    ("training.clipnorm=big", "config key 'training.clipnorm' must be a number or null, got 'big'."),
    ("training.hidden_units=[8, x]", "config key 'training.hidden_units[1]' must be an integer, got 'x'."),
    ("training.hidden_units=8", "config key 'training.hidden_units' must be a list of an integer, got 8."),
    ("name=[a]", "config key 'name' must be a string, got ['a']."),
    ("enable_cache=yes please", "config key 'enable_cache' must be true or false, got 'yes please'."),
    ("training.tfjob=x", "config key 'training.tfjob' must be a mapping of operator, namespace, image, "
                         "image_pull_policy, service_account, pvc, mount_path, cpu, memory, restart_policy, "
                         "clean_pod_policy, backoff_limit, active_deadline_seconds, poll_seconds, kubeconfig, "
                         "model_version_name, model_image_repo, model_nfs_server, model_nfs_path."),
    ("beam.direct_running_mode=spark", "config key 'beam.direct_running_mode' must be one of 'auto', 'in_memory', "
                                       "'multi_threading', 'multi_processing', got 'spark'."),
    ("beam.in_memory_max_rows=-1", "beam.parallelism, beam.direct_num_workers and beam.in_memory_max_rows must be 0 or "
                                   "more."),
    ("tuner.trials=2", "unknown config key 'tuner.trials'; valid keys here are: tuner.enabled, tuner.algorithm, "
                       "tuner.max_trials, tuner.train_steps, tuner.eval_steps."),
    ("name.first=x", "override 'name.first=x': 'name' is not a section."),
    ("training", "override 'training' must look like key.sub=value, for example training.train_steps=100."),
])
def test_wrong_values_name_the_key_and_what_it_takes(override, message):
    assert refusal(override) == message


def test_config_files_that_are_not_a_mapping_or_not_yaml(tmp_path):
    listing = tmp_path / "list.yaml"
    listing.write_text("- name\n")
    with pytest.raises(ConfigError) as error:
        load_config(listing)
    assert str(error.value).startswith(f"config file {listing} must hold a mapping of name, model_name, output_root")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=f"config file {broken} is not valid YAML: "):
        load_config(broken)
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / "missing.yaml")
    assert str(error.value) == (f"cannot read config file {tmp_path / 'missing.yaml'}: No such file or directory; "
                                "pass an existing YAML file.")


def test_an_empty_file_is_the_defaults_and_the_schema_is_found_beside_the_config(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert refusal_of_file(empty).startswith("no features configured")
    (tmp_path / "mine.pbtxt").write_text("")
    job = tmp_path / "job.yaml"
    job.write_text(DEFAULT_CONFIG.read_text().replace("schema_path: taxi_schema.pbtxt", "schema_path: mine.pbtxt"))
    assert load_config(job).schema_path == str(tmp_path / "mine.pbtxt")
    # A relative path that is not beside the config file stays as given (relative to the working directory).
    job.write_text(DEFAULT_CONFIG.read_text().replace("schema_path: taxi_schema.pbtxt",
                                                      f"schema_path: {os.path.relpath(DEFAULT_CONFIG.parent)}"
                                                      "/taxi_schema.pbtxt"))
    assert load_config(job).schema_path == f"{os.path.relpath(DEFAULT_CONFIG.parent)}/taxi_schema.pbtxt"


def test_an_override_may_name_a_section_the_file_leaves_out(tmp_path):
    job = tmp_path / "job.yaml"
    text = DEFAULT_CONFIG.read_text()
    job.write_text(text[:text.index("tuner:")] + text[text.index("evaluation:"):])
    job.with_name("taxi_schema.pbtxt").write_text((DEFAULT_CONFIG.parent / "taxi_schema.pbtxt").read_text())
    assert load_config(job).tuner.max_trials == 4
    assert load_config(job, ["tuner.max_trials=2"]).tuner.max_trials == 2


def refusal_of_file(path):
    with pytest.raises(ConfigError) as error:
        load_config(path)
    return str(error.value)


def test_paths_and_the_sections_every_component_receives(tmp_path):
    config = load_config(None, [f"output_root={tmp_path}", "name=job", "model_name=m"])
    assert config.features == ["fare", "trip_miles", "trip_seconds", "pickup_latitude", "pickup_longitude",
                               "dropoff_latitude", "dropoff_longitude", "payment_type", "company",
                               "dropoff_census_tract", "trip_start_hour", "trip_start_day", "trip_start_month",
                               "pickup_community_area", "dropoff_community_area"]
    assert config.pipeline_root == f"{tmp_path}/pipelines/job"
    assert config.metadata_path == f"{tmp_path}/metadata/job/metadata.db"
    assert config.serving_dir == f"{tmp_path}/serving/m"
    sections = config.sections("data", "label", "transform", "training", "tuner", "optimize", "export")
    assert sections["data"]["numeric_features"] == config.data.numeric_features
    assert sections["label"] == {**sections["label"], "name": "big_tipper", "column": "tips", "threshold": 0.2,
                                 "relative_to": "fare", "positive_value": ""}
    assert sections["transform"]["vocab_size"] == 1000 and sections["transform"]["oov_buckets"] == 1
    assert sections["optimize"]["distill"]["hidden_units"] == [16] and sections["export"]["max_abs_diff"] == 1e-4
    assert sections["tuner"]["max_trials"] == 4 and sections["training"]["tfjob"]["mount_path"] == ""
    # The sections are copies: components changing them cannot change the pipeline's config.
    sections["data"]["numeric_features"].append("x")
    assert "x" not in config.data.numeric_features
    assert PipelineConfig().features == []


@pytest.mark.parametrize("overrides, message", [
    (["calibration.threshold_objective=accuracy"],
     "calibration.threshold_objective 'accuracy' is unknown; choose f1 or min_precision."),
    (["calibration.min_precision=0.0"], "calibration.min_precision must be in (0, 1], got 0.0."),
    (["calibration.min_precision=1.01"], "calibration.min_precision must be in (0, 1], got 1.01."),
    (["data.calibration_buckets=-1"], "data.calibration_buckets must be 0 (no calibration split) or more."),
    (["calibration.method=none"], "data.calibration_buckets sets rows aside that calibration.method=none never "
                                  "uses; set data.calibration_buckets=0 or calibration.method=auto."),
    (["label.kind=regression", "label.relative_to="],
     "data.calibration_buckets sets rows aside to calibrate probabilities, which a regression model does not "
     "output; set data.calibration_buckets=0."),
])
def test_calibration_refusals(overrides, message):
    assert refusal(*overrides) == message


def test_calibration_values_just_inside_their_limits():
    config = load_config(None, ["calibration.threshold_objective=min_precision", "calibration.min_precision=1.0"])
    assert (config.calibration.threshold_objective, config.calibration.min_precision) == ("min_precision", 1.0)
    assert load_config(None, ["calibration.min_precision=0.001"]).calibration.min_precision == 0.001
    assert load_config(None, ["calibration.method=none", "data.calibration_buckets=0"]).calibration.method == "none"
    regression = load_config(None, ["label.kind=regression", "label.relative_to=", "data.calibration_buckets=0"])
    assert regression.data.calibration_buckets == 0
    assert "must be one of" in refusal("calibration.method=isotonic")


DISTANCE = "but the distance it bounds lies between 0 and 1; set a value in [0, 1]"


@pytest.mark.parametrize("overrides, message", [
    *[([f"monitoring.{key}={value}"], f"monitoring.{key} is {value}, {DISTANCE}.")
      for key in ("categorical_skew", "numeric_skew", "categorical_drift", "numeric_drift")
      for value in (-0.001, 1.001)],
    (["monitoring.features.fare.skew=1.001"], f"monitoring.features.fare.skew is 1.001, {DISTANCE} or null."),
    (["monitoring.features.company.drift=-0.001"],
     f"monitoring.features.company.drift is -0.001, {DISTANCE} or null."),
    (["monitoring.features.tips.skew=0.2"], "monitoring.features.tips is not a feature of this config; use one of "
     "fare, trip_miles, trip_seconds, pickup_latitude, pickup_longitude, dropoff_latitude, dropoff_longitude, "
     "payment_type, company, dropoff_census_tract, trip_start_hour, trip_start_day, trip_start_month, "
     "pickup_community_area, dropoff_community_area."),
    (["monitoring.window_requests=0"], "monitoring.window_requests must be at least 1; got 0."),
    (["monitoring.min_requests=0"], "monitoring.min_requests must be at least 1; got 0."),
    (["monitoring.request_timeout_seconds=0"], "monitoring.request_timeout_seconds must be positive."),
    (["monitoring.pushgateway_job="], "monitoring.pushgateway_job is empty; name the Pushgateway job, e.g. "
                                      "mlops_monitor."),
    (["monitoring.features.fare=0.2"], "config key 'monitoring.features.fare' must be a mapping of skew, drift."),
])
def test_monitoring_refusals(overrides, message):
    assert refusal(*overrides) == message


def test_monitoring_values_just_inside_their_limits(tmp_path):
    keys = ("categorical_skew", "numeric_skew", "categorical_drift", "numeric_drift")
    for value in (0.0, 1.0):
        monitoring = load_config(None, [f"monitoring.{key}={value}" for key in keys]).monitoring
        assert [getattr(monitoring, key) for key in keys] == [value] * 4
    monitoring = load_config(None, ["monitoring.features.fare.skew=0.0", "monitoring.features.fare.drift=1.0",
                                    "monitoring.features.company.skew=null", "monitoring.window_requests=1",
                                    "monitoring.min_requests=1", "monitoring.request_timeout_seconds=0.001"]).monitoring
    assert (monitoring.features["fare"].skew, monitoring.features["fare"].drift) == (0.0, 1.0)
    assert (monitoring.features["company"].skew, monitoring.features["company"].drift) == (None, None)
    assert (monitoring.window_requests, monitoring.min_requests, monitoring.request_timeout_seconds) == (1, 1, 0.001)
    job = tmp_path / "job.yaml"
    job.write_text(f"schema_path: {DEFAULT_CONFIG.parent / 'taxi_schema.pbtxt'}\ndata:\n  numeric_features: [fare]\n"
                   "label:\n  column: tips\nevaluation:\n  lower_bound: 0.5\n"
                   "monitoring:\n  features:\n    fare: {skew: 0.3}\n")
    assert load_config(job).monitoring.features["fare"].skew == 0.3


def test_the_monitors_folders_default_below_output_root():
    config = load_config(None, ["output_root=/data"])
    assert (config.request_log_dir, config.monitoring_dir) == ("/data/request_logs", "/data/monitoring")
    config = load_config(None, ["serving.request_log.directory=gs://logs", "monitoring.output_dir=/reports"])
    assert (config.request_log_dir, config.monitoring_dir) == ("gs://logs", "/reports")


@pytest.mark.parametrize("key", ["min_error_rate_regression", "detection_power", "false_rollback_rate"])
def test_the_rollouts_evidence_settings_are_probabilities(key):
    assert getattr(load_config(None, [f"rollout.{key}=0.999"]).rollout, key) == 0.999
    assert getattr(load_config(None, [f"rollout.{key}=0.006"]).rollout, key) == 0.006
    for value, shown in (("0", "0.0"), ("1", "1.0"), (".nan", "nan")):
        assert refusal(f"rollout.{key}={value}") == f"rollout.{key} must be between 0 and 1; got {shown}."


def test_the_smallest_regression_worth_catching_must_be_above_the_rise_allowed():
    assert load_config(None, ["rollout.min_error_rate_regression=0.0051"]).rollout.min_error_rate_regression == 0.0051
    assert refusal("rollout.min_error_rate_regression=0.005") == (
        "rollout.min_error_rate_regression (0.005) must be above rollout.max_error_rate_increase (0.005), the rise a "
        "canary is allowed: no number of requests catches a smaller one.")


def test_a_window_may_be_extended_zero_times_and_no_fewer():
    assert load_config(None, ["rollout.max_window_extensions=0"]).rollout.max_window_extensions == 0
    assert refusal("rollout.max_window_extensions=-1") == "rollout.max_window_extensions must be 0 or more."
