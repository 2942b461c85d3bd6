"""The kubedl backend through the real `kubernetes` client against a fake API server (tests/rollout/clusters.py):
the Inference's predictors get their modelVersion and trafficWeight patched with 409 retries, the pods of each
predictor and ModelVersion are read through the pod proxy (never those KubeDL leaves running for a previous
ModelVersion), a good version is promoted and a disagreeing one rolled back, and a controller killed after every
write finishes the same way."""
from __future__ import annotations

import pytest

from pipeline.config import load_config
from serving.rollout.backends import BackendError, Endpoint
from serving.rollout.factory import build_backend, build_controller
from tests.rollout.clusters import NAMESPACE, ONE_STEP_PROMOTION, KubeDLCluster, rollout_killed_after_every_write

IDLE = {"stable": ("tiny-v1", 100), "canary": ("tiny-v1", 0)}


@pytest.fixture
def cluster(tmp_path, tiny_versions):
    with KubeDLCluster(tmp_path, tiny_versions) as running:
        yield running


def promoted_writes(steps: list[int]) -> list[dict]:
    """The Inference as an uninterrupted promotion of tiny-v2 writes it, one change at a time."""
    writes = [{"stable": ("tiny-v1", 100), "canary": ("tiny-v2", 0)}]
    writes += [{"stable": ("tiny-v1", 100 - s), "canary": ("tiny-v2", s)} for s in steps]
    return [*writes, {"stable": ("tiny-v2", 0), "canary": ("tiny-v2", 100)},
            {"stable": ("tiny-v2", 100), "canary": ("tiny-v2", 0)}]


def test_a_good_version_moves_through_the_traffic_weights_and_is_promoted(cluster):
    lines: list[str] = []
    controller = build_controller(load_config(None, cluster.overrides()), log=lines.append)
    cluster.fake.conflict_once("Inference", "taxi")
    record = controller.start(2)
    print("\n".join(lines))
    assert record["outcome"] == "promoted"
    assert cluster.fake.conflicts_sent == 1
    assert cluster.writes_to("Inference", "taxi") == promoted_writes([50, 100])
    verifications = [e["figures"] for e in record["events"] if "figures" in e]
    assert [v["weight"] for v in verifications] == [0, 50, 100]
    for figures in verifications:
        assert figures["canary_servers"] == 1
        assert 0 < figures["golden"]["rest_max_abs_diff"] <= 1e-3
        # No KubeDL pod exports metrics: the window is the verifier's own requests.
        assert figures["window"]["source"] == "verifier" and figures["window"]["error_rate"] == 0
    assert cluster.predictors() == {"stable": ("tiny-v2", 100), "canary": ("tiny-v2", 0)}
    assert cluster.stale_queries == [], "the pods KubeDL left for tiny-v1 were never taken for the candidate's"
    assert [h["outcome"] for h in cluster.state()["history"]] == ["promoted"]


def test_a_disagreeing_version_is_rolled_back_and_stable_is_never_touched(cluster):
    lines: list[str] = []
    controller = build_controller(load_config(None, cluster.overrides()), log=lines.append)
    record = controller.start(3)
    print("\n".join(lines))
    assert record["outcome"] == "rolled_back" and "disagrees with stable 1" in record["reason"]
    assert cluster.predictors() == IDLE
    assert all(write["stable"] == ("tiny-v1", 100) for write in cluster.writes_to("Inference", "taxi"))
    assert cluster.stale_queries == []


def test_a_version_without_a_usable_model_version_is_refused(cluster):
    cluster.fake.add({"apiVersion": "model.kubedl.io/v1alpha1", "kind": "ModelVersion",
                      "metadata": {"name": "tiny-v3", "namespace": NAMESPACE},
                      "spec": {"modelName": "tiny"},
                      "status": {"imageBuildPhase": "ImageBuildFailed", "message": "kaniko exited 1"}})
    controller = build_controller(load_config(None, cluster.overrides()), log=lambda _: None)
    with pytest.raises(BackendError, match=f"there is no ModelVersion {NAMESPACE}/tiny-v7 for version 7"):
        controller.start(7)
    with pytest.raises(BackendError, match=r"tiny-v3 failed to build \(kaniko exited 1\)"):
        controller.start(3)
    assert controller.document()["current"] is None
    assert [w for w in cluster.writes if w[0] != "Lease"] == [], "nothing but the controller's Lease was written"


def test_golden_requests_go_to_the_service_of_the_served_model_version(cluster):
    config = load_config(None, [f"rollout.kubedl.namespace={NAMESPACE}", "rollout.backend=kubedl",
                                f"rollout.kubedl.kubeconfig={cluster.fake.kubeconfig(cluster.root / 'kubeconfig')}",
                                "rollout.kubedl.model_version_name=tiny-v{version}"])
    backend = build_backend(config)
    backend.set_track("tiny", "canary", [1, 2], {})
    assert backend.endpoints("canary") == [Endpoint(f"http://taxi-canary-tiny-v2.{NAMESPACE}.svc:8080",
                                                    f"taxi-canary-tiny-v2.{NAMESPACE}.svc:9000")]
    assert backend.endpoints("stable") == [Endpoint(f"http://taxi-stable-tiny-v1.{NAMESPACE}.svc:8080",
                                                    f"taxi-stable-tiny-v1.{NAMESPACE}.svc:9000")]


def test_a_controller_killed_after_every_write_finishes_the_same_way(cluster):
    kills, output = rollout_killed_after_every_write(cluster, 2, "rollout.steps=[100]")
    print(output)
    print(f"killed {len(kills)} times, after writes to", sorted({(kind, name) for kind, name, _ in kills}))
    assert {kind for kind, _, _ in kills} == {"Inference", "ConfigMap"}
    assert cluster.writes_to("Inference", "taxi") == promoted_writes([100])
    [record] = cluster.state()["history"]
    assert record["outcome"] == "promoted"
    assert [(e["phase"], e["next"]) for e in record["events"]] == ONE_STEP_PROMOTION
    assert cluster.predictors() == {"stable": ("tiny-v2", 100), "canary": ("tiny-v2", 0)}
    assert cluster.stale_queries == []


def test_a_rollback_right_after_promotion_returns_both_predictors_to_the_previous_version(cluster):
    lines: list[str] = []
    controller = build_controller(load_config(None, [*cluster.overrides(), "rollout.keep_previous_seconds=600",
                                                     "rollout.steps=[100]"]), log=lines.append)
    assert controller.start(2, wait_retain=False)["phase"] == "retain", "\n".join(lines)
    assert cluster.predictors() == {"stable": ("tiny-v2", 100), "canary": ("tiny-v2", 0)}
    record = controller.rollback()
    assert record["outcome"] == "rolled_back" and record["reason"] == "asked for by hand"
    assert cluster.predictors() == IDLE
    assert cluster.stale_queries == []
