"""The kubedl backend through the real `kubernetes` client against a fake API server and a stand-in for KubeDL's
controller that does what KubeDL does (tests/rollout/clusters.py KubeDLCluster, after kubedl-io/kubedl b93a2b4):
the candidate gets an Inference of its own (KubeDL never applies a change to an existing predictor), the project's
routes split the traffic between the versions' predictor Services with 409 retries, the ModelVersion is the one the
TFJob recorded, a good version is promoted and a disagreeing one rolled back, and a controller killed after every
write finishes the same way."""
from __future__ import annotations

import pytest

from rollout.backends import BackendError, Endpoint
from rollout.factory import build_backend, build_controller
from settings.config import load_config
from tests.rollout.clusters import NAMESPACE, ONE_STEP_PROMOTION, KubeDLCluster, rollout_killed_after_every_write

IDLE = [("taxi-v1-serve", 100), ("taxi-v1-serve", 0)]


@pytest.fixture
def cluster(tmp_path, tiny_versions):
    with KubeDLCluster(tmp_path, tiny_versions) as running:
        yield running


def promoted_writes(steps: list[int]) -> list[list[tuple[str, int]]]:
    """The HTTPRoute's backendRefs as an uninterrupted promotion of version 2 writes them, one change at a time."""
    writes = [[("taxi-v1-serve", 100), ("taxi-v2-serve", 0)]]
    writes += [[("taxi-v1-serve", 100 - s), ("taxi-v2-serve", s)] for s in steps]
    return [*writes, [("taxi-v2-serve", 0), ("taxi-v2-serve", 100)], [("taxi-v2-serve", 100), ("taxi-v2-serve", 0)]]


def test_a_good_version_gets_its_own_inference_and_moves_through_the_route_weights(cluster):
    lines: list[str] = []
    controller = build_controller(load_config(None, cluster.overrides()), log=lines.append)
    cluster.fake.conflict_once("HTTPRoute", "taxi")
    record = controller.start(2)
    print("\n".join(lines))
    assert record["outcome"] == "promoted"
    assert cluster.fake.conflicts_sent == 1
    assert cluster.writes_to("HTTPRoute", "taxi") == promoted_writes([50, 100])
    # The GRPCRoute moves alike, on KubeDL's gRPC port.
    assert cluster.routes()["GRPCRoute"] == [("taxi-v2-serve", 100), ("taxi-v2-serve", 0)]
    # The candidate's Inference: version 2's ModelVersion as its TFJob recorded it, version 2 at the model path.
    inference = cluster.fake.find("Inference", NAMESPACE, "taxi-v2")
    [predictor] = inference["spec"]["predictors"]
    assert (predictor["name"], predictor["modelVersion"], predictor["modelPath"]) == (
        "serve", "mv-taxi-trainer-v2-3f9a1", "/mnt/models/taxi/2")
    assert cluster.writes_to("Inference", "taxi-v2") and cluster.writes_to("Inference", "taxi-v1") == []
    assert cluster.ignored_changes == [], "no Inference is ever changed: KubeDL would not apply it"
    verifications = [e["figures"] for e in record["events"] if "figures" in e]
    assert [v["weight"] for v in verifications] == [0, 50, 100]
    for figures in verifications:
        assert figures["canary_servers"] == 1
        assert 0 < figures["golden"]["rest_max_abs_diff"] <= 1e-3
        # No KubeDL pod exports metrics: the window is the verifier's own requests.
        assert figures["window"]["source"] == "verifier" and figures["window"]["error_rate"] == 0
    assert [h["outcome"] for h in cluster.state()["history"]] == ["promoted"]


def test_a_disagreeing_version_is_rolled_back_and_stable_is_never_touched(cluster):
    lines: list[str] = []
    controller = build_controller(load_config(None, cluster.overrides()), log=lines.append)
    record = controller.start(3)
    print("\n".join(lines))
    assert record["outcome"] == "rolled_back" and "disagrees with stable 1" in record["reason"]
    assert cluster.routes()["HTTPRoute"] == IDLE
    assert all(write[0] == ("taxi-v1-serve", 100) for write in cluster.writes_to("HTTPRoute", "taxi"))


def test_a_version_without_a_usable_model_version_is_refused(cluster):
    cluster.fake.add({"apiVersion": "model.kubedl.io/v1alpha1", "kind": "ModelVersion",
                      "metadata": {"name": "tiny-v3", "namespace": NAMESPACE},
                      "spec": {"modelName": "tiny"},
                      "status": {"imageBuildPhase": "ImageBuildFailed", "message": "kaniko exited 1"}})
    cluster.fake.add({"apiVersion": "training.kubedl.io/v1alpha1", "kind": "TFJob",
                      "metadata": {"name": "taxi-trainer-v4", "namespace": NAMESPACE}, "spec": {}, "status": {}})
    controller = build_controller(load_config(None, cluster.overrides()), log=lambda _: None)
    with pytest.raises(BackendError, match=f"cannot read TFJob {NAMESPACE}/taxi-trainer-v7"):
        controller.start(7)
    with pytest.raises(BackendError, match="taxi-trainer-v4 has recorded no ModelVersion"):
        controller.start(4)
    with pytest.raises(BackendError, match=r"tiny-v3 failed to build \(kaniko exited 1\)"):
        controller.start(3)
    assert controller.document()["current"] is None
    assert [w for w in cluster.writes if w[0] != "Lease"] == [], "nothing but the controller's Lease was written"
    # Without rollout.kubedl.tfjob the name template says it (versions registered by hand).
    by_name = build_controller(load_config(None, [*cluster.overrides(), "rollout.kubedl.tfjob=",
                                                  "rollout.kubedl.model_version_name=tiny-v{version}"]),
                               log=lambda _: None)
    with pytest.raises(BackendError, match=f"there is no ModelVersion {NAMESPACE}/tiny-v2 for version 2"):
        by_name.start(2)


def test_golden_requests_go_to_the_predictor_service_of_each_tracks_version(cluster):
    config = load_config(None, [f"rollout.kubedl.namespace={NAMESPACE}", "rollout.backend=kubedl",
                                f"rollout.kubedl.kubeconfig={cluster.fake.kubeconfig(cluster.root / 'kubeconfig')}",
                                "rollout.kubedl.tfjob=taxi-trainer-v{version}"])
    backend = build_backend(config)
    backend.set_track("tiny", "canary", [1, 2], {})
    assert backend.endpoints("canary") == [Endpoint(f"http://taxi-v2-serve.{NAMESPACE}.svc:8080",
                                                    f"taxi-v2-serve.{NAMESPACE}.svc:9000")]
    assert backend.endpoints("stable") == [Endpoint(f"http://taxi-v1-serve.{NAMESPACE}.svc:8080",
                                                    f"taxi-v1-serve.{NAMESPACE}.svc:9000")]
    assert backend.track_config("tiny", "canary") == ([2], {"canary": 2})
    assert backend.canary_weight() == 0


def test_a_controller_killed_after_every_write_finishes_the_same_way(cluster):
    kills, output = rollout_killed_after_every_write(cluster, 2, "rollout.steps=[100]")
    print(output)
    print(f"killed {len(kills)} times, after writes to", sorted({(kind, name) for kind, name, _ in kills}))
    assert {kind for kind, _, _ in kills} == {"Inference", "HTTPRoute", "GRPCRoute", "ConfigMap"}
    assert cluster.writes_to("HTTPRoute", "taxi") == promoted_writes([100])
    [record] = cluster.state()["history"]
    assert record["outcome"] == "promoted"
    assert [(e["phase"], e["next"]) for e in record["events"]] == ONE_STEP_PROMOTION
    assert cluster.routes()["HTTPRoute"] == [("taxi-v2-serve", 100), ("taxi-v2-serve", 0)]
    assert cluster.ignored_changes == []


def test_a_rollback_right_after_promotion_returns_both_tracks_to_the_previous_version(cluster):
    lines: list[str] = []
    controller = build_controller(load_config(None, [*cluster.overrides(), "rollout.keep_previous_seconds=600",
                                                     "rollout.steps=[100]"]), log=lines.append)
    assert controller.start(2, wait_retain=False)["phase"] == "retain", "\n".join(lines)
    assert cluster.routes()["HTTPRoute"] == [("taxi-v2-serve", 100), ("taxi-v2-serve", 0)]
    record = controller.rollback()
    assert record["outcome"] == "rolled_back" and record["reason"] == "asked for by hand"
    assert cluster.routes()["HTTPRoute"] == IDLE
    # The previous version's Inference was never removed: the rollback needed no new pods.
    assert cluster.fake.find("Inference", NAMESPACE, "taxi-v1") is not None
