"""The kubernetes backend through the real `kubernetes` client against a fake API server (tests/rollout/clusters.py):
ConfigMaps, routes and pods with resourceVersion and 409 Conflict, a "kubelet" that applies a models.config as TF
Serving would (refusing a label moved to a version not yet AVAILABLE), pods answering as TF Serving 2.16.1 does
(a label's status is the model's status), user traffic sent by the routes' weights, and a real Prometheus scraping the
servers that stand for the pods (the fake pods are API objects no Prometheus can reach)."""
from __future__ import annotations

import pytest

from rollout.factory import build_controller
from rollout.state import StateConflictError
from settings.config import load_config
from tests.rollout.clusters import (
    CONFIG_MAPS,
    ONE_STEP_PROMOTION,
    ServingCluster,
    rollout_killed_after_every_write,
)
from tests.rollout.conftest import MODEL

ALL_ON_STABLE = {"HTTPRoute": {"tfserving-stable": 100, "tfserving-canary": 0},
                 "GRPCRoute": {"tfserving-stable": 100, "tfserving-canary": 0}}


@pytest.fixture
def cluster(tmp_path, tiny_versions, request):
    with ServingCluster(tmp_path, tiny_versions, getattr(request, "param", 0.0)) as running:
        yield running


def test_a_rollout_through_the_api_retries_conflicts_and_promotes(cluster):
    lines: list[str] = []
    controller = build_controller(load_config(None, cluster.overrides()), log=lines.append)
    # Someone else updates each object just before the controller's first write: the client gets 409 and re-reads.
    for kind, name in (("ConfigMap", CONFIG_MAPS["canary"]), ("ConfigMap", CONFIG_MAPS["stable"]),
                       ("HTTPRoute", "tfserving"), ("GRPCRoute", "tfserving-grpc")):
        cluster.fake.conflict_once(kind, name)
    record = controller.start(2)
    print("\n".join(lines))
    assert record["outcome"] == "promoted"
    assert cluster.fake.conflicts_sent == 4
    assert cluster.refused == [], "every label moved only to a version already AVAILABLE"
    windows = [e["figures"]["window"] for e in record["events"] if "figures" in e]
    # At 0% no user gets the canary's answers: the routes' RequestMirror filter copies their requests to it, and the
    # answers both tracks' pods kept are read through the API server's pod proxy and joined by request id; every
    # other window is the users', from Prometheus.
    shadow = windows[0]
    assert (shadow["source"], shadow["traffic"], shadow["verdict"]) == ("shadow", "users", "passed"), shadow
    assert shadow["shadow"]["pairs"] >= 30 and shadow["shadow"]["disagreements"] == 0, shadow["shadow"]
    assert any(p.startswith(f"monitoring/answers/{MODEL}/") for p in cluster.proxied)
    assert cluster.gateway.mirrored >= shadow["shadow"]["pairs"]
    assert len(windows) >= 3 and {(w["source"], w["traffic"]) for w in windows[1:]} == {("prometheus", "users")}
    assert all(w["requests"] > 0 and w["error_rate"] == 0 and 0 < w["p99_ms"] <= 2000 for w in windows), windows
    assert not [p for p in cluster.proxied if p.startswith("monitoring/prometheus")], "no metrics through the proxy"
    # The mirror is gone once users get the canary's answers.
    assert [f for route in ("tfserving", "tfserving-grpc")
            for f in cluster.fake.find("HTTPRoute" if route == "tfserving" else "GRPCRoute", "mlops-test", route)
            ["spec"]["rules"][0].get("filters", [])] == []
    assert cluster.gateway.failed == [] and cluster.gateway.sent["canary"] > 0, "user traffic followed the routes"
    assert cluster.models_config("stable") == ([2], {"stable": 2})
    assert cluster.models_config("canary") == ([2], {"canary": 2})
    assert cluster.weights() == ALL_ON_STABLE
    state = cluster.state()
    assert state["current"] is None and [h["outcome"] for h in state["history"]] == ["promoted"]
    # The fake kubelet refuses what TF Serving refuses: a label moved onto a version that is not loaded.
    controller.backend.set_track(MODEL, "canary", [2, 3], {"canary": 3})
    assert cluster.refused == ["canary: Request to assign label to version 3 of model tiny, which is not currently "
                               "available for inference"]
    assert (cluster.root / "rollouts" / f"{MODEL}-v2-{record['id']}.html").exists()


@pytest.mark.parametrize("cluster", [0.2], indirect=True)
def test_canary_errors_in_the_prometheus_metrics_roll_back(cluster):
    lines: list[str] = []
    controller = build_controller(load_config(None, cluster.overrides()), log=lines.append)
    record = controller.start(2)
    print("\n".join(lines))
    # One in five of the user requests the route gave the canary failed: at the 50% step its error rate is far over.
    assert record["outcome"] == "rolled_back" and record["reason"].startswith(
        "verification at 50% failed: the canary failed "), record["reason"]
    assert "user requests" in record["reason"] and "above rollout.max_error_rate 0.01" in record["reason"]
    # The cause, read from the canary pod's server through the API server's pod proxy: the input the requests lacked.
    [failed] = [e["figures"] for e in record["events"] if e.get("figures", {}).get("error")]
    causes = failed["window"]["causes"]
    assert causes["failed_requests"] >= 2 and "unread" not in causes, causes
    [message] = causes["messages"]
    assert message["count"] == causes["failed_requests"], causes
    assert message["message"].endswith("(unknown: [], missing: ['payment_type', 'trip_start_hour'])"), message
    assert causes["values"] == [{"feature": "fare", "value": 2.5, "count": causes["failed_requests"]}]
    assert f"monitoring/failures/{MODEL}" in cluster.proxied
    assert any("causes: " in line and "fare=2.5" in line for line in lines)
    assert cluster.models_config("stable") == ([1], {"stable": 1})
    assert cluster.models_config("canary") == ([1], {"canary": 1})
    assert cluster.weights() == ALL_ON_STABLE
    assert cluster.writes_to("ConfigMap", CONFIG_MAPS["stable"]) == [], "the stable track is never touched"


def test_a_stale_state_writer_gets_a_conflict(cluster):
    controller = build_controller(load_config(None, cluster.overrides()), log=lambda _: None)
    store = controller.backend.store
    document, token = store.load()
    store.save({**document, "history": []}, token)
    with pytest.raises(StateConflictError):
        store.save(document, token)


def test_a_controller_killed_after_every_write_finishes_the_same_way(cluster):
    """SIGKILL the moment each write of the controller lands (before it reads the answer), start it again: the
    state read back from the ConfigMap leads it to the end state of an uninterrupted rollout, and no object is ever
    written twice with the same content (no action is repeated)."""
    kills, output = rollout_killed_after_every_write(cluster, 2, "rollout.steps=[100]")
    print(output)
    print(f"killed {len(kills)} times, after writes to", sorted({(kind, name) for kind, name, _ in kills}))
    assert {name for _, name, _ in kills} >= {*CONFIG_MAPS.values(), "tfserving", "tfserving-grpc",
                                              "tfserving-rollout"}
    assert cluster.writes_to("ConfigMap", CONFIG_MAPS["canary"]) == [([1, 2], {"canary": 1}), ([2], {"canary": 2})]
    assert cluster.writes_to("ConfigMap", CONFIG_MAPS["stable"]) == [
        ([1, 2], {"stable": 1}), ([1, 2], {"stable": 2}), ([2], {"stable": 2})]
    for route in ("tfserving", "tfserving-grpc"):
        # (the canary's weight, the share copied to it): the shadow step's mirror on and off, then the one step.
        writes = [(w["tfserving-canary"], w["mirrored"]) for w in cluster.writes_to(
            "HTTPRoute" if route == "tfserving" else "GRPCRoute", route)]
        assert writes == [(0, 100), (0, 0), (100, 0), (0, 0)]
    assert cluster.refused == []
    state = cluster.state()
    [record] = state["history"]
    assert state["current"] is None and record["outcome"] == "promoted"
    assert [(e["phase"], e["next"]) for e in record["events"]] == ONE_STEP_PROMOTION
    assert cluster.models_config("stable") == ([2], {"stable": 2})
    assert cluster.models_config("canary") == ([2], {"canary": 2})
    assert cluster.weights() == ALL_ON_STABLE


def test_a_rollback_right_after_promotion_moves_the_stable_label_back_to_the_loaded_previous_version(cluster):
    lines: list[str] = []
    controller = build_controller(load_config(None, [*cluster.overrides(), "rollout.keep_previous_seconds=600",
                                                     "rollout.steps=[100]"]), log=lines.append)
    assert controller.start(2, wait_retain=False)["phase"] == "retain", "\n".join(lines)
    assert cluster.models_config("stable") == ([1, 2], {"stable": 2}), "version 1 stays loaded"
    record = controller.rollback()
    assert record["outcome"] == "rolled_back" and record["reason"] == "asked for by hand"
    # Both versions loaded, the label on the older one: its status would name both, its metadata names 1.
    assert cluster.writes_to("ConfigMap", CONFIG_MAPS["stable"])[-2:] == [([1, 2], {"stable": 1}), ([1], {"stable": 1})]
    assert cluster.models_config("stable") == ([1], {"stable": 1})
    assert cluster.models_config("canary") == ([1], {"canary": 1})
    assert cluster.weights() == ALL_ON_STABLE and cluster.refused == []


def test_the_kubernetes_backend_refuses_to_verify_without_prometheus():
    from rollout.backends import BackendError
    from rollout.factory import build_backend

    with pytest.raises(BackendError, match="rollout.backend kubernetes reads its verification windows from "
                                           "Prometheus: set rollout.prometheus.url"):
        build_backend(load_config(None, ["rollout.backend=kubernetes"]))


@pytest.mark.parametrize("backend, overrides, selector", [
    ("kubernetes", [], 'namespace="mlops-serving"'),
    ("kubedl", ["rollout.kubedl.namespace=team-a"], 'namespace="team-a"'),
    ("kubernetes", ['rollout.prometheus.selector=job="tfserving"'], 'job="tfserving"'),
    ("local", [], ""),
])
def test_on_a_cluster_prometheus_selects_the_rollouts_namespace_unless_told_otherwise(backend, overrides, selector):
    from rollout.factory import metrics_source

    config = load_config(None, [f"rollout.backend={backend}", "rollout.prometheus.url=http://127.0.0.1:9", *overrides])
    metrics = metrics_source(config.rollout)
    assert metrics.selector == selector
    assert metrics.matchers() == ",".join(['track=~"stable|canary"', *([selector] if selector else [])])


def test_a_changed_or_unreachable_version_is_refused_before_anything_is_written(cluster):
    """The repository the pods serve, as the controller sees it (the rollout Job mounts its claim): a version whose
    files changed after publishing, or a repository that is not there, is refused with nothing loaded or routed."""
    from rollout.backends import BackendError
    from serving.repository.local import ModelRepository

    data = next((ModelRepository(cluster.base).version_dir(MODEL, 2) / "variables").glob("variables.data-*"))
    with open(data, "ab") as f:
        f.write(b"\0")
    def written():
        return [w for w in cluster.writes if w[0] != "Lease"]  # the controller's own Lease is taken and released

    before = (cluster.models_config("stable"), cluster.models_config("canary"), cluster.weights(), written())
    controller = build_controller(load_config(None, cluster.overrides()))
    with pytest.raises(BackendError, match=r"version 2 of 'tiny' does not match its checksum manifest \(variables/"):
        controller.start(2)
    elsewhere = build_controller(load_config(None, [*cluster.overrides(), f"output_root={cluster.root / 'absent'}"]))
    with pytest.raises(BackendError, match=r"the model repository .*absent/serving/tiny is not here, so version 3"):
        elsewhere.start(3)
    after = (cluster.models_config("stable"), cluster.models_config("canary"), cluster.weights(), written())
    assert after == before, "nothing was loaded, labelled or routed"
