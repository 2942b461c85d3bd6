"""Re-applying k8s/serving after a rollout, against the real kube-apiserver (tests/k8s/controlplane.py): the overlay
applied server-side and the bootstrap created as k8s/serving/README.md says, the controller's writes made through
`rollout.kube.KubernetesBackend` and its state store, the replicas moved as the HPAs move them; then the overlay
re-applied client-side, server-side, and with the README's `--prune -l` selector. What the controller owns (the
tracks' models.config, the route weights, the state ConfigMap) and the replicas stay as they were.

The kustomizations are applied through a wrapper that only sets a namespace of the test's own, so that the session's
other tests keep `mlops-serving`; the wrapper renders the same objects otherwise."""
from __future__ import annotations

import json
import os
import re
import uuid

import yaml
from kubernetes import client

from rollout.backends import Endpoint
from rollout.kube import KubernetesBackend
from settings.config import RolloutKubernetesConfig
from tests.k8s.render import REPO

OVERLAY = "k8s/serving/overlays/dev"
BOOTSTRAP = "k8s/serving/bootstrap"
MONITOR = "k8s/serving/monitor"
TRAINING = "k8s/training/base"
README = REPO / "k8s" / "serving" / "README.md"


def wrapped(folder, kustomization: str, namespace: str) -> str:
    """A kustomization that is `kustomization` in `namespace`."""
    folder.mkdir(parents=True)
    (folder / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": namespace,
        "resources": [os.path.relpath(REPO / kustomization, folder)]}))
    return str(folder)


def prune_selector(apply_set: str) -> str:
    """The selector k8s/serving/README.md gives for `kubectl apply --prune` of the `apply_set` kustomization."""
    text = README.read_text()
    if "kubectl apply -k k8s/serving/overlays/dev --prune" not in text:
        return "app.kubernetes.io/part-of=tfx-mlops"  # before the README gave one: what the review saw users run
    found = re.findall(rf"`?(tfx-mlops/prune-set={apply_set})`?", text)
    assert found, f"k8s/serving/README.md names no prune selector for {apply_set}"
    return found[0]


def owned(backend: KubernetesBackend, core: client.CoreV1Api, namespace: str) -> dict:
    """What the controller owns, and the replicas, as the server holds them."""
    config_maps = {name: core.read_namespaced_config_map(name, namespace)
                   for name in ("tfserving-stable-config", "tfserving-canary-config", "tfserving-rollout")}
    routes = {plural: backend._route(plural, name)["spec"]["rules"]
              for plural, name in (("httproutes", "tfserving"), ("grpcroutes", "tfserving-grpc"))}
    apps = client.AppsV1Api(backend.core.api_client)
    return {"config_maps": {name: (cm.data, cm.metadata.labels) for name, cm in config_maps.items()},
            "weights": {plural: [[(r["name"], r.get("weight")) for r in rule["backendRefs"]] for rule in rules]
                        for plural, rules in routes.items()},
            "tracks": {track: backend.track_config("taxi", track) for track in ("stable", "canary")},
            "replicas": {track: apps.read_namespaced_deployment(f"tfserving-{track}", namespace).spec.replicas
                         for track in ("stable", "canary")}}


def neighbours(cluster, namespace: str) -> dict[str, dict]:
    """The project's objects a user applies beside the overlay, client-side as their comments say: the monitor's
    CronJob and reports claim (k8s/serving/monitor) in the same namespace, k8s/training/base moved to
    `<namespace>-training`, and the serving Namespace itself; {kind/name: its metadata as the server holds it}."""
    found = {}
    for kind, name, where in (("cronjob", "mlops-monitor", namespace), ("pvc", "mlops-monitor-reports", namespace),
                              ("namespace", f"{namespace}-training", ""), ("namespace", namespace, ""),
                              ("pvc", "mlops-pipeline-root", f"{namespace}-training")):
        result = cluster.kubectl("get", kind, name, *(["-n", where] if where else []), "-o", "json", check=False)
        found[f"{kind}/{name}"] = json.loads(result.stdout)["metadata"] if result.returncode == 0 else None
    return found


def test_re_applying_the_overlay_after_a_rollout_keeps_what_the_controller_owns(cluster, tmp_path):
    namespace = f"reapply-{uuid.uuid4().hex[:8]}"
    overlay = wrapped(tmp_path / "overlay", OVERLAY, namespace)
    cluster.kubectl("apply", "--server-side", "-k", overlay)
    cluster.kubectl("create", "-k", wrapped(tmp_path / "bootstrap", BOOTSTRAP, namespace))
    cluster.kubectl("apply", "-k", wrapped(tmp_path / "monitor", MONITOR, namespace))
    training = wrapped(tmp_path / "training", TRAINING, f"{namespace}-training")
    cluster.kubectl("apply", "-k", training)
    settings = RolloutKubernetesConfig(namespace=namespace, kubeconfig=str(cluster.kubeconfig))
    backend = KubernetesBackend(settings, "taxi", {"stable": [Endpoint("", "")], "canary": [Endpoint("", "")]}, 5)
    core = backend.core
    # Version 2 promoted, version 3 on the canary at 10 %: what the controller writes in a rollout.
    with backend.store.exclusive():
        backend.set_track("taxi", "canary", [2], {"canary": 2})
        backend.set_canary_weight(50)
        backend.set_track("taxi", "stable", [2], {"stable": 2})
        backend.set_canary_weight(0)
        backend.set_track("taxi", "canary", [3], {"canary": 3})
        backend.set_canary_weight(10)
        document, token = backend.store.load()
        backend.store.save({**document, "current": {"id": "taxi-3", "version": 3, "weight": 10},
                            "history": [{"id": "taxi-2", "version": 2, "outcome": "promoted"}]}, token)
    for track, replicas in (("stable", 3), ("canary", 2)):  # as the HPAs scale them
        cluster.kubectl("scale", "-n", namespace, f"deployment/tfserving-{track}", f"--replicas={replicas}")
    before = owned(backend, core, namespace)
    assert before["tracks"] == {"stable": ([2], {"stable": 2}), "canary": ([3], {"canary": 3})}
    assert before["weights"]["httproutes"] == [[("tfserving-stable", 90), ("tfserving-canary", 10)]]
    assert before["replicas"] == {"stable": 3, "canary": 2}
    assert json.loads(before["config_maps"]["tfserving-rollout"][0]["taxi.json"])["current"]["version"] == 3
    beside = neighbours(cluster, namespace)
    assert all(beside.values()), beside
    for reapply, command in (("client-side", ["apply", "-k", overlay]),
                             ("server-side", ["apply", "--server-side", "-k", overlay]),
                             ("prune", ["apply", "-k", overlay, "--prune", "-l", prune_selector("serving")]),
                             # The training kustomization pruned by its own label leaves mlops-serving alone.
                             ("training's prune", ["apply", "-k", training, "--prune", "-l",
                                                   prune_selector("training")])):
        # Twice: the first client-side apply records last-applied-configuration, the second acts on it (and prunes).
        said = ""
        for _ in range(2):
            result = cluster.kubectl(*command, check=False)
            assert result.returncode == 0, f"{reapply}: {result.stderr}"
            said += result.stdout
        assert "pruned" not in said, f"{reapply}:\n{said}"
        assert owned(backend, core, namespace) == before, f"{reapply}:\n{said}"
        after = neighbours(cluster, namespace)
        assert all(m and "deletionTimestamp" not in m for m in after.values()), f"{reapply}: {after}"
