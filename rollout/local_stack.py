"""`mlops deploy local`: a deployment on this machine that moves real traffic. It starts, from the model repository,
`mlops serve` processes for the stable track (<serving>/models.config) and the canary track (models.canary.config),
HAProxy in front of them (one REST frontend, one gRPC frontend over HTTP/2, a server per process, weights per track)
and Prometheus scraping every server's TF Serving metrics with its track as a target label; the pids, ports and
files go to <serving>/.stack/stack.json, and `--stop` ends those processes by id.

The router's weights change at run time through HAProxy's admin socket, without a reload or a dropped connection
(HAProxy 2.6 management guide, section 9.3 "Unix Socket commands": `set weight <backend>/<server> <weight>`,
absolute weights 0-256, dynamic under `balance roundrobin`; `get weight <backend>/<server>` answers
"<current> (initial <initial>)"), and are read back from it, never assumed."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
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
from serving.server.monitoring import METRICS_PATH

STACK_FILE = "stack.json"
BACKENDS = ("rest", "grpc")
READY = re.compile(r"serving REST on (\S+) and gRPC on (\S+)")
REQUEST_LOG = re.compile(r"^(?:logging \S+ of predictions under .+|request logging off .+)$", re.M)
INSTALL = ("install them with `make deploy-deps` (as root: apt-get install -y haproxy prometheus; Debian's "
           "packages)")


class StackError(BackendError):
    """The local stack cannot start, stop or be reached; the message says what to do."""


def binaries() -> dict[str, str]:
    """The haproxy and prometheus executables (Debian puts haproxy in /usr/sbin, off a user's PATH)."""
    found = {}
    missing = []
    for name in ("haproxy", "prometheus"):
        path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}")
                                           if os.access(p, os.X_OK)), None)
        if path:
            found[name] = path
        else:
            missing.append(name)
    if missing:
        raise StackError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed; {INSTALL}.")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    track: str
    name: str  # the HAProxy server name, e.g. canary-0
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
    haproxy_pid: int
    prometheus_pid: int
    router_rest: str
    router_grpc: str
    prometheus_url: str
    admin_socket: str
    scrape_interval_s: float
    track_label: str = "track"
    started_at: str = ""

    def endpoints(self) -> dict[str, list[Endpoint]]:
        return {track: [Endpoint(s.rest, s.grpc) for s in self.servers if s.track == track] for track in TRACKS}

    def router(self) -> Router:
        return Router(self.admin_socket, {track: [s.name for s in self.servers if s.track == track]
                                          for track in TRACKS})

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
    document["servers"] = [Server(**s) for s in document["servers"]]
    return Stack(**document)


def running_stack(serving_base_dir: str | Path, folder: str = "") -> Stack | None:
    """The recorded stack when its router still runs (its admin socket answers), else None."""
    stack = load_stack(stack_folder(serving_base_dir, folder))
    if stack is None or not _alive(stack.haproxy_pid):
        return None
    return stack


# -------------------------------------------------------------------------------------------------- the router
class Router:
    """HAProxy's admin socket: the `rest` and `grpc` backends each hold one server per `mlops serve` process."""

    def __init__(self, admin_socket: str, servers: dict[str, list[str]], timeout_s: float = 5.0) -> None:
        self.admin_socket = admin_socket
        self.servers = servers
        self.timeout_s = timeout_s

    def command(self, line: str) -> str:
        """One command in the socket's non-interactive mode: HAProxy answers and closes the connection."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout_s)
                sock.connect(self.admin_socket)
                sock.sendall(line.encode() + b"\n")
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
        except OSError as e:
            raise StackError(f"cannot reach HAProxy's admin socket {self.admin_socket} ({e}); start the stack with "
                             "`mlops deploy local`.") from None
        return b"".join(chunks).decode()

    def weight(self, backend: str, server: str) -> int:
        answer = self.command(f"get weight {backend}/{server}").strip()
        match = re.match(r"(\d+) \(initial \d+\)", answer)
        if match is None:
            raise StackError(f"HAProxy answered {answer!r} to `get weight {backend}/{server}`; is the stack's "
                             "router the one in the state file (`mlops deploy local --status`)?")
        return int(match.group(1))

    def set_canary_weight(self, percent: int) -> None:
        # Every server of a track gets the track's percentage: both tracks have as many servers, so the canary's
        # share of the requests is `percent`.
        for backend in BACKENDS:
            for track in TRACKS:
                weight = percent if track == "canary" else 100 - percent
                for server in self.servers[track]:
                    answer = self.command(f"set weight {backend}/{server} {weight}").strip()
                    if answer:
                        raise StackError(f"HAProxy refused `set weight {backend}/{server} {weight}` ({answer}).")

    def weights(self) -> dict[str, dict[str, int]]:
        """backend -> server -> current weight, as HAProxy reports it."""
        return {backend: {server: self.weight(backend, server) for track in TRACKS for server in self.servers[track]}
                for backend in BACKENDS}

    def canary_weight(self) -> int:
        """The canary's share in percent, read back from HAProxy; every server of both backends must agree."""
        weights = self.weights()
        shares = set()
        for backend in BACKENDS:
            canary = {weights[backend][s] for s in self.servers["canary"]}
            stable = {weights[backend][s] for s in self.servers["stable"]}
            if len(canary) != 1 or len(stable) != 1:
                raise StackError(f"HAProxy's {backend} servers have uneven weights {weights[backend]}; set the "
                                 "canary weight again (`mlops rollout start` resumes).")
            c, s = canary.pop(), stable.pop()
            shares.add(round(100 * c / (c + s)) if c + s else 0)
        if len(shares) != 1:
            raise StackError(f"HAProxy's REST and gRPC weights disagree ({weights}); set the canary weight again "
                             "(`mlops rollout start` resumes).")
        return shares.pop()


# ------------------------------------------------------------------------------------------------ configuration
def haproxy_config(stack_dir: Path, rest_port: int, grpc_port: int, servers: list[Server], canary_percent: int) -> str:
    lines = ["global",
             f"    stats socket {stack_dir / 'haproxy.sock'} mode 600 level admin",
             "    stats timeout 30s",
             f"    pidfile {stack_dir / 'haproxy.pid'}",
             "",
             "defaults",
             "    mode http",
             "    timeout connect 2s",
             "    timeout client 60s",
             "    timeout server 60s",
             # A request the chosen server could not take (connection refused) goes to another one.
             "    retries 2",
             "    option redispatch",
             "",
             "frontend rest",
             f"    bind 127.0.0.1:{rest_port}",
             "    default_backend rest",
             "",
             "frontend grpc",
             # gRPC is HTTP/2 end to end: h2 without TLS on both sides.
             f"    bind 127.0.0.1:{grpc_port} proto h2",
             "    default_backend grpc",
             ""]
    for backend in BACKENDS:
        lines += [f"backend {backend}", "    balance roundrobin"]
        for server in servers:
            weight = canary_percent if server.track == "canary" else 100 - canary_percent
            address = server.rest.split("://", 1)[-1] if backend == "rest" else server.grpc
            proto = " proto h2" if backend == "grpc" else ""
            lines.append(f"    server {server.name} {address}{proto} weight {weight}")
        lines.append("")
    return "\n".join(lines)


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
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (a child of this process not yet waited for) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


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


def _stop_pid(pid: int, timeout_s: float = 20.0) -> None:
    if not _alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        try:  # reaps it when it is a child of this process
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


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
        rest_port = router_rest_port or free_port()
        grpc_port = router_grpc_port or free_port()
        haproxy_cfg = stack_dir / "haproxy.cfg"
        haproxy_cfg.write_text(haproxy_config(stack_dir, rest_port, grpc_port, servers, canary_percent))
        (stack_dir / "haproxy.sock").unlink(missing_ok=True)
        haproxy_log = stack_dir / "haproxy.log"
        haproxy = _spawn([tools["haproxy"], "-db", "-f", str(haproxy_cfg)], haproxy_log)
        started.append(haproxy.pid)
        router = Router(str(stack_dir / "haproxy.sock"), {t: [s.name for s in servers if s.track == t]
                                                          for t in TRACKS})
        _wait_for("haproxy", lambda: (stack_dir / "haproxy.sock").exists() and _router_answers(router), haproxy,
                  haproxy_log, 20)
        targets = {t: [s.rest.split("://", 1)[-1] for s in servers if s.track == t] for t in TRACKS}
        prometheus, url = run_prometheus(stack_dir, targets, scrape_interval_s, prometheus_port, track_label,
                                         tools["prometheus"], started)
        stack = Stack(str(stack_dir), model, servers, haproxy.pid, prometheus.pid, f"http://127.0.0.1:{rest_port}",
                      f"127.0.0.1:{grpc_port}", url, str(stack_dir / "haproxy.sock"), scrape_interval_s, track_label,
                      time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        stack.save()
        return stack
    except BaseException:
        for pid in reversed(started):
            _stop_pid(pid)
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
    process = _spawn([executable or binaries()["prometheus"], f"--config.file={config}",
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
        _stop_pid(process.pid)
        raise
    return process, url


def _router_answers(router: Router) -> bool:
    try:
        router.command("show info")
        return True
    except StackError:
        return False


def stop(serving_base_dir: str | Path, folder: str = "") -> list[str]:
    """Ends every process the recorded stack started, by process id; returns what it stopped."""
    stack_dir = stack_folder(serving_base_dir, folder)
    stack = load_stack(stack_dir)
    if stack is None:
        return []
    stopped = []
    for what, pid in [("prometheus", stack.prometheus_pid), ("haproxy", stack.haproxy_pid),
                      *((f"mlops serve {s.name}", s.pid) for s in stack.servers)]:
        if _alive(pid):
            _stop_pid(pid)
            stopped.append(f"{what} (pid {pid})")
    (stack_dir / STACK_FILE).unlink(missing_ok=True)
    return stopped


def status(serving_base_dir: str | Path, folder: str = "") -> dict[str, Any] | None:
    """Each recorded process (running or not), the router's weights as HAProxy reports them, Prometheus's targets."""
    stack = load_stack(stack_folder(serving_base_dir, folder))
    if stack is None:
        return None
    report: dict[str, Any] = {
        "processes": {"haproxy": {"pid": stack.haproxy_pid, "running": _alive(stack.haproxy_pid)},
                      "prometheus": {"pid": stack.prometheus_pid, "running": _alive(stack.prometheus_pid)},
                      **{s.name: {"pid": s.pid, "running": _alive(s.pid), "rest": s.rest, "grpc": s.grpc}
                         for s in stack.servers}},
        "router": {"rest": stack.router_rest, "grpc": stack.router_grpc}, "prometheus": stack.prometheus_url}
    try:
        report["weights"] = stack.router().weights()
        report["canary_percent"] = stack.router().canary_weight()
    except StackError as e:
        report["weights_error"] = str(e)
    try:
        with urllib.request.urlopen(f"{stack.prometheus_url}/api/v1/targets", timeout=5) as response:
            targets = json.loads(response.read())["data"]["activeTargets"]
        report["targets"] = [{"instance": t["labels"].get("instance"), "track": t["labels"].get(stack.track_label),
                              "health": t["health"], "last_error": t.get("lastError", "")} for t in targets]
    except (OSError, ValueError, KeyError) as e:
        report["targets_error"] = f"cannot read Prometheus's targets ({e})"
    return report
