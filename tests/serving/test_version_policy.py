"""Version and label policy of the model repository and of the server's config, at their edges: which names and
numbers are versions, how the next version is numbered, which labels may point where, which versions a
ModelServerConfig asks for. Stand-in version folders (a saved_model.pb file is what marks one) keep these fast;
test_model_repository.py does the same with real SavedModels."""
from __future__ import annotations

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from serving.repository.base import RepositoryError, list_versions, validate_label, validate_model_name
from serving.repository.local import ModelRepository
from serving.server.model_manager import ModelConfigError, aspired_versions, validate_config

MODEL = "taxi"


def stand_in_export(folder, marker="saved_model.pb"):
    folder.mkdir(parents=True)
    (folder / marker).write_bytes(b"stand-in SavedModel")
    return folder


@pytest.fixture
def repo(tmp_path):
    repository = ModelRepository(tmp_path / "models")
    for version in (1, 2, 5):
        repository.add_version(MODEL, stand_in_export(tmp_path / "exports" / str(version)), version=version)
    return repository


@pytest.mark.parametrize("name", ["taxi", "Taxi_2", "9lives", "taxi-v2.1", "a"])
def test_valid_model_names(name):
    assert validate_model_name(name) == name


@pytest.mark.parametrize("name", ["", "-taxi", ".taxi", "_taxi", "taxi/1", "ta..xi", "taxi..", "tax i", None, 7])
def test_invalid_model_names(name):
    with pytest.raises(RepositoryError) as error:
        validate_model_name(name)
    assert str(error.value) == (f"Model name {name!r} is invalid: use letters, digits, '_', '-' and '.', start with "
                                "a letter or digit, and do not use '..' or '/'.")


@pytest.mark.parametrize("label", ["stable", "canary", "Canary-2", "v_1", "7"])
def test_valid_labels(label):
    assert validate_label(label) == label


@pytest.mark.parametrize("label", ["", "-canary", "_canary", "can.ary", "can ary", "canary/1", None, 1])
def test_invalid_labels(label):
    with pytest.raises(RepositoryError) as error:
        validate_label(label)
    assert str(error.value) == f"Version label {label!r} is invalid: use letters, digits, '_' and '-'."


def test_versions_are_integer_named_folders_in_numeric_order(tmp_path):
    model_dir = tmp_path / MODEL
    for name in ("10", "2", "1", "007", ".staging-3-0a1b2c3d", "latest", "1.5", "-4"):
        (model_dir / name).mkdir(parents=True)
    (model_dir / "12").write_text("a file, not a version")
    assert list_versions(model_dir) == [1, 2, 7, 10]
    assert list_versions(tmp_path / "no-such-model") == []
    (tmp_path / "a-file").write_text("")
    assert list_versions(tmp_path / "a-file") == []


def test_models_are_the_folders_with_valid_names(tmp_path):
    repo = ModelRepository(tmp_path / "models")
    assert repo.models() == []
    for name in ("taxi", "fraud.v2", ".hidden", "a..b", "-x"):
        (tmp_path / "models" / name).mkdir(parents=True)
    (tmp_path / "models" / "models.config").write_text("")
    assert repo.models() == ["fraud.v2", "taxi"]


def test_next_version_is_one_past_the_newest_even_after_a_gap(tmp_path, repo):
    assert repo.versions(MODEL) == [1, 2, 5]
    assert repo.latest_version(MODEL) == 5
    assert repo.add_version(MODEL, stand_in_export(tmp_path / "exports" / "next")) == 6
    assert repo.latest_version("other") is None
    assert repo.add_version("other", stand_in_export(tmp_path / "exports" / "first")) == 1


def test_explicit_versions_only_grow_and_are_never_replaced(tmp_path, repo):
    assert repo.add_version("other", stand_in_export(tmp_path / "exports" / "zero"), version=0) == 0
    with pytest.raises(RepositoryError) as error:
        repo.add_version(MODEL, stand_in_export(tmp_path / "exports" / "again"), version=5)
    assert str(error.value) == (f"Version 5 of model {MODEL!r} already exists and versions are immutable; publish a "
                                "new version number instead.")
    with pytest.raises(RepositoryError) as error:
        repo.add_version(MODEL, stand_in_export(tmp_path / "exports" / "below"), version=4)
    assert str(error.value) == (f"Version 4 of model {MODEL!r} is below the latest version 5; version numbers only "
                                "grow (TF Serving serves the highest by default), so publish a higher one.")
    assert repo.add_version(MODEL, stand_in_export(tmp_path / "exports" / "above"), version=6) == 6
    assert repo.versions(MODEL) == [1, 2, 5, 6]


@pytest.mark.parametrize("version", [-1, True, 1.0, "3", None])
def test_a_version_is_a_non_negative_integer(repo, tmp_path, version):
    with pytest.raises(RepositoryError) as error:
        repo.version_dir(MODEL, version)
    assert str(error.value) == f"Version {version!r} is invalid: versions are non-negative integers."


def test_a_text_format_saved_model_is_publishable_and_an_empty_folder_is_not(tmp_path, repo):
    assert repo.add_version(MODEL, stand_in_export(tmp_path / "exports" / "text", "saved_model.pbtxt")) == 6
    (tmp_path / "exports" / "empty").mkdir()
    with pytest.raises(RepositoryError, match="is not a SavedModel folder"):
        repo.add_version(MODEL, tmp_path / "exports" / "empty")
    with pytest.raises(RepositoryError, match="no saved_model.pb"), repo.staged_version(MODEL) as staged:
        assert staged.version == 7 and staged.path.name.startswith(".staging-7-")
    assert repo.versions(MODEL) == [1, 2, 5, 6]


def test_serve_writes_a_specific_policy_and_the_labels(repo):
    config = repo.serve(MODEL, [5, 1, 5], {"stable": 1, "canary": 5})
    expected = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(f"""
        model_config_list {{ config {{
            name: "{MODEL}" base_path: "{repo.base_dir}/{MODEL}" model_platform: "tensorflow"
            model_version_policy {{ specific {{ versions: 1 versions: 5 }} }}
            version_labels {{ key: "canary" value: 5 }} version_labels {{ key: "stable" value: 1 }}
        }} }}""", expected)
    assert config == expected == repo.read_config()
    assert repo.served_versions(MODEL) == [1, 5]
    # Serving again replaces the versions and the labels; it does not merge them.
    repo.serve(MODEL, [2])
    assert repo.served_versions(MODEL) == [2] and repo.labels(MODEL) == {}


def test_serve_refuses_what_it_cannot_serve(repo):
    with pytest.raises(RepositoryError) as error:
        repo.serve(MODEL, [])
    assert str(error.value) == f"Give at least one version to serve for {MODEL!r}."
    with pytest.raises(RepositoryError) as error:
        repo.serve(MODEL, [1, 3, 4])
    assert str(error.value) == (f"Model {MODEL!r} has no version(s) [3, 4] under {repo.model_dir(MODEL)}; "
                                "available: [1, 2, 5].")
    with pytest.raises(RepositoryError) as error:
        repo.serve(MODEL, [1, 2], {"stable": 1, "canary": 5})
    assert str(error.value) == (f"Label 'canary' points at version 5 of {MODEL!r}, which is not served; serve it too "
                                "(served: [1, 2]).")
    with pytest.raises(RepositoryError, match="Version label 'can ary' is invalid"):
        repo.serve(MODEL, [1], {"can ary": 1})
    with pytest.raises(RepositoryError, match="Model name '../etc' is invalid"):
        repo.serve("../etc", [1])
    assert repo.read_config() == model_server_config_pb2.ModelServerConfig()


def test_set_label_moves_one_label_among_the_served_versions(repo):
    repo.serve(MODEL, [1, 2, 5], {"stable": 1, "canary": 5})
    repo.set_label(MODEL, "stable", 5)
    assert repo.labels(MODEL) == {"stable": 5, "canary": 5}
    repo.set_label(MODEL, "beta", 2)
    assert repo.labels(MODEL) == {"stable": 5, "canary": 5, "beta": 2}
    assert repo.served_versions(MODEL) == [1, 2, 5]
    with pytest.raises(RepositoryError, match="points at version 6 .* which is not served"):
        repo.set_label(MODEL, "stable", 6)
    with pytest.raises(RepositoryError, match="Version -1 is invalid"):
        repo.set_label(MODEL, "stable", -1)
    assert repo.labels(MODEL) == {"stable": 5, "canary": 5, "beta": 2}


def test_a_model_that_is_not_configured_has_no_versions_or_labels_to_move(repo):
    assert repo.served_versions(MODEL) == [] and repo.labels(MODEL) == {}
    with pytest.raises(RepositoryError, match="Give at least one version to serve"):
        repo.set_label(MODEL, "stable", 1)
    repo.serve(MODEL, [1], {"stable": 1})
    assert repo.served_versions("other") == [] and repo.labels("other") == {}


# --- The server's side: which configs it applies and which versions a version policy asks for. ---


def server_config(text):
    config = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(text, config)
    return config


def test_a_config_the_server_can_apply():
    validate_config(server_config("""
        model_config_list {
          config { name: "taxi" base_path: "/models/taxi" model_platform: "tensorflow"
                   version_labels { key: "stable" value: 1 } }
          config { name: "fraud" base_path: "/models/fraud" }
        }"""))


@pytest.mark.parametrize("text, message", [
    ('custom_model_config { }', "custom_model_config is not supported; use model_config_list."),
    ('model_config_list { config { name: "taxi" base_path: "/m/a" } config { name: "taxi" base_path: "/m/b" } }',
     "Model 'taxi' appears twice in the config; keep one entry."),
    ('model_config_list { config { name: "taxi" } }',
     "Model 'taxi' has no base_path; set it to the model's folder."),
    ('model_config_list { config { name: "taxi" base_path: "/m" model_platform: "tflite" } }',
     "Model 'taxi' uses platform 'tflite'; only 'tensorflow' is supported."),
    ('model_config_list { config { name: "taxi" base_path: "/m" model_type: TENSORFLOW } }',
     "Model 'taxi' sets the deprecated model_type; use model_platform."),
    ('model_config_list { config { name: "../taxi" base_path: "/m" } }', "Model name '../taxi' is invalid"),
    ('model_config_list { config { name: "taxi" base_path: "/m" version_labels { key: "a b" value: 1 } } }',
     "Version label 'a b' is invalid"),
])
def test_a_config_the_server_refuses(text, message):
    with pytest.raises(ModelConfigError) as error:
        validate_config(server_config(text))
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("policy, on_disk, expected", [
    ("", [1, 2, 5], [5]),
    ("model_version_policy { latest { num_versions: 2 } }", [1, 2, 5], [2, 5]),
    ("model_version_policy { latest { num_versions: 0 } }", [1, 2, 5], [5]),
    ("model_version_policy { latest { num_versions: 4 } }", [1, 2, 5], [1, 2, 5]),
    ("model_version_policy { all { } }", [1, 2, 5], [1, 2, 5]),
    ("model_version_policy { specific { versions: 5 versions: 1 versions: 3 } }", [1, 2, 5], [1, 5]),
    ("", [], []),
])
def test_aspired_versions_follow_the_version_policy(policy, on_disk, expected):
    model_config = model_server_config_pb2.ModelConfig()
    text_format.Parse(f'name: "taxi" base_path: "/m" {policy}', model_config)
    assert aspired_versions(model_config, on_disk) == expected
