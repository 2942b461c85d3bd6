"""The typed config crosses the component boundary: what each component of the DAG receives rebuilds into the same
dataclasses the YAML was loaded into."""
import json
from pathlib import Path

import pytest

from components.example_gen.executor import read_stratify_label
from components.features import FeatureLayout
from components.specs import (
    CODE_FINGERPRINT_KEY,
    EXPORT_KEY,
    OPTIMIZE_KEY,
    TRAINING_KEY,
    TUNER_KEY,
)
from pipeline.pipeline import create_pipeline
from settings.config import (
    ConfigError,
    ExportConfig,
    OptimizeConfig,
    TrainingConfig,
    TunerConfig,
    load_config,
    read_section,
)

CONFIGS = Path(__file__).resolve().parents[2] / "pipeline" / "configs"


def custom_config(node):
    """A standard component's custom_config as its executor gets it (TFX stores it as JSON)."""
    return json.loads(node.exec_properties["custom_config"])


@pytest.fixture(scope="module")
def config_and_nodes(tmp_path_factory):
    config = load_config(None, [f"output_root={tmp_path_factory.mktemp('out')}", "tuner.enabled=true",
                                "training.hidden_units=[8,4]", "optimize.distill.enabled=true",
                                "export.formats=[saved_model,onnx]", "label.threshold=0.3"])
    return config, {node.id: node for node in create_pipeline(config).components}


def test_module_code_and_custom_components_get_back_the_typed_sections(config_and_nodes):
    config, nodes = config_and_nodes
    transform, trainer = custom_config(nodes["Transform"]), custom_config(nodes["Trainer"])
    optimizer, exporter = nodes["Optimizer"].exec_properties, nodes["Exporter"].exec_properties
    for properties in (transform, trainer, optimizer, exporter):
        layout = FeatureLayout.from_properties(properties)
        assert (layout.data, layout.label, layout.transform) == (config.data, config.label, config.transform)
        assert properties[CODE_FINGERPRINT_KEY]
    assert read_section(trainer, TRAINING_KEY, TrainingConfig) == config.training
    assert read_section(custom_config(nodes["Tuner"]), TUNER_KEY, TunerConfig) == config.tuner
    assert read_section(optimizer, OPTIMIZE_KEY, OptimizeConfig) == config.optimize
    assert read_section(exporter, EXPORT_KEY, ExportConfig) == config.export


def test_each_component_gets_only_the_sections_it_reads(config_and_nodes):
    """Editing a later stage's settings must not invalidate an earlier stage's cache."""
    _, nodes = config_and_nodes
    assert sorted(custom_config(nodes["Transform"])) == [
        CODE_FINGERPRINT_KEY, "data", "label", "transform"]
    assert EXPORT_KEY not in nodes["Optimizer"].exec_properties
    assert OPTIMIZE_KEY not in nodes["Exporter"].exec_properties


def test_a_malformed_section_is_refused_with_the_key():
    with pytest.raises(ConfigError, match="unknown config key 'training.batchsize'"):
        read_section({"training": {"batchsize": 3}}, "training", TrainingConfig)
    with pytest.raises(ConfigError, match="'optimize.prune' must be true or false"):
        read_section({"optimize": '{"prune": "yes"}'}, "optimize", OptimizeConfig)
    with pytest.raises(ConfigError, match="the component received no 'export' section"):
        read_section({}, "export", ExportConfig)


@pytest.mark.parametrize(("setting", "disabled"), [([], 1), (["transform.statistics=true"], 0)])
def test_transform_statistics_are_off_unless_asked_for(tmp_path, setting, disabled):
    """Nothing reads TFX's pre- and post-transform statistics, so by default Transform skips those two passes."""
    config = load_config(None, [f"output_root={tmp_path}", *setting])
    transform = {node.id: node for node in create_pipeline(config, data_only=True).components}["Transform"]
    assert transform.exec_properties["disable_statistics"] == disabled


@pytest.mark.parametrize(("setting", "compat"), [([], 1), (["transform.tf_compat_v1=false"], 0)])
def test_transform_runs_in_tf1_graph_mode_unless_asked_for_tf2(tmp_path, setting, compat):
    config = load_config(None, [f"output_root={tmp_path}", *setting])
    transform = {node.id: node for node in create_pipeline(config, data_only=True).components}["Transform"]
    assert transform.exec_properties["force_tf_compat_v1"] == compat


@pytest.mark.parametrize("tuner", [False, True])
def test_transform_runs_beside_the_validation_and_the_exporter_beside_the_evaluator(tmp_path, tuner):
    """Nothing learns before the gate passed and nothing is published unblessed, yet neither waits for the other."""
    config = load_config(None, [f"output_root={tmp_path}", f"tuner.enabled={str(tuner).lower()}"])
    upstream = {node.id: {n.id for n in node.upstream_nodes} for node in create_pipeline(config).components}
    assert "DataValidationGate" not in upstream["Transform"]
    assert "DataValidationGate" in upstream["Tuner" if tuner else "Trainer"]
    assert "Evaluator" not in upstream["Exporter"] and {"Evaluator", "Exporter"} <= upstream["Publisher"]


@pytest.mark.parametrize(("config_file", "setting", "kind"), [
    ("taxi.yaml", [], "binary"), ("taxi.yaml", ["data.stratify=false"], None), ("iris.yaml", [], "multiclass"),
    ("diabetes.yaml", [], None)])
def test_example_gen_splits_each_label_class_unless_turned_off_or_regression(tmp_path, config_file, setting, kind):
    config = load_config(CONFIGS / config_file, [f"output_root={tmp_path}", *setting])
    example_gen = {node.id: node for node in create_pipeline(config, data_only=True).components}["CsvExampleGen"]
    label = read_stratify_label(example_gen.exec_properties)
    assert (label and label.kind) == kind
    if kind:
        assert label.column == config.label.column and label.threshold == config.label.threshold
