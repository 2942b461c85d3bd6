"""ModelRepository: TF Serving's folder layout, immutable versions published atomically, models.config as protos."""
from __future__ import annotations

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from serving.repository.base import (
    RepositoryError,
    check_repository_location,
    read_model_server_config,
    validate_model_name,
)
from serving.repository.local import ModelRepository
from tests.serving.conftest import MODEL


def test_versions_live_at_base_model_version(tmp_path, tiny_exports):
    repo = ModelRepository(tmp_path / "models")
    assert repo.add_version(MODEL, tiny_exports[1]) == 1
    assert repo.add_version(MODEL, tiny_exports[2]) == 2
    assert repo.add_version(MODEL, tiny_exports[3], version=10) == 10
    assert repo.versions(MODEL) == [1, 2, 10]
    assert repo.latest_version(MODEL) == 10
    assert (tmp_path / "models" / MODEL / "10" / "saved_model.pb").is_file()
    assert repo.models() == [MODEL]


def test_versions_are_immutable(tmp_path, tiny_exports):
    repo = ModelRepository(tmp_path / "models")
    repo.add_version(MODEL, tiny_exports[1], version=1)
    with pytest.raises(RepositoryError, match="already exists"):
        repo.add_version(MODEL, tiny_exports[2], version=1)
    assert (repo.version_dir(MODEL, 1) / "saved_model.pb").read_bytes() == (
        tiny_exports[1] / "saved_model.pb"
    ).read_bytes()


def test_a_version_appears_only_when_complete(tmp_path, tiny_exports):
    repo = ModelRepository(tmp_path / "models")
    with repo.staged_version(MODEL) as staged:
        assert staged.version == 1
        (staged.path / "saved_model.pb").write_bytes((tiny_exports[1] / "saved_model.pb").read_bytes())
        # While being written the folder has a hidden name no server treats as a version.
        assert repo.versions(MODEL) == []
        assert staged.path.name.startswith(".")
    assert repo.versions(MODEL) == [1]

    with pytest.raises(RuntimeError, match="export failed"), repo.staged_version(MODEL) as staged:
        (staged.path / "partial").write_text("half a model")
        raise RuntimeError("export failed")
    assert repo.versions(MODEL) == [1]
    assert sorted(p.name for p in repo.model_dir(MODEL).iterdir()) == ["1"]

    with pytest.raises(RepositoryError, match="no saved_model.pb"), repo.staged_version(MODEL):
        pass
    assert repo.versions(MODEL) == [1]


def test_models_config_is_a_text_format_model_server_config(repository):
    config = read_model_server_config(repository.config_path)
    expected = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(
        f"""
        model_config_list {{
          config {{
            name: "{MODEL}"
            base_path: "{repository.base_dir}/{MODEL}"
            model_platform: "tensorflow"
            model_version_policy {{ specific {{ versions: 1 versions: 2 }} }}
            version_labels {{ key: "canary" value: 2 }}
            version_labels {{ key: "stable" value: 1 }}
          }}
        }}
        """,
        expected,
    )
    assert config == expected
    assert repository.served_versions(MODEL) == [1, 2]
    assert repository.labels(MODEL) == {"stable": 1, "canary": 2}


def test_labels_move_and_must_point_at_served_versions(repository):
    repository.set_label(MODEL, "stable", 2)
    assert repository.labels(MODEL) == {"stable": 2, "canary": 2}
    with pytest.raises(RepositoryError, match="not served"):
        repository.set_label(MODEL, "canary", 7)
    with pytest.raises(RepositoryError, match="no version"):
        repository.serve(MODEL, [1, 7])
    with pytest.raises(RepositoryError, match="label"):
        repository.set_label(MODEL, "bad label", 1)
    assert repository.labels(MODEL) == {"stable": 2, "canary": 2}


def test_a_first_publish_serves_its_version_and_a_later_one_changes_nothing(tmp_path, tiny_exports):
    repo = ModelRepository(tmp_path / "models")
    repo.add_version(MODEL, tiny_exports[1], version=1)
    repo.add_version(MODEL, tiny_exports[2], version=2)
    assert repo.serve_if_unserved(MODEL, 1, "stable") is True
    assert (repo.served_versions(MODEL), repo.labels(MODEL)) == ([1], {"stable": 1})
    before = repo.config_path.read_bytes()
    assert repo.serve_if_unserved(MODEL, 2, "stable") is False
    assert repo.config_path.read_bytes() == before


def test_a_model_listed_without_versions_counts_as_unserved(tmp_path, tiny_exports):
    repo = ModelRepository(tmp_path / "models")
    repo.add_version(MODEL, tiny_exports[2], version=2)
    repo.config_path.parent.mkdir(parents=True, exist_ok=True)
    repo.config_path.write_text(
        f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{repo.model_dir(MODEL)}" '
        'model_platform: "tensorflow" } }\n')
    assert repo.serve_if_unserved(MODEL, 2, "canary") is True
    assert (repo.served_versions(MODEL), repo.labels(MODEL)) == ([2], {"canary": 2})


# The scheme is what precedes the first "://", even where the path holds another.
@pytest.mark.parametrize("base", ["s3://bucket/models", "minio://host:9000/models", "s3://bucket/from-http://mirror"])
def test_a_repository_where_publishing_cannot_be_atomic_is_refused(base):
    scheme = base.split("://")[0]
    with pytest.raises(RepositoryError) as refused:
        check_repository_location(base)
    assert str(refused.value) == (
        f"The model repository {base} is on {scheme}://, where versions cannot be published atomically (and TF "
        "Serving reads no s3:// since 2.7); publish to gs://bucket/path or to a local or mounted folder instead.")


@pytest.mark.parametrize("base", ["gs://bucket/models", "/srv/models", "outputs/serving"])
def test_local_folders_and_gcs_can_hold_a_repository(base, tmp_path):
    assert check_repository_location(base) == base
    assert check_repository_location(tmp_path) == str(tmp_path)


def test_served_base_dir_names_the_path_the_server_sees(tmp_path, tiny_exports):
    repo = ModelRepository(tmp_path / "models", served_base_dir="/models")
    repo.add_version(MODEL, tiny_exports[1])
    repo.serve(MODEL, [1])
    assert repo.read_config().model_config_list.config[0].base_path == f"/models/{MODEL}"
    repo.remove_model(MODEL)
    assert len(repo.read_config().model_config_list.config) == 0


@pytest.mark.parametrize("name", ["..", "../etc", "a/b", "a..b", "", "/abs", ".hidden", "with space"])
def test_unsafe_model_names_are_refused(tmp_path, name):
    with pytest.raises(RepositoryError, match="invalid"):
        validate_model_name(name)
    with pytest.raises(RepositoryError):
        ModelRepository(tmp_path).model_dir(name)


def test_add_version_refuses_a_folder_that_is_not_a_saved_model(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RepositoryError, match="not a SavedModel"):
        ModelRepository(tmp_path / "models").add_version(MODEL, tmp_path / "empty")


def test_concurrent_label_changes_are_not_lost(repository, monkeypatch):
    import threading

    read_config = repository.read_config
    other_writer: list[threading.Thread] = []

    def read_config_while_another_writer_runs():
        config = read_config()
        if not other_writer:
            # Between this writer's read and its write, a second writer moves another label.
            other_writer.append(threading.Thread(target=repository.set_label, args=(MODEL, "beta", 1), daemon=True))
            other_writer[0].start()
            other_writer[0].join(timeout=1.0)  # blocked on the lock with the fix; finished (and overwritten) without
        return config

    monkeypatch.setattr(repository, "read_config", read_config_while_another_writer_runs)
    repository.set_label(MODEL, "stable", 2)
    other_writer[0].join(timeout=10)
    assert not other_writer[0].is_alive()
    monkeypatch.undo()
    assert repository.labels(MODEL) == {"stable": 2, "canary": 2, "beta": 1}
