"""What a cluster does with the rendered overlays, where the manifests alone decide it: the dev overlay binds on
kind's provisioner, runs an image loaded onto the node and lets `kubectl drain` proceed; each track's capacity can
follow its share of the traffic; the thread pools follow the container's CPU limit; and re-applying what users apply
after a rollout leaves what the rollout controller owns unchanged."""
from __future__ import annotations

import copy
import math

import pytest

from tests.k8s.render import render

OVERLAYS = ["k8s/serving/overlays/dev", "k8s/serving/overlays/prod", "k8s/serving/overlays/object-storage"]




def of_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def cpu_cores(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if str(quantity).endswith("m") else float(quantity)


def test_the_dev_overlay_binds_on_kinds_local_path_provisioner():
    # kind's default StorageClass `standard` is rancher/local-path-provisioner, which refuses every access mode but
    # ReadWriteOnce and ReadWriteOncePod (provisioner.go Provision, v0.0.37): a ReadOnlyMany claim stays Pending.
    objects = render("k8s/serving/overlays/dev") + render("k8s/serving/overlays/dev/loader")
    [claim] = of_kind(objects, "PersistentVolumeClaim").values()
    assert set(claim["spec"]["accessModes"]) <= {"ReadWriteOnce", "ReadWriteOncePod"}
    assert claim["spec"].get("storageClassName") in (None, "standard")
    # The loader mounts it read-write to copy the repository in; the servers read-only.
    [loader] = of_kind(objects, "Pod").values()
    assert loader["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert not loader["spec"]["containers"][0]["volumeMounts"][0].get("readOnly")
    for deployment in of_kind(objects, "Deployment").values():
        [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
        assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"], "readOnly": True}


def test_the_dev_overlay_runs_the_images_kind_loaded():
    for deployment in of_kind(render("k8s/serving/overlays/dev"), "Deployment").values():
        found = deployment["spec"]["template"]["spec"]["containers"]
        assert [c["name"] for c in found] == ["tfserving", "log-proxy"]
        # Always would pull them again from a registry the kind node may not reach.
        for container in found:
            assert container["imagePullPolicy"] == "IfNotPresent", (deployment["metadata"]["name"], container["name"])


def expected_pods(objects: list[dict], selector: dict[str, str]) -> int:
    """The fewest pods the PDB's selector covers: each matching Deployment's HPA minimum (or its replicas)."""
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h for h in of_kind(objects, "HorizontalPodAutoscaler").values()}
    total = 0
    for name, deployment in of_kind(objects, "Deployment").items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        if all(labels.get(k) == v for k, v in selector.items()):
            total += hpas[name]["spec"].get("minReplicas", 1) if name in hpas else deployment["spec"].get("replicas", 1)
    return total


def disruptions_allowed(pdb: dict, healthy: int) -> int:
    """kubernetes v1.31.0 pkg/controller/disruption/disruption.go getExpectedPodCount and updatePdbStatus:
    desiredHealthy is minAvailable (a percentage of the expected pods, rounded up) or expected - maxUnavailable
    (rounded up); disruptionsAllowed = currentHealthy - desiredHealthy, at least 0."""
    spec = pdb["spec"]

    def scaled(value) -> int:
        return math.ceil(int(value[:-1]) * healthy / 100) if isinstance(value, str) else int(value)

    desired = scaled(spec["minAvailable"]) if "minAvailable" in spec else healthy - scaled(spec["maxUnavailable"])
    return max(0, healthy - desired)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_drain_can_evict_a_server_at_the_fewest_replicas(overlay):
    objects = render(overlay)
    pdbs = of_kind(objects, "PodDisruptionBudget")
    assert pdbs
    for pdb in pdbs.values():
        healthy = expected_pods(objects, pdb["spec"]["selector"]["matchLabels"])
        assert healthy >= 1
        assert disruptions_allowed(pdb, healthy) >= 1, f"{overlay}: {pdb['metadata']['name']} blocks every drain"
    # The old dev PDB: minAvailable 1 over one replica allowed nothing.
    assert disruptions_allowed({"spec": {"minAvailable": 1}}, 1) == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_canarys_capacity_follows_its_share_of_the_traffic(overlay):
    from settings.config import RolloutConfig

    objects = render(overlay)
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h["spec"]
            for h in of_kind(objects, "HorizontalPodAutoscaler").values()}
    stable, canary = hpas["tfserving-stable"], hpas["tfserving-canary"]
    # The same signal, so a canary at share s scales as stable would for that share of the load ...
    assert canary["metrics"] == stable["metrics"]
    deployments = of_kind(objects, "Deployment")
    limits = {n: d["spec"]["template"]["spec"]["containers"][0]["resources"] for n, d in deployments.items()}
    assert limits["tfserving-canary"] == limits["tfserving-stable"]
    # ... and room for every step's share of what stable may carry, 100% included.
    for step in RolloutConfig().steps:
        assert canary["maxReplicas"] >= math.ceil(stable["maxReplicas"] * step / 100), (overlay, step)
    assert canary["minReplicas"] >= 1
    # A step multiplies the canary's load at once: it scales up without a stabilization window.
    assert canary["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_thread_pools_follow_the_containers_cpu_limit(overlay):
    for name, deployment in of_kind(render(overlay), "Deployment").items():
        [server] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "tfserving"]
        env = {e["name"]: e for e in server["env"]}
        assert env["CPU_LIMIT"]["valueFrom"]["resourceFieldRef"] == {
            "containerName": "tfserving", "resource": "limits.cpu", "divisor": "1"}
        args = server["args"]
        assert "--tensorflow_intra_op_parallelism=$(CPU_LIMIT)" in args
        assert "--tensorflow_inter_op_parallelism=$(CPU_LIMIT)" in args
        assert "--rest_api_num_threads=$(REST_API_NUM_THREADS)" in args
        # TF Serving's default is 4 per schedulable CPU; here per core of the limit (rounded up, as the downward API).
        cores = math.ceil(cpu_cores(server["resources"]["limits"]["cpu"]))
        assert int(env["REST_API_NUM_THREADS"]["value"]) == 4 * cores, (overlay, name)


# --- Re-applying after a rollout ---------------------------------------------------------------------------------

def client_side_apply(live: dict | None, applied: dict) -> dict:
    """What `kubectl apply` leaves of a live object when the same manifest is applied again: a three-way merge of
    the last applied configuration, the new one and the live object (k8s.io/kubectl pkg/cmd/apply/patcher.go,
    v0.31.0, strategicpatch.CreateThreeWayMergePatch). With the last applied equal to the new, every field the
    manifest names is set to the manifest's value and every other live field (what controllers wrote) is kept.
    Lists are taken whole from the manifest, which is at least as strict as a strategic merge by key."""
    if live is None:
        return copy.deepcopy(applied)

    def merge(have, want):
        if isinstance(have, dict) and isinstance(want, dict):
            out = copy.deepcopy(have)
            for key, value in want.items():
                out[key] = merge(have.get(key), value)
            return out
        return copy.deepcopy(want)

    return merge(live, applied)


def key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_reapplying_the_overlay_after_a_rollout_leaves_the_controllers_state_alone(overlay):
    from serving.repository.base import parse_model_server_config
    from settings.config import RolloutKubernetesConfig

    settings = RolloutKubernetesConfig()
    owned = {("ConfigMap", settings.stable_config_map), ("ConfigMap", settings.canary_config_map),
             ("ConfigMap", settings.state_config_map), ("HTTPRoute", settings.http_route),
             ("GRPCRoute", settings.grpc_route)}
    applied, bootstrap = render(overlay), render("k8s/serving/bootstrap")
    # None of them is in what users apply again; all but the state (the controller creates it) are created once.
    assert not {(o["kind"], o["metadata"]["name"]) for o in applied} & owned
    assert {(o["kind"], o["metadata"]["name"]) for o in bootstrap} == owned - {("ConfigMap", settings.state_config_map)}

    # The cluster: the overlay applied, the bootstrap created, then a rollout of version 2 half-way and the HPAs'
    # scaling, written as the controller and the HPA controller write them.
    cluster = {key(o): copy.deepcopy(o) for o in applied + bootstrap}
    namespace = settings.namespace
    for track in ("stable", "canary"):
        config_map = cluster[("ConfigMap", namespace, getattr(settings, f"{track}_config_map"))]
        text = config_map["data"]["models.config"]
        config_map["data"]["models.config"] = text.replace("versions: 1", "versions: 2").replace("value: 1", "value: 2")
    for kind, name in (("HTTPRoute", settings.http_route), ("GRPCRoute", settings.grpc_route)):
        for ref in cluster[(kind, namespace, name)]["spec"]["rules"][0]["backendRefs"]:
            ref["weight"] = 50
    cluster[("ConfigMap", namespace, settings.state_config_map)] = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": settings.state_config_map,
                                                              "namespace": namespace}, "data": {"taxi.json": "{}"}}
    for name in ("tfserving-stable", "tfserving-canary"):
        cluster[("Deployment", namespace, name)]["spec"]["replicas"] = 5  # the scale subresource, by the HPA
    before = copy.deepcopy(cluster)

    # kubectl apply -k <overlay> again (a GitOps sync does the same); kubectl create -k bootstrap refuses objects
    # that exist (AlreadyExists) and changes nothing.
    for obj in applied:
        cluster[key(obj)] = client_side_apply(cluster.get(key(obj)), obj)

    for kind, name in owned:
        assert cluster[(kind, namespace, name)] == before[(kind, namespace, name)], (overlay, kind, name)
    for name in ("tfserving-stable", "tfserving-canary"):
        assert cluster[("Deployment", namespace, name)]["spec"]["replicas"] == 5, (overlay, name)
        # The pods a restart makes read the ConfigMap the controller wrote: version 2.
        volumes = cluster[("Deployment", namespace, name)]["spec"]["template"]["spec"]["volumes"]
        [config_volume] = [v for v in volumes if v["name"] == "models-config"]
        config = parse_model_server_config(
            cluster[("ConfigMap", namespace, config_volume["configMap"]["name"])]["data"]["models.config"], name)
        assert list(config.model_config_list.config[0].model_version_policy.specific.versions) == [2]
    # The old base had them: the same re-apply then reset the rollout (checked on the merge itself).
    old = client_side_apply(before[("Deployment", namespace, "tfserving-stable")], {"spec": {"replicas": 2}})
    assert old["spec"]["replicas"] == 2
