"""The scheduled `mlops monitor` (k8s/serving/monitor): its command is one the CLI takes, its config's folders are
the volumes it mounts (the repository and the logs read-only), it reads the logs where the serving pods' log-proxy
sidecars write them, the exit codes that answer fail the Job at once, the pod is as locked down as the servers, and it
opens no connection but to the Pushgateway, object stores and DNS."""
from __future__ import annotations

import functools
import posixpath

from monitoring.monitor import EXIT_CROSSED
from pipeline.cli import build_parser
from settings.config import load_config
from tests.k8s.networkpolicy import Pod, admits
from tests.k8s.render import render


@functools.cache
def objects() -> list[dict]:
    return render("k8s/serving/monitor")


def cronjob() -> dict:
    [job] = [o for o in objects() if o["kind"] == "CronJob"]
    return job


def pod() -> dict:
    return cronjob()["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def test_the_command_is_mlops_monitor_and_its_folders_are_the_mounted_volumes():
    [container] = pod()["containers"]
    assert "command" not in container, "the image's entrypoint runs mlops; the image has no `mlops` on its PATH"
    args = build_parser().parse_args(container["args"])
    assert args.command == "monitor" and args.since == "1h" and args.pushgateway.startswith("http://")
    # --retrain would run the local pipeline in the pod, against a read-only model repository
    # (docs/tutorials/monitoring.md).
    assert args.retrain is False
    config = load_config(args.config, args.overrides)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    claims = {v["name"]: v.get("persistentVolumeClaim", {}) for v in pod()["volumes"]}
    assert mounts["model-repository"]["mountPath"] == config.serving_base_dir
    assert posixpath.commonpath([mounts["request-logs"]["mountPath"], config.request_log_dir]) == mounts[
        "request-logs"]["mountPath"]
    assert mounts["reports"]["mountPath"] == config.monitoring_dir
    for name in ("model-repository", "request-logs"):
        assert mounts[name]["readOnly"] is True and claims[name]["readOnly"] is True, name
    assert claims["model-repository"]["claimName"] == "tfserving-model-repository"
    assert claims["request-logs"]["claimName"] == "request-logs", "the claim docs/tutorials/monitoring.md names"
    [reports] = [o for o in objects() if o["kind"] == "PersistentVolumeClaim"]
    assert claims["reports"]["claimName"] == reports["metadata"]["name"]
    assert posixpath.commonpath([mounts["tmp"]["mountPath"], "/tmp"]) == "/tmp"


def test_it_reads_the_logs_where_the_serving_pods_sidecars_write_them():
    [container] = pod()["containers"]
    args = build_parser().parse_args(container["args"])
    monitor = load_config(args.config, args.overrides)
    [stable] = [o for o in render("k8s/serving/base") if o["kind"] == "Deployment"
                and o["metadata"]["name"] == "tfserving-stable"]
    [proxy] = [c for c in stable["spec"]["template"]["spec"]["containers"] if c["name"] == "log-proxy"]
    proxy_args = build_parser().parse_args(proxy["args"])
    sidecar = load_config(proxy_args.config, proxy_args.overrides)
    assert monitor.request_log_dir == sidecar.request_log_dir
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["request-logs"]
    assert mount == {m["name"]: m["mountPath"] for m in proxy["volumeMounts"]}["request-logs"]


def test_a_crossed_threshold_or_a_problem_to_fix_fails_the_job_without_retries():
    job = cronjob()
    assert job["spec"]["concurrencyPolicy"] == "Forbid" and job["spec"]["timeZone"] == "Etc/UTC"
    spec = job["spec"]["jobTemplate"]["spec"]
    [rule] = spec["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {"containerName": "monitor", "operator": "In", "values": [2, EXIT_CROSSED]}
    assert pod()["restartPolicy"] == "Never", "a pod failure policy needs it"
    assert spec["backoffLimit"] >= 1, "a failed push (exit code 1) is tried again"


def test_the_pod_is_locked_down_and_calls_no_api():
    spec = pod()
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] >= 10000
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    [container] = spec["containers"]
    context = container["securityContext"]
    assert context["runAsUser"] >= 10000 and context["readOnlyRootFilesystem"]
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["limits"] and container["resources"]["requests"]
    assert {"name": "HOME", "value": "/tmp"} in container["env"], "TensorFlow writes below HOME"


def test_it_opens_only_the_pushgateway_object_stores_and_dns_and_takes_nothing():
    policies = [o for o in objects() if o["kind"] == "NetworkPolicy"]
    monitor = Pod("mlops-serving", pod_labels())
    pushgateway = Pod("monitoring", {"app.kubernetes.io/name": "prometheus-pushgateway"})
    assert admits(policies, pushgateway, monitor, 9091)
    assert not admits(policies, Pod("default", {"app.kubernetes.io/name": "prometheus-pushgateway"}), monitor, 9091)
    assert not admits(policies, pushgateway, monitor, 9090)
    server = Pod("mlops-serving", {"app.kubernetes.io/name": "tfserving", "app.kubernetes.io/track": "stable"})
    assert not any(admits(policies, server, monitor, port) for port in (8500, 8501))
    anywhere = Pod("somewhere", {"app": "store"})
    assert admits(policies, anywhere, monitor, 443) and admits(policies, anywhere, monitor, 53, "UDP")
    assert not admits(policies, anywhere, monitor, 80)
    assert not any(admits(policies, monitor, source, port) for source in (server, pushgateway, anywhere)
                   for port in (80, 443, 8080))


def pod_labels() -> dict[str, str]:
    return cronjob()["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
