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
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml
from google.protobuf import text_format

from rollout import local_stack
from serving.repository.base import read_model_server_config
from serving.repository.local import ModelRepository
from serving.server.model_server import ModelServer
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


def accepted(route: dict) -> dict:
    """The route with the status Envoy Gateway writes on one it programs (gateway internal/gatewayapi/status/route.go:
    one entry per parentRef, Accepted and ResolvedRefs True); the real one is computed in test_route_status_real.py."""
    conditions = [{"type": t, "status": "True", "reason": t, "message": ""} for t in ("Accepted", "ResolvedRefs")]
    route["status"] = {"parents": [{"parentRef": ref, "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
                                    "conditions": conditions} for ref in route["spec"]["parentRefs"]]}
    return route


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


def mirrored_percent(route: dict, service: str) -> int:
    """The share of a route's first rule copied to `service` by a RequestMirror filter, read as Gateway API v1.3's
    HTTPRequestMirrorFilter defines it (apis/v1/shared_types.go: `percent`, or `fraction` numerator/denominator
    with denominator 100 by default; neither: every request)."""
    for f in route["spec"]["rules"][0].get("filters", []):
        mirror = f.get("requestMirror", {})
        if f.get("type") == "RequestMirror" and mirror.get("backendRef", {}).get("name") == service:
            if "percent" in mirror:
                return int(mirror["percent"])
            if "fraction" in mirror:
                return round(100 * mirror["fraction"]["numerator"] / mirror["fraction"].get("denominator", 100))
            return 100
    return 0


class Gateway(threading.Thread):
    """What the Gateway API routes do with user traffic: REST predictions (~40 a second) sent to the stable or the
    canary server as the HTTPRoute's weights say at that moment (smooth weighted round robin, as Envoy's). With
    `canary_error_share`, that share of the canary's requests is malformed (400 INVALID_ARGUMENT): a canary failing
    part of its traffic. Each request carries an x-request-id, as Envoy's connection manager gives every request it
    routes (source/common/http/conn_manager_utility.cc, mutateRequestHeaders); a RequestMirror filter on the route
    has that share of them copied, with the same headers, to its Service, and the copy's answer discarded (Envoy's
    router shadowing, source/common/router/router.cc)."""

    def __init__(self, cluster: ServingCluster, canary_error_share: float) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.canary_error_share = canary_error_share
        self.stop_event = threading.Event()
        self.sent = {"stable": 0, "canary": 0}
        self.mirrored = 0
        self.failed: list[str] = []

    def run(self) -> None:
        import urllib.error
        import urllib.request

        credit = {"stable": 0.0, "canary": 0.0}
        canary_sent = 0
        mirror_credit = 0
        last: dict[str, int] = {}
        while not self.stop_event.is_set():
            route = self.cluster.fake.find("HTTPRoute", NAMESPACE, "tfserving")
            mirror = mirrored_percent(route, "tfserving-canary")
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
            body = json.dumps({"instances": [row]}).encode()
            headers = {"x-request-id": str(uuid.uuid4())}
            request = urllib.request.Request(f"{self.cluster.servers[track].rest_url}/v1/models/{MODEL}:predict",
                                             body, headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=5):
                    pass
            except urllib.error.HTTPError as e:
                if e.code != 400 or track != "canary":
                    self.failed.append(f"{track}: {e.code}")
            except OSError as e:
                self.failed.append(f"{track}: {e}")
            self.sent[track] += 1
            mirror_credit += mirror
            if mirror_credit >= 100:
                mirror_credit -= 100
                copy_request = urllib.request.Request(
                    f"{self.cluster.servers['canary'].rest_url}/v1/models/{MODEL}:predict", body, headers,
                    method="POST")
                try:
                    with urllib.request.urlopen(copy_request, timeout=5):
                        pass
                except OSError:
                    pass  # the copy's answer, failed or not, reaches no client
                self.mirrored += 1
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
        for route in yaml.safe_load_all((REPO_ROOT / "k8s/serving/bootstrap/routes.yaml").read_text()):
            route["metadata"]["namespace"] = NAMESPACE
            self.fake.add(accepted(route))
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
            return {**{ref["name"]: ref["weight"] for ref in obj["spec"]["rules"][0]["backendRefs"]},
                    "mirrored": mirrored_percent(obj, "tfserving-canary")}
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
            local_stack.prometheus_binary()
        except local_stack.StackError as e:
            self.__exit__(None, None, None)
            raise AssertionError(str(e)) from None
        targets = {track: [server.rest_url.split("://", 1)[1]] for track, server in self.servers.items()}
        # The namespace label the Prometheus operator's pod discovery gives every target of a PodMonitor.
        self.prometheus, self.prometheus_url = local_stack.run_prometheus(
            self.root / "prometheus", targets, SCRAPE_S, target_labels={"namespace": NAMESPACE})
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
            "rollout.shadow.min_requests=30",  # ~40 copies a 1 s window
            # Catching a canary failing 30% more than stable, not 5%: 24 canary requests a step, not ~300 (the gate's
            # power at the defaults is tests/rollout/test_evidence.py's subject).
            "rollout.min_error_rate_regression=0.3",
            f"rollout.prometheus.url={self.prometheus_url}", f"rollout.prometheus.scrape_interval_seconds={SCRAPE_S}",
            "rollout.max_p99_ms=2000", "rollout.max_p99_ratio=50",  # real latencies on a shared machine
            "rollout.shadow.max_latency_ratio=50",
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
    """k8s/kubedl: Inference tiny-v1 (k8s/kubedl/inference.yaml, renamed), its ModelVersion and those of versions 2
    and 3, and the routes of k8s/kubedl/routes (both backendRefs on taxi-v1's predictor Service). Each version's
    ModelVersion is recorded in the status of TFJob taxi-trainer-v<V> (controllers: pkg/job_controller/job.go
    createModelVersion sets status.modelVersionName); version 2's is named as KubeDL names a trained one,
    mv-<job>-<uid[:5]> (controllers/model/utils.go GetJobModelVersionName), 1 and 3 as registered by hand.

    What KubeDL's controller does, as kubedl-io/kubedl b93a2b4 controllers/serving does it: for each predictor of an
    Inference, a Deployment `<inference>-<predictor>` (utils.go genPredictorName) made only when missing
    (inference_controller.go syncPredictor; predictor.go createNewPredictorDeploy), so a changed predictor changes
    nothing, recorded in `ignored_changes`; its pods labelled kubedl.io/inference-name, kubedl.io/predictor-name and
    kubedl.io/model-version (labels.go insertLabelsForPredictor); MODEL_BASE_PATH the parent of modelPath
    (framework/tfserving.go SetSpec), so the pod's TF Serving, whose command serves $(MODEL_BASE_PATH), answers the
    version that modelPath's last element names. A predictor waits while its ModelVersion's image is not built
    (syncPredictor requeues). Here one pod per Inference answers through the pod proxy from a local server loading
    that version. One local server per track stands for what the track's backendRef (the gateway) reaches: when a
    route's backendRef of a track moves to a version's Service, that server loads the version. No pod exports
    metrics."""

    def __init__(self, root: Path, tiny_versions: dict[int, Path]) -> None:
        super().__init__(root, tiny_versions)
        self.ignored_changes: list[str] = []
        self.lock = threading.Lock()
        [inference] = yaml.safe_load_all((REPO_ROOT / "k8s/kubedl/inference.yaml").read_text())
        inference["metadata"].update(name="taxi-v1", namespace=NAMESPACE)
        inference["spec"]["predictors"][0]["modelVersion"] = "tiny-v1"
        names = {1: "tiny-v1", 2: "mv-taxi-trainer-v2-3f9a1", 3: "tiny-v3"}
        for version, name in names.items():
            self.fake.add({"apiVersion": "model.kubedl.io/v1alpha1", "kind": "ModelVersion",
                           "metadata": {"name": name, "namespace": NAMESPACE},
                           "spec": {"modelName": MODEL, "createdBy": "taxi-trainer-v2" if version == 2 else "hand"},
                           "status": {"imageBuildPhase": "ImageBuildSucceeded"}})
            self.fake.add({"apiVersion": "training.kubedl.io/v1alpha1", "kind": "TFJob",
                           "metadata": {"name": f"taxi-trainer-v{version}", "namespace": NAMESPACE},
                           "spec": {}, "status": {"modelVersionName": name}})
        # What the Inferences' pods serve: one local server per version.
        self.version_servers: dict[int, ModelServer] = {}
        for version in (1, 2, 3):
            path = root / f"v{version}.config"
            ModelRepository(self.base, path).serve(MODEL, [version], {})
            self.version_servers[version] = ModelServer(config_path=path, rest_port=0, grpc_port=0, poll_seconds=0.05)
            self.servers[f"v{version}"] = self.version_servers[version]
        self.current: dict[str, int] = {}
        for track in ("stable", "canary"):
            path = root / f"{track}.config"
            ModelRepository(self.base, path).serve(MODEL, [1], {})
            self.servers[track] = ModelServer(config_path=path, rest_port=0, grpc_port=0, poll_seconds=0.05)
            self.current[track] = 1
        self.deployments: dict[str, dict] = {}
        for route in yaml.safe_load_all((REPO_ROOT / "k8s/kubedl/routes/routes.yaml").read_text()):
            route["metadata"]["namespace"] = NAMESPACE
            for ref in route["spec"]["rules"][0]["backendRefs"]:
                ref["name"] = "taxi-v1-serve"
            self.fake.add(accepted(route))
        self.fake.add(inference)
        self.kubedl(None, self.fake.find("Inference", NAMESPACE, "taxi-v1"))
        self.fake.watchers.insert(0, self.kubedl)
        self.fake.watchers.insert(0, self.gateway)

    def summary(self, kind: str, obj: dict) -> object:
        if kind in ("HTTPRoute", "GRPCRoute"):
            return [(ref["name"], ref["weight"]) for ref in obj["spec"]["rules"][0]["backendRefs"]]
        if kind == "Inference":
            return [(p["name"], p["modelVersion"], p["modelPath"]) for p in obj["spec"]["predictors"]]
        return super().summary(kind, obj)

    def kubedl(self, key, obj) -> None:
        if obj.get("kind") != "Inference":
            return
        for predictor in obj["spec"]["predictors"]:
            name = f"{obj['metadata']['name']}-{predictor['name']}"
            with self.lock:
                if name in self.deployments:
                    if self.deployments[name] != predictor:
                        self.ignored_changes.append(name)
                    continue
                model_version = self.fake.find("ModelVersion", NAMESPACE, predictor["modelVersion"])
                if model_version is None or model_version["status"].get("imageBuildPhase") != "ImageBuildSucceeded":
                    continue
                self.deployments[name] = copy.deepcopy(predictor)
            version = int(predictor["modelPath"].rstrip("/").rsplit("/", 1)[1])
            self.add_pod(f"{name}-0", {"kubedl.io/inference-name": obj["metadata"]["name"],
                                       "kubedl.io/predictor-name": predictor["name"],
                                       "kubedl.io/model-version": predictor["modelVersion"]},
                         lambda path, v=version: tf_serving_get(self.version_servers[v].rest_url, path))

    def gateway(self, key, obj) -> None:
        if obj.get("kind") != "HTTPRoute":
            return
        refs = obj["spec"]["rules"][0]["backendRefs"]
        for track, ref in zip(("stable", "canary"), refs, strict=True):
            version = int(ref["name"].removeprefix("taxi-v").removesuffix("-serve"))
            if self.current[track] != version:
                self.current[track] = version
                ModelRepository(self.base, self.root / f"{track}.config").serve(MODEL, [version], {})

    def overrides(self) -> list[str]:
        s, c = self.servers["stable"], self.servers["canary"]
        return [
            *self.common_overrides(), "rollout.backend=kubedl", f"rollout.kubedl.namespace={NAMESPACE}",
            f"rollout.kubedl.kubeconfig={self.fake.kubeconfig(self.root / 'kubeconfig')}",
            "rollout.kubedl.tfjob=taxi-trainer-v{version}", "rollout.window_seconds=0.2",
            "rollout.max_p99_ms=2000",  # measured on the verifier's own requests, on a busy shared machine
            f"rollout.kubedl.stable_rest=['{s.rest_url}']", f"rollout.kubedl.stable_grpc=['{s.grpc_target}']",
            f"rollout.kubedl.canary_rest=['{c.rest_url}']", f"rollout.kubedl.canary_grpc=['{c.grpc_target}']",
        ]

    def routes(self) -> dict[str, list[tuple[str, int]]]:
        return {kind: [(ref["name"], ref["weight"]) for ref in
                       self.fake.find(kind, NAMESPACE, name)["spec"]["rules"][0]["backendRefs"]]
                for kind, name in (("HTTPRoute", "taxi"), ("GRPCRoute", "taxi-grpc"))}

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
            if code == 2 and "this controller lost its lease" in log.read_text():
                continue  # stalled past its 1 s lease on a busy machine: it stopped unrecorded, as a killed one does
            if code != -signal.SIGKILL:
                assert code == 0, log.read_text()
                return kills, log.read_text()
        raise AssertionError(f"the rollout did not finish in {max_runs} runs")
    finally:
        cluster.fake.watchers.remove(kill_on_new_write)
