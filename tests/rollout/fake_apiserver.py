"""A fake Kubernetes API server for tests (an HTTP server, not a cluster): it keeps ConfigMaps, Pods and custom
objects with a resourceVersion, answers an update carrying a stale resourceVersion with 409 Conflict as the real
one does, and serves the pod proxy (`/pods/<name>:<port>/proxy/<path>`) through handlers the test gives."""
from __future__ import annotations

import copy
import itertools
import json
import re
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

PROXY = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/:]+):(\d+)/proxy/(.*)$")
CORE = re.compile(r"^/api/v1/namespaces/([^/]+)/(configmaps|pods)(?:/([^/]+))?$")
CUSTOM = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")


class FakeApiServer:
    def __init__(self) -> None:
        self.objects: dict[tuple, dict] = {}
        self.versions = itertools.count(1)
        self.lock = threading.Lock()
        self.conflicts_sent = 0
        self.requests: list[tuple[str, str]] = []
        self._conflict_once: set[tuple] = set()
        # (method, kind) -> [handler(path, body) -> (status, body) | None, requests left]; None answers as usual.
        self._intercepts: dict[tuple[str, str], list] = {}
        # pod name -> handler(path) -> (status, body)
        self.proxies: dict[str, Callable[[str], tuple[int, str]]] = {}
        # Called after a stored object is created or replaced through the API, before the answer is sent: (key, object).
        self.watchers: list[Callable[[tuple, dict], None]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: object) -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client was killed while its request was being served

            def _body(self) -> dict:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

            def do_GET(self):
                fake.requests.append(("GET", self.path))
                self._send(*(fake._intercepted("GET", self.path, {}) or fake.get(self.path)))

            def do_PUT(self):
                fake.requests.append(("PUT", self.path))
                body = self._body()
                self._send(*(fake._intercepted("PUT", self.path, body) or fake.put(self.path, body)))

            def do_POST(self):
                fake.requests.append(("POST", self.path))
                body = self._body()
                self._send(*(fake._intercepted("POST", self.path, body) or fake.post(self.path, body)))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path) -> str:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }))
        return str(path)

    # Storage

    @staticmethod
    def key_of(obj: dict) -> tuple:
        return (obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])

    def add(self, obj: dict) -> dict:
        with self.lock:
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(next(self.versions))
            self.objects[self.key_of(obj)] = obj
        return obj

    def find(self, kind: str, namespace: str, name: str) -> dict | None:
        for (_, k, ns, n), obj in self.objects.items():
            if (k, ns, n) == (kind, namespace, name):
                return obj
        return None

    def conflict_once(self, kind: str, name: str) -> None:
        """The next update of that object finds it changed by someone else (its resourceVersion moves on)."""
        self._conflict_once.add((kind, name))

    def intercept(self, method: str, kind: str, handler: Callable[[str, dict], tuple[int, object] | None],
                  times: int = 1) -> None:
        """The next `times` requests of that method on that kind go to `handler` first (a failure status the real
        server can answer, such as 403 Forbidden from RBAC, or a change another client makes meanwhile)."""
        self._intercepts[(method, kind)] = [handler, times]

    def fail(self, method: str, kind: str, code: int, times: int = 1) -> None:
        reason = HTTPStatus(code).phrase  # the status line's phrase, which the client reports as the reason
        self.intercept(method, kind, lambda path, body: self._status(code, reason.replace(" ", ""), "injected"), times)

    def _intercepted(self, method: str, path: str, body: dict) -> tuple[int, object] | None:
        try:
            kind = self._locate(urlparse(path).path)[0]
        except KeyError:
            return None
        entry = self._intercepts.get((method, kind))
        if entry is None:
            return None
        entry[1] -= 1
        if entry[1] <= 0:
            del self._intercepts[(method, kind)]
        return entry[0](path, body)

    def _status(self, code: int, reason: str, message: str) -> tuple[int, dict]:
        return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
                      "message": message}

    def _locate(self, path: str) -> tuple[str, str, str | None, str | None]:
        """(kind, namespace, name, apiVersion) of a request path."""
        core = CORE.match(path)
        if core:
            namespace, plural, name = core.groups()
            return {"configmaps": "ConfigMap", "pods": "Pod"}[plural], namespace, name, "v1"
        custom = CUSTOM.match(path)
        if custom:
            group, version, namespace, plural, name = custom.groups()
            kind = {"httproutes": "HTTPRoute", "grpcroutes": "GRPCRoute", "inferences": "Inference",
                    "modelversions": "ModelVersion", "leases": "Lease", "tfjobs": "TFJob"}[plural]
            return kind, namespace, name, f"{group}/{version}"
        raise KeyError(path)

    def get(self, raw_path: str) -> tuple[int, object]:
        url = urlparse(raw_path)
        proxy = PROXY.match(unquote(url.path))
        if proxy:
            _, pod, _, rest = proxy.groups()
            handler = self.proxies.get(pod)
            return handler(rest) if handler else self._status(503, "ServiceUnavailable", f"no endpoint for {pod}")
        kind, namespace, name, api_version = self._locate(url.path)
        with self.lock:
            if name is None:
                selector = dict(p.split("=") for p in parse_qs(url.query).get("labelSelector", [""])[0].split(",")
                                if p)
                items = [o for (_, k, ns, _), o in self.objects.items() if k == kind and ns == namespace
                         and all(o["metadata"].get("labels", {}).get(a) == b for a, b in selector.items())]
                return 200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": {"resourceVersion": "1"},
                             "items": items}
            obj = self.find(kind, namespace, name)
            return (200, obj) if obj else self._status(404, "NotFound", f'{kind.lower()} "{name}" not found')

    def put(self, path: str, body: dict) -> tuple[int, object]:
        kind, namespace, name, _ = self._locate(urlparse(path).path)
        with self.lock:
            current = self.find(kind, namespace, name)
            if current is None:
                return self._status(404, "NotFound", f'{kind.lower()} "{name}" not found')
            if (kind, name) in self._conflict_once:
                self._conflict_once.discard((kind, name))
                current["metadata"]["resourceVersion"] = str(next(self.versions))
            sent = body.get("metadata", {}).get("resourceVersion")
            if sent and sent != current["metadata"]["resourceVersion"]:
                self.conflicts_sent += 1
                return self._status(409, "Conflict", f'Operation cannot be fulfilled on {kind.lower()} "{name}": the '
                                    "object has been modified; please apply your changes to the latest version")
            body = copy.deepcopy(body)
            body["metadata"]["resourceVersion"] = str(next(self.versions))
            body["metadata"].setdefault("namespace", namespace)
            body.setdefault("apiVersion", current["apiVersion"])
            body.setdefault("kind", kind)
            self.objects[self.key_of(body)] = body
        for watcher in self.watchers:
            watcher(self.key_of(body), body)
        return 200, body

    def post(self, path: str, body: dict) -> tuple[int, object]:
        kind, namespace, _, api_version = self._locate(urlparse(path).path)
        body.setdefault("apiVersion", api_version)
        body.setdefault("kind", kind)
        body["metadata"].setdefault("namespace", namespace)
        with self.lock:
            if self.find(kind, namespace, body["metadata"]["name"]):
                return self._status(409, "AlreadyExists", f'{kind.lower()} "{body["metadata"]["name"]}" already '
                                    "exists")
        created = self.add(body)
        for watcher in self.watchers:
            watcher(self.key_of(created), created)
        return 201, created
