"""The rollout Job and the monitor's CronJob beside the object-storage overlay (issue 42 item 7): that overlay deletes
the model claim the plain Job and CronJob mount, so their pods would stay Pending; its rollout-job and monitor
kustomizations give them an emptyDir that an init container fills from the bucket. The init containers' scripts run
here with the stand-in for rclone of test_object_storage_sync.py, and what they copy is what the controller and the
monitor read: a version whose checksums match, and golden rows."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rollout.backends import check_published_version
from rollout.verify import load_golden_rows
from serving.repository.base import MANIFEST_FILE, build_manifest
from tests.k8s.render import render
from tests.k8s.test_object_storage_sync import FAKE_RCLONE

MODEL_CLAIM = "tfserving-model-repository"
OVERLAY = "k8s/serving/overlays/object-storage"
PLAIN = {"rollout-job": "k8s/serving/rollout-job", "monitor": "k8s/serving/monitor"}


def pod_spec(objects: list[dict]) -> dict:
    [workload] = [o for o in objects if o["kind"] in ("Job", "CronJob")]
    spec = workload["spec"]
    return (spec["jobTemplate"]["spec"] if workload["kind"] == "CronJob" else spec)["template"]["spec"]


def mounted_claims(spec: dict) -> set[str]:
    return {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}


def claims_of(objects: list[dict]) -> set[str]:
    return {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}


@pytest.mark.parametrize("workload", sorted(PLAIN))
def test_beside_the_object_storage_overlay_no_pod_waits_for_the_model_claim_it_deletes(workload):
    overlay_claims = claims_of(render(OVERLAY))
    assert MODEL_CLAIM not in overlay_claims
    # The plain manifests mount it: beside the overlay their pods would stay Pending.
    assert MODEL_CLAIM in mounted_claims(pod_spec(render(PLAIN[workload])))
    objects = render(f"{OVERLAY}/{workload}")
    spec = pod_spec(objects)
    assert MODEL_CLAIM not in mounted_claims(spec)
    assert mounted_claims(spec) <= claims_of(objects) | {"request-logs"}  # the request-logs overlay makes that one
    [copy] = spec["initContainers"]
    [main] = spec["containers"]
    mount = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}["model-repository"]
    assert {m["name"]: m["mountPath"] for m in copy["volumeMounts"]}["model-repository"] == mount
    assert {e["name"]: e["value"] for e in copy["env"]}["REPOSITORY"] == mount
    volumes = {v["name"] for v in spec["volumes"]}
    assert {m["name"] for c in (copy, main) for m in c["volumeMounts"]} <= volumes


def publish(bucket: Path, version: int) -> None:
    folder = bucket / "serving/taxi" / str(version)
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"model %d" % version)
    (folder / "variables/variables.index").write_bytes(b"index %d" % version)
    (folder / MANIFEST_FILE).write_text(json.dumps({"files": build_manifest(folder)}))


def copy_script(workload: str) -> tuple[str, dict[str, str]]:
    [copy] = pod_spec(render(f"{OVERLAY}/{workload}"))["initContainers"]
    assert copy["command"] == ["/bin/sh", "-c"]
    return copy["args"][0], {e["name"]: e["value"] for e in copy["env"]}


def run_copy(tmp_path: Path, workload: str) -> subprocess.CompletedProcess:
    script, env = copy_script(workload)
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    (tools / "rclone").write_text(FAKE_RCLONE)
    (tools / "rclone").chmod(0o755)
    environment = {**os.environ, **env, "PATH": f"{tools}:{os.environ['PATH']}", "BUCKET": str(tmp_path / "bucket"),
                   "REMOTE": "models:serving", "REPOSITORY": str(tmp_path / "data/serving")}
    return subprocess.run(["/bin/sh", "-c", script], env=environment, capture_output=True, text=True, timeout=60)


def test_the_rollout_jobs_copy_holds_what_the_controller_reads(tmp_path):
    publish(tmp_path / "bucket", 1)
    publish(tmp_path / "bucket", 2)
    result = run_copy(tmp_path, "rollout-job")
    assert result.returncode == 1
    assert result.stderr.strip() == ("no golden rows at models:serving/.golden: copy an eval CSV there "
                                     "(rollout.golden_data reads it)")
    golden = tmp_path / "bucket/serving/.golden"
    golden.mkdir()
    (golden / "eval.csv").write_text("fare,trip_start_hour,payment_type\n2.5,7,Cash\n9.0,23,Credit Card\n")
    result = run_copy(tmp_path, "rollout-job")
    assert result.returncode == 0, result.stderr
    repository = tmp_path / "data/serving"
    check_published_version(repository, "taxi", 2)  # the candidate's checksums, as the controller checks them
    assert [row["payment_type"] for row in load_golden_rows(str(repository / ".golden"), "", 5)] == [
        "Cash", "Credit Card"]


def test_the_monitors_copy_holds_every_version_and_a_failing_listing_fails_the_pod(tmp_path):
    publish(tmp_path / "bucket", 1)
    publish(tmp_path / "bucket", 3)
    result = run_copy(tmp_path, "monitor")
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "data/serving/taxi")) == ["1", "3"]
    check_published_version(tmp_path / "data/serving", "taxi", 1)
    (tmp_path / "bucket/serving/taxi").rename(tmp_path / "bucket/serving/other")
    assert run_copy(tmp_path, "monitor").returncode != 0
