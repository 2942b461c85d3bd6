"""The request logs kept (k8s/serving/overlays/request-logs): every server pod's log proxy writes to the ReadWriteMany
claim request-logs, defined there once and only referenced by the monitor CronJob and the skew-checked rollout Job
(overlays/request-logs/rollout-job), which mount it read-only where they read serving.request_log.directory; the
rollout Job sets what `mlops rollout` needs to start a skew check (rollout/skew.py SkewCheck.ready: logging
enabled, the servers' log folder). Nothing else changes: the pods' security settings, the NetworkPolicies and the
rest of the rollout Job are those of the overlay and the Job it starts from."""
from __future__ import annotations

import copy
import functools
import posixpath

from pipeline.cli import build_parser
from rollout.factory import skew_check
from settings.config import load_config
from tests.k8s.render import render
from tests.k8s.test_log_proxy_sidecar import containers, of_kind, proxy_arguments, quantity_bytes

OVERLAY = "k8s/serving/overlays/request-logs"
ROLLOUT_JOB = "k8s/serving/overlays/request-logs/rollout-job"
# What the overlay starts from (its resources), and the Job its rollout-job overlay patches.
UNDERLYING = "k8s/serving/overlays/prod"
PLAIN_ROLLOUT_JOB = "k8s/serving/rollout-job"
CLAIM = "request-logs"


@functools.cache
def rendered(kustomization: str) -> list[dict]:
    return render(kustomization)


def request_log_dir(container: dict) -> str:
    args = build_parser().parse_args(container["args"])
    return load_config(args.config, args.overrides).request_log_dir


def sidecar_log_dir() -> str:
    deployment = of_kind(rendered(OVERLAY), "Deployment")["tfserving-stable"]
    return request_log_dir(containers(deployment)["log-proxy"])


def controller_arguments(container: dict):
    """The controller's args as `mlops` parses them, with $(VAR) expanded from its env as the kubelet does."""
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return build_parser().parse_args([_expand(arg, env) for arg in container["args"]])


def _expand(arg: str, env: dict[str, str]) -> str:
    for name, value in env.items():
        arg = arg.replace(f"$({name})", value)
    return arg


def rollout_pod() -> dict:
    [job] = of_kind(rendered(ROLLOUT_JOB), "Job").values()
    return job["spec"]["template"]["spec"]


def test_every_server_pod_writes_its_logs_to_the_claim():
    deployments = of_kind(rendered(OVERLAY), "Deployment")
    assert set(deployments) == {"tfserving-stable", "tfserving-canary"}
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[CLAIM] == {"name": CLAIM, "persistentVolumeClaim": {"claimName": CLAIM}}, name
        proxy = containers(deployment)["log-proxy"]
        [mount] = [m for m in proxy["volumeMounts"] if m["name"] == CLAIM]
        # The folder the proxy writes is on the claim, and it may write there.
        assert posixpath.commonpath([mount["mountPath"], request_log_dir(proxy)]) == mount["mountPath"], name
        assert not mount.get("readOnly") and proxy_arguments(proxy).overrides
        assert not [m for m in containers(deployment)["tfserving"]["volumeMounts"] if m["name"] == CLAIM], name


def test_only_the_volume_changes_and_the_claim_is_added():
    """The same pods as the overlay it starts from (security contexts, read-only roots, probes, ports), the same
    NetworkPolicies: the request-logs volume's source is the one difference, the claim the one object added."""
    ours, theirs = rendered(OVERLAY), rendered(UNDERLYING)
    underlying = {(o["kind"], o["metadata"]["name"]): o for o in theirs}
    added = [o for o in ours if (o["kind"], o["metadata"]["name"]) not in underlying]
    assert [(o["kind"], o["metadata"]["name"]) for o in added] == [("PersistentVolumeClaim", CLAIM)]
    assert len(ours) == len(theirs) + 1
    for obj in ours:
        if obj in added:
            continue
        expected = copy.deepcopy(underlying[(obj["kind"], obj["metadata"]["name"])])
        if obj["kind"] == "Deployment":
            for volume in expected["spec"]["template"]["spec"]["volumes"]:
                if volume["name"] == CLAIM:
                    volume.pop("emptyDir")
                    volume["persistentVolumeClaim"] = {"claimName": CLAIM}
            key = lambda v: v["name"]  # noqa: E731 - the strategic merge may reorder volumes, by name
            for pod in (obj["spec"]["template"]["spec"], expected["spec"]["template"]["spec"]):
                pod["volumes"] = sorted(pod["volumes"], key=key)
        assert obj == expected, (obj["kind"], obj["metadata"]["name"])


def test_the_claim_is_defined_once_shared_by_every_pod_and_fits_the_logs():
    defined = {kustomization: [o for o in rendered(kustomization) if o["kind"] == "PersistentVolumeClaim"
                               and o["metadata"]["name"] == CLAIM]
               for kustomization in (OVERLAY, ROLLOUT_JOB, "k8s/serving/monitor")}
    # `kubectl create -k` of the rollout Job would fail on a claim that exists; apply of two definitions would fight.
    assert {k: len(v) for k, v in defined.items()} == {OVERLAY: 1, ROLLOUT_JOB: 0, "k8s/serving/monitor": 0}
    [claim] = defined[OVERLAY]
    # Written by pods on many nodes, read by the monitor's and the controller's pods meanwhile.
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    deployments = of_kind(rendered(OVERLAY), "Deployment")
    [monitor] = of_kind(rendered("k8s/serving/monitor"), "CronJob").values()
    [job] = of_kind(rendered(ROLLOUT_JOB), "Job").values()
    for workload in (*deployments.values(), monitor, job):
        assert workload["metadata"]["namespace"] == claim["metadata"]["namespace"]
    # The proxies prune the shared folder to max_files as a whole, never counting the file each pod writes.
    args = proxy_arguments(containers(deployments["tfserving-stable"])["log-proxy"])
    request_log = load_config(args.config, args.overrides).serving.request_log
    pods = sum(h["spec"]["maxReplicas"] for h in of_kind(rendered(OVERLAY), "HorizontalPodAutoscaler").values())
    needed = (request_log.max_files + pods) * request_log.max_file_bytes
    assert needed <= quantity_bytes(claim["spec"]["resources"]["requests"]["storage"])


def test_the_skew_checked_rollout_reads_the_claim_read_only_where_the_sidecars_write():
    pod = rollout_pod()
    [controller] = pod["containers"]
    args = controller_arguments(controller)
    assert (args.command, args.action, args.version) == ("rollout", "start", 2)
    config = load_config(args.config, args.overrides)
    assert config.rollout.skew_check and config.serving.request_log.enabled
    check = skew_check(config)
    # SkewCheck.ready refuses a rollout without logging enabled, or without the model's folder at log_dir.
    assert check is not None and check.logging_enabled and check.log_dir == sidecar_log_dir()
    [mount] = [m for m in controller["volumeMounts"] if m["name"] == CLAIM]
    assert mount["readOnly"] is True
    assert posixpath.commonpath([mount["mountPath"], check.log_dir]) == mount["mountPath"]
    # The same relative folder as the proxies' under their mount: the same files.
    deployment = of_kind(rendered(OVERLAY), "Deployment")["tfserving-stable"]
    [proxy_mount] = [m for m in containers(deployment)["log-proxy"]["volumeMounts"] if m["name"] == CLAIM]
    assert mount["mountPath"] == proxy_mount["mountPath"]
    [volume] = [v for v in pod["volumes"] if v["name"] == CLAIM]
    assert volume["persistentVolumeClaim"] == {"claimName": CLAIM, "readOnly": True}


def test_the_rollout_job_is_otherwise_the_plain_one():
    plain = {(o["kind"], o["metadata"]["name"]): o for o in rendered(PLAIN_ROLLOUT_JOB)}
    ours = {(o["kind"], o["metadata"]["name"]): o for o in rendered(ROLLOUT_JOB)}
    assert set(ours) == set(plain)
    for key_, obj in ours.items():
        expected = copy.deepcopy(plain[key_])
        if key_[0] == "Job":
            pod = expected["spec"]["template"]["spec"]
            [controller] = pod["containers"]
            controller["args"] += ["--set", "rollout.skew_check=true", "--set", "serving.request_log.enabled=true",
                                   "--set", f"serving.request_log.directory={sidecar_log_dir()}"]
            controller["volumeMounts"].append({"name": CLAIM, "mountPath": "/var/log/mlops", "readOnly": True})
            pod["volumes"].append({"name": CLAIM, "persistentVolumeClaim": {"claimName": CLAIM, "readOnly": True}})
        # The NetworkPolicy too: reading a volume opens no connection.
        assert obj == expected, key_
    # Without the overlay no skew check is asked for, so the plain Job starts without request logs.
    [job] = [o for k, o in plain.items() if k[0] == "Job"]
    args = controller_arguments(job["spec"]["template"]["spec"]["containers"][0])
    assert not load_config(args.config, args.overrides).rollout.skew_check
