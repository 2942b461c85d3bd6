"""A fake Kubeflow Pipelines API server (v2beta1) on 127.0.0.1, answering the calls `kfp.Client` makes to start a run.

It behaves like the real backend where a client could notice: experiments are looked up by a name filter and a
second one of the same name is a 409 Conflict; a run must name an existing experiment, carry a pipeline spec of
schema 2.1 with a root DAG, and may only set parameters the spec declares, with the declared type; and, like the open
source backend's compiler, a spec with a resolver executor is refused ("resolver executors not implemented").
"""
from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

API = "/apis/v2beta1"
PYTHON_TYPES = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": (int, float), "BOOLEAN": bool}


class FakeKfpServer:
    def __init__(self) -> None:
        self.experiments: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-kfp", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKfpServer:
        self._thread.start()
        return self

    def __exit__(self, *args: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # The API, as functions of (query or body) -> (status, body).
    def list_experiments(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        found = list(self.experiments.values())
        for predicate in json.loads(query.get("filter", ["{}"])[0]).get("predicates", []):
            if predicate.get("key") == "display_name" and predicate.get("operation") == "EQUALS":
                found = [e for e in found if e["display_name"] == predicate.get("string_value")]
        return 200, ({"experiments": found, "total_size": len(found)} if found else {})

    def create_experiment(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body.get("display_name")
        if not name:
            return 400, _error(400, "experiment display_name is empty")
        if any(e["display_name"] == name for e in self.experiments.values()):
            return 409, _error(409, f"experiment {name!r} already exists")
        experiment = {"experiment_id": str(uuid.uuid4()), "display_name": name,
                      "namespace": body.get("namespace") or "", "storage_state": "AVAILABLE"}
        self.experiments[experiment["experiment_id"]] = experiment
        return 200, experiment

    def create_run(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("experiment_id") not in self.experiments:
            return 404, _error(404, f"experiment {body.get('experiment_id')!r} not found")
        spec = body.get("pipeline_spec") or {}
        if spec.get("schemaVersion") != "2.1.0" or "root" not in spec or "deploymentSpec" not in spec:
            return 400, _error(400, "pipeline_spec is not a KFP pipeline spec of schema 2.1.0")
        executors = spec["deploymentSpec"].get("executors", {})
        if any("resolver" in executor for executor in executors.values()):
            return 400, _error(400, "failed to compile the workflow: resolver executors not implemented")
        declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
        given = (body.get("runtime_config") or {}).get("parameters") or {}
        for name, value in given.items():
            if name not in declared:
                return 400, _error(400, f"parameter {name!r} is not an input of the pipeline")
            if not isinstance(value, PYTHON_TYPES.get(declared[name]["parameterType"], object)):
                return 400, _error(400, f"parameter {name!r} must be {declared[name]['parameterType']}")
        missing = [n for n, p in declared.items() if n not in given and "defaultValue" not in p]
        if missing:
            return 400, _error(400, f"parameters {missing} have no value and no default")
        run = {"run_id": str(uuid.uuid4()), "display_name": body.get("display_name"),
               "experiment_id": body["experiment_id"], "state": "PENDING", "pipeline_spec": spec,
               "runtime_config": body.get("runtime_config") or {}}
        self.runs[run["run_id"]] = run
        return 200, {k: v for k, v in run.items() if k != "pipeline_spec"}


def _error(code: int, message: str) -> dict[str, Any]:
    return {"error": message, "code": code, "message": message}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeKfpServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        with self.fake._lock:
            self.fake.requests.append(("GET", url.path))
            if url.path == f"{API}/healthz":
                self._reply(200, {"multi_user": False})
            elif url.path == f"{API}/experiments":
                self._reply(*self.fake.list_experiments(parse_qs(url.query)))
            else:
                self._reply(404, _error(404, f"no route {url.path}"))

    def do_POST(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with self.fake._lock:
            self.fake.requests.append(("POST", url.path))
            if url.path == f"{API}/experiments":
                self._reply(*self.fake.create_experiment(body))
            elif url.path == f"{API}/runs":
                self._reply(*self.fake.create_run(body))
            else:
                self._reply(404, _error(404, f"no route {url.path}"))
