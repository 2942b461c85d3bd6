"""Clusters for the cluster backends, without a cluster: the fake API server (tests/rollout/fake_apiserver.py) seeded
with the objects of k8s/serving or k8s/kubedl, local model servers standing for the pods (answering as TF Serving
would, tests/rollout/fake_pods.py), and what the cluster's own controllers would do when an object changes: the
kubelet swapping a mounted models.config, KubeDL making pods for a predictor's ModelVersion. Also a harness that
runs `mlops rollout start` as a process and SIGKILLs it right after each of its writes lands."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml
from google.protobuf import text_format

from serving.model_repository import ModelRepository, read_model_server_config
from serving.rollout import local_stack
from serving.server import ModelServer
from tests.rollout.conftest import GOLDEN_CSV, MODEL, REPO_ROOT
from tests.rollout.fake_apiserver import FakeApiServer
from tests.rollout.fake_pods import prometheus_text, refused_label, tf_serving_get

NAMESPACE = "mlops-test"
CONFIG_MAPS = {"stable": "tfserving-stable-config", "canary": "tfserving-canary-config"}
# The phases an uninterrupted promotion with rollout.steps=[100] records.
ONE_STEP_PROMOTION = [
    ("start", "load"), ("load", "label"), ("label", "verify"), ("verify", "verify"), ("verify", "promote_load"),
    ("promote_load", "promote_label"), ("promote_label", "promote_route"), ("promote_route", "retain"),
    ("retain", "done")]


def _track_config(path: Path) -> tuple[list[int], dict[str, int]]:
    config = read_model_server_config(path).model_config_list.config[0]
    return sorted(config.model_version_policy.specific.versions), dict(config.version_labels)


SCRAPE_S = 0.25


class PodExporter:
    """A pod's TF Serving metrics page on a loopback port, for a real Prometheus to scrape (the fake pods are API
    objects, which no Prometheus can reach): each scrape finds 100 more predictions and 2 status GETs counted
    (tests/rollout/fake_pods.py), `error_share` of the predictions failed."""

    def __init__(self, error_share: float) -> None:
        self.error_share = error_share
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path != "/monitoring/prometheus/metrics":
                    self.send_error(404)
                    return
                exporter.scrapes += 1
                body = prometheus_text(MODEL, exporter.scrapes, exporter.error_share).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class BaseCluster:
    def __init__(self, root: Path, tiny_versions: dict[int, Path]) -> None:
        self.root = root
        self.base = root / "serving"
        repository = ModelRepository(self.base)
        for version in (1, 2, 3):
            repository.add_version(MODEL, tiny_versions[version], version=version)
        (root / "golden.csv").write_text(GOLDEN_CSV)
        self.fake = FakeApiServer()
        self.servers: dict[str, ModelServer] = {}
        # Every write through the API: (kind, name, what it changed to), in order.
        self.writes: list[tuple[str, str, object]] = []
        self.fake.watchers.append(self._record)

    def _record(self, key, obj) -> None:
        self.writes.append((key[1], key[3], self.summary(key[1], obj)))

    def summary(self, kind: str, obj: dict) -> object:
        return hashlib.sha256(json.dumps(obj.get("data", obj.get("spec")), sort_keys=True).encode()).hexdigest()

    def add_pod(self, name: str, labels: dict[str, str], proxy) -> None:
        self.fake.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE,
                                                                        "labels": labels},
                       "spec": {"containers": [{"name": "tfserving", "image": "tensorflow/serving:2.16.1"}]},
                       # What the kubelet reports once the readiness probe passes
                       # (kubernetes v1.30, pkg/kubelet/status/status_manager.go).
                       "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
        self.fake.proxies[name] = proxy

    def __enter__(self):
        self.fake.__enter__()
        for server in self.servers.values():
            server.start()
        return self

    def __exit__(self, *exc) -> None:
        for server in self.servers.values():
            server.stop()
        self.fake.__exit__(*exc)

    def common_overrides(self) -> list[str]:
        return [f"output_root={self.root}", f"model_name={MODEL}", f"rollout.golden_data={self.root / 'golden.csv'}",
                "rollout.steps=[50,100]", "rollout.window_requests_per_second=40",
                "rollout.keep_previous_seconds=0", "rollout.load_timeout_seconds=30", "rollout.poll_seconds=0.05"]

    def writes_to(self, kind: str, name: str) -> list[object]:
        return [summary for k, n, summary in self.writes if (k, n) == (kind, name)]


class Gateway(threading.Thread):
    """What the Gateway API routes do with user traffic: REST predictions (~40 a second) sent to the stable or the
    canary server as the HTTPRoute's weights say at that moment (smooth weighted round robin, as Envoy's). With
    `canary_error_share`, that share of the canary's requests is malformed (400 INVALID_ARGUMENT): a canary failing
    part of its traffic."""

    def __init__(self, cluster: ServingCluster, canary_error_share: float) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.canary_error_share = canary_error_share
        self.stop_event = threading.Event()
        self.sent = {"stable": 0, "canary": 0}
        self.failed: list[str] = []

    def run(self) -> None:
        import urllib.error
        import urllib.request

        credit = {"stable": 0.0, "canary": 0.0}
        canary_sent = 0
        last: dict[str, int] = {}
        while not self.stop_event.is_set():
            weights = self.cluster.weights()["HTTPRoute"]
            share = {"stable": weights["tfserving-stable"], "canary": weights["tfserving-canary"]}
            if share != last:  # new weights start a new round: no credit carried over from the old ones
                credit, last = {"stable": 0.0, "canary": 0.0}, share
            for track in credit:
                credit[track] += share[track]
            track = max(credit, key=credit.get)
            credit[track] -= sum(share.values())
            row = {"fare": 2.5, "trip_start_hour": 7, "payment_type": "Cash"}
            if track == "canary":
                canary_sent += 1
                if self.canary_error_share and canary_sent % round(1 / self.canary_error_share) == 0:
                    row = {"fare": 2.5}  # a missing input: the server answers 400
            request = urllib.request.Request(f"{self.cluster.servers[track].rest_url}/v1/models/{MODEL}:predict",
                                             json.dumps({"instances": [row]}).encode(), method="POST")
            try:
                with urllib.request.urlopen(request, timeout=5):
                    pass
            except urllib.error.HTTPError as e:
                if e.code != 400 or track != "canary":
                    self.failed.append(f"{track}: {e.code}")
            except OSError as e:
                self.failed.append(f"{track}: {e}")
            self.sent[track] += 1
            self.stop_event.wait(0.025)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)


class ServingCluster(BaseCluster):
    """k8s/serving: a track ConfigMap per track, the routes, two stable pods and a canary pod. One local server per
    track stands for its pods; the "kubelet" swaps a track's models.config file when its ConfigMap changes, unless
    TF Serving would refuse that config, which is then recorded in `refused` and not applied. A real Prometheus
    scrapes the servers' metrics pages (the pods are API objects no Prometheus can reach, so its targets are the
    servers standing for them, one per track), while a `Gateway` sends user traffic by the routes' weights."""

    def __init__(self, root: Path, tiny_versions: dict[int, Path], error_share: float = 0.0) -> None:
        super().__init__(root, tiny_versions)
        self.error_share = error_share
        self.refused: list[str] = []
        self.prometheus = None
        self.prometheus_url = ""
        self.gateway: Gateway | None = None
        self.proxied: list[str] = []
        for track in ("stable", "canary"):
            repo = ModelRepository(self.base, root / f"{track}.config", served_base_dir=str(self.base))
            config = repo.serve(MODEL, [1], {track: 1})
            self.fake.add({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": CONFIG_MAPS[track], "namespace": NAMESPACE},
                           "data": {"models.config": text_format.MessageToString(config)}})
            self.servers[track] = ModelServer(config_path=repo.config_path, rest_port=0, grpc_port=0,
                                              poll_seconds=0.05)
        for route in yaml.safe_load_all((REPO_ROOT / "k8s/serving/base/routes.yaml").read_text()):
            route["metadata"]["namespace"] = NAMESPACE
            self.fake.add(route)
        for pod, track in {"stable-a": "stable", "stable-b": "stable", "canary-a": "canary"}.items():
            self.add_pod(pod, {"app.kubernetes.io/name": "tfserving", "app.kubernetes.io/track": track},
                         lambda path, track=track: self.proxy(track, path))
        self.fake.watchers.insert(0, self.kubelet)

    def summary(self, kind: str, obj: dict) -> object:
        if kind == "ConfigMap" and obj["metadata"]["name"] in CONFIG_MAPS.values():
            path = self.root / "summary.config"
            path.write_text(obj["data"]["models.config"])
            return _track_config(path)
        if kind in ("HTTPRoute", "GRPCRoute"):
            return {ref["name"]: ref["weight"] for ref in obj["spec"]["rules"][0]["backendRefs"]}
        return super().summary(kind, obj)

    def kubelet(self, key, obj) -> None:
        for track, name in CONFIG_MAPS.items():
            if key[1] == "ConfigMap" and key[3] == name:
                target = self.root / f"{track}.config"
                fd, tmp = tempfile.mkstemp(dir=self.root)
                with os.fdopen(fd, "w") as f:
                    f.write(obj["data"]["models.config"])
                refusal = refused_label(self.servers[track].rest_url, MODEL, _track_config(target)[1],
                                        _track_config(Path(tmp))[1])
                if refusal:
                    self.refused.append(f"{track}: {refusal}")
                    os.unlink(tmp)
                else:
                    os.replace(tmp, target)  # atomically, as the kubelet swaps a mounted ConfigMap

    def __enter__(self):
        super().__enter__()
        try:
            local_stack.binaries()
        except local_stack.StackError as e:
            self.__exit__(None, None, None)
            raise AssertionError(str(e)) from None
        targets = {track: [server.rest_url.split("://", 1)[1]] for track, server in self.servers.items()}
        self.prometheus, self.prometheus_url = local_stack.run_prometheus(self.root / "prometheus", targets,
                                                                          SCRAPE_S)
        self.gateway = Gateway(self, self.error_share)
        self.gateway.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.prometheus is not None:
            self.prometheus.terminate()
            self.prometheus.wait(timeout=20)
        super().__exit__(*exc)

    def proxy(self, track: str, path: str) -> tuple[int, str]:
        self.proxied.append(path)
        return tf_serving_get(self.servers[track].rest_url, path)

    def overrides(self) -> list[str]:
        s, c = self.servers["stable"], self.servers["canary"]
        return [
            *self.common_overrides(), "rollout.backend=kubernetes", f"rollout.kubernetes.namespace={NAMESPACE}",
            f"rollout.kubernetes.kubeconfig={self.fake.kubeconfig(self.root / 'kubeconfig')}",
            f"rollout.kubernetes.served_base_dir={self.base}", "rollout.window_seconds=1",
            f"rollout.prometheus.url={self.prometheus_url}", f"rollout.prometheus.scrape_interval_seconds={SCRAPE_S}",
            "rollout.max_p99_ms=2000", "rollout.max_p99_ratio=50",  # real latencies on a shared machine
            f"rollout.kubernetes.stable_rest=['{s.rest_url}']", f"rollout.kubernetes.stable_grpc=['{s.grpc_target}']",
            f"rollout.kubernetes.canary_rest=['{c.rest_url}']", f"rollout.kubernetes.canary_grpc=['{c.grpc_target}']",
        ]

    def models_config(self, track: str) -> tuple[list[int], dict[str, int]]:
        return _track_config(self.root / f"{track}.config")

    def weights(self) -> dict[str, dict[str, int]]:
        return {kind: {ref["name"]: ref["weight"] for ref in self.fake.find(kind, NAMESPACE, name)["spec"]["rules"][0]
                       ["backendRefs"]} for kind, name in (("HTTPRoute", "tfserving"), ("GRPCRoute", "tfserving-grpc"))}

    def state(self) -> dict:
        return json.loads(self.fake.find("ConfigMap", NAMESPACE, "tfserving-rollout")["data"][f"{MODEL}.json"])


class KubeDLCluster(BaseCluster):
    """k8s/kubedl: the Inference (predictors stable and canary on ModelVersion tiny-v1) and ModelVersions tiny-v1..3.
    Like KubeDL, pointing a predictor at a ModelVersion makes a Deployment for it (here a pod labelled with inference,
    predictor and model version) and leaves the previous one running. One local server per predictor stands for the
    Service of its current ModelVersion; a pod of a ModelVersion the predictor no longer names still answers that
    version AVAILABLE, and every request to such a pod is recorded in `stale_queries` (the controller must not count
    them). No pod exports metrics (k8s/kubedl gives the server no monitoring config)."""

    def __init__(self, root: Path, tiny_versions: dict[int, Path]) -> None:
        super().__init__(root, tiny_versions)
        self.stale_queries: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        [inference] = yaml.safe_load_all((REPO_ROOT / "k8s/kubedl/inference.yaml").read_text())
        inference["metadata"]["namespace"] = NAMESPACE
        for predictor in inference["spec"]["predictors"]:
            predictor["modelVersion"] = "tiny-v1"
        self.fake.add(inference)
        for version in (1, 2, 3):
            self.fake.add({"apiVersion": "model.kubedl.io/v1alpha1", "kind": "ModelVersion",
                           "metadata": {"name": f"tiny-v{version}", "namespace": NAMESPACE},
                           "spec": {"modelName": MODEL}, "status": {"imageBuildPhase": "ImageBuildSucceeded"}})
        self.current: dict[str, str] = {}
        for predictor in ("stable", "canary"):
            path = root / f"{predictor}.config"
            ModelRepository(self.base, path).serve(MODEL, [1], {})
            self.servers[predictor] = ModelServer(config_path=path, rest_port=0, grpc_port=0, poll_seconds=0.05)
            self._deploy(predictor, "tiny-v1")
        self.fake.watchers.insert(0, self.kubedl)

    def summary(self, kind: str, obj: dict) -> object:
        if kind == "Inference":
            return {p["name"]: (p["modelVersion"], p["trafficWeight"]) for p in obj["spec"]["predictors"]}
        return super().summary(kind, obj)

    def _deploy(self, predictor: str, model_version: str) -> None:
        with self.lock:
            if self.current.get(predictor) == model_version:
                return
            self.current[predictor] = model_version
            version = int(model_version.removeprefix("tiny-v"))
            ModelRepository(self.base, self.root / f"{predictor}.config").serve(MODEL, [version], {})
            pod = f"taxi-{predictor}-{model_version}-0"
            if self.fake.find("Pod", NAMESPACE, pod) is None:
                self.add_pod(pod, {"kubedl.io/inference-name": "taxi", "kubedl.io/predictor-name": predictor,
                                   "kubedl.io/model-version": model_version},
                             lambda path, p=predictor, mv=model_version, v=version: self.proxy(p, mv, v, path))

    def kubedl(self, key, obj) -> None:
        if key[1] == "Inference":
            for predictor in obj["spec"]["predictors"]:
                self._deploy(predictor["name"], predictor["modelVersion"])

    def proxy(self, predictor: str, model_version: str, version: int, path: str) -> tuple[int, str]:
        if self.current[predictor] != model_version:
            self.stale_queries.append((f"{predictor}/{model_version}", path))
            return 200, json.dumps({"model_version_status": [
                {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]})
        if path.startswith("monitoring/"):
            return 404, "Not Found"
        if path.rstrip("/") == f"v1/models/{MODEL}":
            path = f"v1/models/{MODEL}/versions/{version}"  # this pod's only version
        return tf_serving_get(self.servers[predictor].rest_url, path)

    def overrides(self) -> list[str]:
        s, c = self.servers["stable"], self.servers["canary"]
        return [
            *self.common_overrides(), "rollout.backend=kubedl", f"rollout.kubedl.namespace={NAMESPACE}",
            f"rollout.kubedl.kubeconfig={self.fake.kubeconfig(self.root / 'kubeconfig')}",
            "rollout.kubedl.model_version_name=tiny-v{version}", "rollout.window_seconds=0.2",
            "rollout.max_p99_ms=2000",  # measured on the verifier's own requests, on a busy shared machine
            f"rollout.kubedl.stable_rest=['{s.rest_url}']", f"rollout.kubedl.stable_grpc=['{s.grpc_target}']",
            f"rollout.kubedl.canary_rest=['{c.rest_url}']", f"rollout.kubedl.canary_grpc=['{c.grpc_target}']",
        ]

    def predictors(self) -> dict[str, tuple[str, int]]:
        inference = self.fake.find("Inference", NAMESPACE, "taxi")
        return {p["name"]: (p["modelVersion"], p["trafficWeight"]) for p in inference["spec"]["predictors"]}

    def state(self) -> dict:
        return json.loads(self.fake.find("ConfigMap", NAMESPACE, "taxi-rollout")["data"][f"{MODEL}.json"])


def rollout_killed_after_every_write(cluster: BaseCluster, version: int, *overrides: str,
                                     max_runs: int = 40) -> tuple[list, str]:
    """Runs `mlops rollout start --version V` as a process against the cluster, SIGKILLs it the moment each of its
    writes has landed in the API server (before it sees the answer), and starts it again, until a run finishes.
    Returns the writes it was killed after, and the last run's output."""
    command = [sys.executable, "-m", "pipeline.cli", "rollout", "start", "--version", str(version)]
    # A killed controller's Lease stays held until it expires: the next run waits that second out.
    lease = ["rollout.lease_duration_seconds=1", "rollout.lease_wait_seconds=10"]
    for override in [*cluster.overrides(), *lease, *overrides]:
        command += ["--set", override]
    running: dict[str, subprocess.Popen] = {}
    kills: list[tuple[str, str, object]] = []
    seen: set[str] = set()

    def kill_on_new_write(key, obj) -> None:
        mark = json.dumps([key[1], key[3], copy.deepcopy(obj.get("data", obj.get("spec")))], sort_keys=True)
        process = running.get("controller")
        if key[1] == "Lease" or mark in seen or process is None or process.poll() is not None:
            return
        seen.add(mark)
        process.send_signal(signal.SIGKILL)  # it runs no further instruction: the answer never reaches it
        kills.append((key[1], key[3], cluster.summary(key[1], obj)))

    cluster.fake.watchers.append(kill_on_new_write)
    log = cluster.root / "controller.log"
    try:
        for _ in range(max_runs):
            with open(log, "w") as out:
                running["controller"] = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                                                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
                code = running["controller"].wait()
            if code != -signal.SIGKILL:
                assert code == 0, log.read_text()
                return kills, log.read_text()
        raise AssertionError(f"the rollout did not finish in {max_runs} runs")
    finally:
        cluster.fake.watchers.remove(kill_on_new_write)
