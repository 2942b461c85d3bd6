"""The Publisher on gs:// (serving/repository/gcs.py) against the GCS emulator, whose front enforces ifGenerationMatch
as GCS does: the same layout, manifests and models.config as the local repository; concurrent publishers get
distinct numbers and lose no config update; a publish interrupted before its commit is never listed or served; an
object store without atomic publishing is refused in one sentence."""
import json
import threading
import uuid
from pathlib import Path

import pytest

from components.publisher.publish import publish_model
from rollout.cli import version_rows
from serving.repository.base import RepositoryError, content_digest
from serving.repository.factory import open_repository
from serving.repository.gcs import GcsModelRepository
from serving.repository.local import ModelRepository
from tests.gcs_emulator import GcsEmulator
from tests.serving.conftest import save_tiny_model

RECORD = {"blessed": True, "pipeline_run": "run-1"}
CONFIGS = ("models.config", "models.canary.config")


@pytest.fixture(scope="module")
def gcs():
    with GcsEmulator() as emulator, pytest.MonkeyPatch.context() as patch:
        for name, value in emulator.environment().items():
            patch.setenv(name, value)
        yield emulator


@pytest.fixture
def bucket(gcs) -> str:
    name = f"models-{uuid.uuid4().hex[:8]}"
    gcs.create_bucket(name)
    return name


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exports")
    out = {}
    for name, bias in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        path = save_tiny_model(folder / name, bias)
        (path / "export_report.json").write_text(json.dumps({"passed": True}))
        out[name] = str(path)
    return out


def published(result) -> tuple:
    return result.version, result.new, result.bootstrapped


def test_gcs_gives_the_local_layout_manifests_and_models_config(gcs, bucket, exports, tmp_path):
    local, remote = str(tmp_path / "serving"), f"gs://{bucket}/serving"
    for base in (local, remote):
        results = [published(publish_model(exports[name], base, "taxi", RECORD)) for name in ("a", "a", "b")]
        assert results == [(1, True, ("stable", "canary")), (1, False, ()), (2, True, ())]

    objects = gcs.list_objects(bucket, "serving/")
    remote_files = {name.removeprefix("serving/") for name in objects if "/.claims/" not in name}
    local_files = {p.relative_to(local).as_posix() for p in Path(local).rglob("*") if p.is_file()} - {
        ".repository.lock"}
    assert remote_files == local_files, "the same version folders and config files, nothing staged left behind"
    assert {name for name in objects if "/.claims/" in name} == {"serving/taxi/.claims/1", "serving/taxi/.claims/2"}

    repository = GcsModelRepository(remote)
    for version in (1, 2):
        for name in ("MANIFEST.json", "publication.json", "saved_model.pb"):
            assert repository.read_version_file("taxi", version, name) == (Path(local, "taxi", str(version), name)
                                                                          .read_bytes()), (version, name)
        assert repository.verify("taxi", version).state == "ok"
    for name, track in zip(CONFIGS, ("stable", "canary"), strict=True):
        text = Path(local, name).read_text().replace(str(Path(local).resolve()), remote)
        assert text == gcs_text(gcs, bucket, f"serving/{name}") and f"{remote}/taxi" in text
        assert open_repository(remote, track).served_versions("taxi") == [1]
    assert version_rows(remote, "taxi") == version_rows(local, "taxi")


def gcs_text(gcs: GcsEmulator, bucket: str, name: str) -> str:
    import urllib.parse
    import urllib.request

    with urllib.request.urlopen(f"{gcs.url}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, '')}?alt=media") as r:
        return r.read().decode()


def test_a_changed_object_is_a_checksum_mismatch(gcs, bucket, exports):
    remote = f"gs://{bucket}/serving"
    publish_model(exports["a"], remote, "taxi", RECORD)
    repository = GcsModelRepository(remote)
    tampered = json.dumps({"passed": True, "tampered": 1})
    repository.client.bucket(bucket).blob("serving/taxi/1/export_report.json").upload_from_string(tampered)
    [row] = version_rows(remote, "taxi")
    assert (row["checksums"], row["checksum_problems"]) == ("MISMATCH", ["export_report.json: changed"])


def in_both_threads_at_once(monkeypatch, method: str) -> dict[str, int]:
    """Makes the first call of GcsModelRepository.`method` in each of two threads wait for the other, so both act on
    the same state (both list the claims, or both read models.config) before either writes; counts the 412s."""
    from google.api_core.exceptions import PreconditionFailed
    from google.cloud.storage import Blob

    barrier, lock, threads, refused = threading.Barrier(2, timeout=60), threading.Lock(), set(), {"412": 0}
    original = getattr(GcsModelRepository, method)

    def synchronized(self, *args):
        result = original(self, *args)
        with lock:
            first = len(threads) < 2 and threading.get_ident() not in threads
            threads.add(threading.get_ident())
        if first:
            barrier.wait()
        return result

    def counting(write):
        def counted(*args, **kwargs):
            try:
                return write(*args, **kwargs)
            except PreconditionFailed:
                refused["412"] += 1
                raise
        return counted

    monkeypatch.setattr(GcsModelRepository, method, synchronized)
    for write in ("upload_from_string", "upload_from_filename"):
        monkeypatch.setattr(Blob, write, counting(getattr(Blob, write)))
    return refused


def run_together(*calls) -> list:
    results, errors = [None] * len(calls), []

    def run(index, call):
        try:
            results[index] = call()
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return results


def test_two_publishers_claiming_at_once_get_distinct_versions(gcs, bucket, exports, monkeypatch):
    remote = f"gs://{bucket}/serving"
    refused = in_both_threads_at_once(monkeypatch, "_claimed")
    results = run_together(lambda: publish_model(exports["a"], remote, "taxi", RECORD),
                           lambda: publish_model(exports["b"], remote, "taxi", RECORD))
    assert sorted(r.version for r in results) == [1, 2] and refused["412"] >= 1, "both claimed 1; one was refused"
    repository = GcsModelRepository(remote)
    assert repository.versions("taxi") == [1, 2] and repository.incomplete_versions("taxi") == []
    for result, name in zip(results, "ab", strict=True):
        assert repository.verify("taxi", result.version).state == "ok"
        manifest = json.loads(repository.read_version_file("taxi", result.version, "MANIFEST.json"))["files"]
        assert repository.version_with_content("taxi", content_digest(manifest)) == result.version
        assert repository.read_version_file("taxi", result.version, "saved_model.pb") == Path(
            exports[name], "saved_model.pb").read_bytes(), "each number holds its own publisher's model"


def test_two_publishers_writing_models_config_at_once_lose_neither_update(gcs, bucket, exports, monkeypatch):
    remote = f"gs://{bucket}/serving"
    refused = in_both_threads_at_once(monkeypatch, "_read_config_object")
    run_together(lambda: publish_model(exports["a"], remote, "taxi", RECORD),
                 lambda: publish_model(exports["b"], remote, "fares", RECORD))
    assert refused["412"] >= 1, "both read the same models.config; one write was refused and applied again"
    for track in ("stable", "canary"):
        config = open_repository(remote, track).read_config()
        assert sorted(c.name for c in config.model_config_list.config) == ["fares", "taxi"], track
        assert open_repository(remote, track).labels("fares") == {track: 1}


def test_a_publish_interrupted_before_its_commit_is_never_listed_or_served(gcs, bucket, exports, monkeypatch):
    remote = f"gs://{bucket}/serving"
    publish_model(exports["a"], remote, "taxi", RECORD)
    configs = {name: gcs_text(gcs, bucket, f"serving/{name}") for name in CONFIGS}

    def fail(self, target, manifest):
        raise RuntimeError("the store went away")

    monkeypatch.setattr(GcsModelRepository, "_commit", fail)
    with pytest.raises(RuntimeError):
        publish_model(exports["b"], remote, "taxi", RECORD)
    assert not [n for n in gcs.list_objects(bucket, "serving/taxi/") if "/2/" in n or "/.staging-" in n], \
        "a failed publish removes what it wrote"

    class Killed(BaseException):
        pass

    def killed(self, target, manifest):
        raise Killed  # as SIGKILL at the commit step: nothing below runs
    monkeypatch.setattr(GcsModelRepository, "_commit", killed)
    monkeypatch.setattr(GcsModelRepository, "_discard", lambda self, written, target: None)
    with pytest.raises(Killed):
        publish_model(exports["c"], remote, "taxi", RECORD)
    left = gcs.list_objects(bucket, "serving/taxi/3/")
    assert "serving/taxi/3/saved_model.pb" in left and "serving/taxi/3/MANIFEST.json" not in left

    repository = GcsModelRepository(remote)
    assert repository.versions("taxi") == [1] and repository.incomplete_versions("taxi") == [2, 3]
    assert [row["version"] for row in version_rows(remote, "taxi")] == [1], "mlops versions lists no half version"
    assert {name: gcs_text(gcs, bucket, f"serving/{name}") for name in CONFIGS} == configs
    with pytest.raises(RepositoryError, match=r"has no version\(s\) \[3\]"):
        repository.serve("taxi", [1, 3])

    monkeypatch.undo()
    again = publish_model(exports["c"], remote, "taxi", RECORD)
    assert published(again) == (4, True, ()), "claimed numbers are never reused"
    assert [row["version"] for row in version_rows(remote, "taxi")] == [1, 4]


def test_explicit_versions_only_grow_on_gcs(gcs, bucket, exports):
    repository = GcsModelRepository(f"gs://{bucket}/serving")
    assert repository.add_version("taxi", exports["a"], version=5) == 5
    with pytest.raises(RepositoryError, match="already exists"):
        repository.add_version("taxi", exports["b"], version=5)
    with pytest.raises(RepositoryError, match="only grow"):
        repository.add_version("taxi", exports["b"], version=4)
    assert gcs.list_objects(bucket, "serving/taxi/4/") == []
    assert repository.verify("taxi", 5).state == "ok" and repository.publication("taxi", 5) == {}


@pytest.mark.parametrize("base", ["s3://bucket/serving", "minio://bucket/serving"])
def test_an_object_store_without_atomic_publishing_is_refused(base, exports, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scheme = base.split(":")[0]
    sentence = (f"The model repository {base} is on {scheme}://, where versions cannot be published atomically (and "
                "TF Serving reads no s3:// since 2.7); publish to gs://bucket/path or to a local or mounted folder "
                "instead.")
    with pytest.raises(RepositoryError) as refused:
        publish_model(exports["a"], base, "taxi", RECORD)
    assert str(refused.value) == sentence
    with pytest.raises(RepositoryError, match="publish to gs://"):
        version_rows(base, "taxi")
    for local_only in (ModelRepository, lambda uri: ModelRepository.for_track(uri, "stable")):
        with pytest.raises(RepositoryError, match="not a local folder"):
            local_only(f"gs://{uuid.uuid4().hex}/serving")
    assert list(tmp_path.iterdir()) == [], "nothing may land on the local disk"
