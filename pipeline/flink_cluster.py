"""A standing Apache Flink cluster on this machine for the Beam stages: one JobManager and N TaskManagers as separate
JVMs on loopback ports, and Beam's Flink job server beside them; each TaskManager starts its Python SDK workers from
this project's environment (no container runtime here: Beam's PROCESS environment running pipeline/sdk_worker_boot.py).
`mlops cluster flink start|stop|status`.

Flink is the distribution the PyPI packages apache-flink and apache-flink-libraries ship (`make flink` puts them in
.venv-flink, apart from .venv: apache-flink pins an old apache-beam); its conf is generated into the cluster's own
folder. The job server runs from the classpath `make flink` resolved with Maven into the local repository. Every
port is a free one picked at start and written, with each process id, into the cluster's state file; what status
prints is read back from Flink's REST API.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from settings.config import FlinkClusterConfig, PipelineConfig
from settings.errors import UserError

PROJECT_ROOT = Path(__file__).resolve().parents[1]
STATE_FILE = "cluster.json"
# Written by `make flink` into the Flink folder: the job server's jars in the local Maven repository, one classpath.
JOB_SERVER_CLASSPATH = "job-server.classpath"
JOB_SERVER_MAIN = "org.apache.beam.runners.flink.FlinkJobServerDriver"
LOOPBACK = "127.0.0.1"


class FlinkClusterError(UserError):
    """The cluster cannot start, or is not there: the message says what to do."""


@dataclass
class ClusterProcess:
    name: str
    pid: int
    log: str


@dataclass
class ClusterState:
    """What `start` wrote: the ports the cluster listens on and the processes it started."""
    rest_port: int
    rpc_port: int
    job_port: int
    artifact_port: int
    expansion_port: int
    # The PROCESS environment's command: a script in the cluster's folder that runs pipeline/sdk_worker_boot.py.
    worker_command: str
    processes: list[ClusterProcess] = field(default_factory=list)

    @property
    def rest_url(self) -> str:
        return f"http://{LOOPBACK}:{self.rest_port}"

    @property
    def job_endpoint(self) -> str:
        return f"{LOOPBACK}:{self.job_port}"

    def beam_overrides(self, parallelism: int) -> list[str]:
        """The --set overrides that send the Beam stages to this cluster."""
        return ["beam.runner=flink", f"beam.job_endpoint={self.job_endpoint}", "beam.environment_type=PROCESS",
                f"beam.environment_config={self.worker_command}", f"beam.parallelism={parallelism}"]


def flink_home(settings: FlinkClusterConfig) -> Path:
    """Flink's distribution inside the folder `make flink` filled (pyflink's bin/, conf/ and lib/)."""
    env = Path(settings.flink_env)
    env = env if env.is_absolute() else PROJECT_ROOT / env
    homes = sorted(env.glob("lib/python3*/site-packages/pyflink"))
    if not homes or not (homes[0] / "bin" / "jobmanager.sh").exists():
        raise FlinkClusterError(f"Flink is not installed in {env}; run `make flink` (Flink 1.19 from PyPI and Beam's "
                                "Flink job server from Maven Central).")
    return homes[0]


def job_server_classpath(settings: FlinkClusterConfig) -> str:
    env = Path(settings.flink_env)
    path = (env if env.is_absolute() else PROJECT_ROOT / env) / JOB_SERVER_CLASSPATH
    if not path.exists():
        raise FlinkClusterError(f"Beam's Flink job server is not resolved ({path} is missing); run `make flink`.")
    return path.read_text().strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _flink_conf(home: Path, settings: FlinkClusterConfig, state: ClusterState, folder: Path) -> dict:
    """The cluster's Flink configuration: the package's JVM options, every address on loopback, these ports."""
    shipped = yaml.safe_load((home / "conf" / "config.yaml").read_text())
    return {
        "env.java.opts.all": shipped["env"]["java"]["opts"]["all"],
        "jobmanager.rpc.address": LOOPBACK,
        "jobmanager.rpc.port": state.rpc_port,
        "jobmanager.bind-host": LOOPBACK,
        "jobmanager.memory.process.size": settings.jobmanager_memory,
        "rest.address": LOOPBACK,
        "rest.bind-address": LOOPBACK,
        "rest.port": state.rest_port,
        "taskmanager.host": LOOPBACK,
        "taskmanager.bind-host": LOOPBACK,
        "taskmanager.rpc.port": 0,
        "taskmanager.data.port": 0,
        "taskmanager.numberOfTaskSlots": settings.slots_per_taskmanager,
        "taskmanager.memory.process.size": settings.taskmanager_memory,
        "taskmanager.memory.task.off-heap.size": settings.taskmanager_task_off_heap_memory,
        # A batch job's sort-merge shuffle asks for 512 network buffers (32 KiB each) per result partition by
        # default, and a Beam stage's job holds hundreds of tasks: 64 each, from a larger network share, fit them.
        "taskmanager.memory.network.min": "256m",
        "taskmanager.memory.network.max": "256m",
        "taskmanager.network.sort-shuffle.min-buffers": 64,
        "blob.server.port": 0,
        "parallelism.default": settings.taskmanagers * settings.slots_per_taskmanager,
        "io.tmp.dirs": str(folder / "tmp"),
        "web.tmpdir": str(folder / "tmp"),
        # RPCs wait longer than the 10 s default: on a busy 2-core machine a TaskManager answered too late.
        "pekko.ask.timeout": "60 s",
        # Beam's classes, and what they share with the job's jar (joda-time, ...), from Flink's lib/ (_write_lib).
        "classloader.resolve-order": "parent-first",
        # Finished jobs stay readable through the REST API for the test and `status`.
        "jobstore.expiration-time": 86400,
    }


def _write_conf(home: Path, settings: FlinkClusterConfig, state: ClusterState, folder: Path) -> Path:
    conf = folder / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    for name in ("log4j-console.properties", "logback-console.xml"):
        shutil.copy(home / "conf" / name, conf / name)
    (conf / "config.yaml").write_text(yaml.safe_dump(_flink_conf(home, settings, state, folder), sort_keys=True))
    (folder / "tmp").mkdir(exist_ok=True)
    return conf


def _write_lib(home: Path, classpath: str, folder: Path) -> Path:
    """Flink's lib/ for this cluster: the package's jars and Beam's runner with its dependencies (less the Flink jars
    the job server brings), linked. With Beam's runner on Flink's own classpath a TaskManager keeps the SDK workers
    of a job for its next tasks; loaded from the job's jar, Beam closes them after every task
    (FlinkExecutableStageContextFactory in apache/beam), and each task pays a Python worker's start."""
    lib = folder / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    lib.mkdir(parents=True)
    jars = sorted(home.glob("lib/*.jar")) + [Path(jar) for jar in classpath.split(os.pathsep)
                                             if jar.endswith(".jar") and "/org/apache/flink/" not in jar]
    for jar in jars:
        link = lib / jar.name
        if not link.exists():
            link.symlink_to(jar)
    return lib


def _spawn(name: str, command: list[str], folder: Path, env: dict[str, str] | None = None) -> ClusterProcess:
    """Starts one process in a session of its own (its children, such as SDK workers, stop with it)."""
    log = folder / "log" / f"{name}.out"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})}, start_new_session=True, cwd=folder)
    return ClusterProcess(name=name, pid=process.pid, log=str(log))


def read_state(folder: str | os.PathLike) -> ClusterState | None:
    path = Path(folder) / STATE_FILE
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    raw["processes"] = [ClusterProcess(**p) for p in raw["processes"]]
    return ClusterState(**raw)


def _write_state(folder: Path, state: ClusterState) -> None:
    (folder / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A child of this process that ended stays a zombie until reaped: it counts as gone.
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def rest(state: ClusterState, path: str) -> dict:
    """One GET of Flink's REST API."""
    with urllib.request.urlopen(state.rest_url + path, timeout=10) as response:
        return json.loads(response.read())


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((LOOPBACK, port)) == 0


def _wait_ready(state: ClusterState, settings: FlinkClusterConfig) -> None:
    deadline = time.monotonic() + settings.start_timeout_s
    registered = 0
    while time.monotonic() < deadline:
        dead = [p for p in state.processes if not _alive(p.pid)]
        if dead:
            raise FlinkClusterError(f"the Flink cluster's {dead[0].name} ended while starting; its log is "
                                    f"{dead[0].log}.")
        try:
            registered = rest(state, "/overview")["taskmanagers"]
        except (urllib.error.URLError, OSError, ValueError):
            registered = 0
        if registered == settings.taskmanagers and _listening(state.job_port):
            return
        time.sleep(1)
    raise FlinkClusterError(f"the Flink cluster was not ready within cluster.flink.start_timeout_s="
                            f"{settings.start_timeout_s:g} s ({registered} of {settings.taskmanagers} TaskManagers "
                            "registered); raise it on a busy machine, or read the logs under "
                            f"{state.processes[0].log.rsplit('/', 1)[0]}.")


def start(config: PipelineConfig) -> ClusterState:
    """Starts the JobManager, the TaskManagers and Beam's Flink job server; returns their state once every
    TaskManager has registered and the job server listens."""
    settings = config.cluster.flink
    folder = Path(config.flink_cluster_dir).resolve()
    running = read_state(folder)
    if running and any(_alive(p.pid) for p in running.processes):
        raise FlinkClusterError(f"a Flink cluster is already running from {folder} (REST {running.rest_url}); stop "
                                "it with `mlops cluster flink stop` first.")
    home = flink_home(settings)
    classpath = job_server_classpath(settings)
    ports = iter(_distinct_free_ports(5))
    folder.mkdir(parents=True, exist_ok=True)
    state = ClusterState(rest_port=next(ports), rpc_port=next(ports), job_port=next(ports),
                         artifact_port=next(ports), expansion_port=next(ports),
                         worker_command=_write_worker_command(folder))
    conf = _write_conf(home, settings, state, folder)
    flink_env = {"FLINK_CONF_DIR": str(conf), "FLINK_LIB_DIR": str(_write_lib(home, classpath, folder)),
                 "FLINK_LOG_DIR": str(folder / "log"),
                 "FLINK_PID_DIR": str(folder / "pid")}
    try:
        state.processes.append(_spawn("jobmanager", [str(home / "bin" / "jobmanager.sh"), "start-foreground"],
                                      folder, flink_env))
        for index in range(settings.taskmanagers):
            state.processes.append(_spawn(f"taskmanager-{index + 1}",
                                          [str(home / "bin" / "taskmanager.sh"), "start-foreground"],
                                          folder, flink_env))
        state.processes.append(_spawn("job-server", [
            "java", "-Xmx768m", "-cp", classpath, JOB_SERVER_MAIN,
            f"--flink-master={LOOPBACK}:{state.rest_port}", f"--job-host={LOOPBACK}",
            f"--job-port={state.job_port}", f"--artifact-port={state.artifact_port}",
            f"--expansion-port={state.expansion_port}", f"--artifacts-dir={folder / 'artifacts'}",
        ], folder))
        _write_state(folder, state)
        _wait_ready(state, settings)
    except BaseException:
        _stop_processes(state)
        raise
    return state


def _write_worker_command(folder: Path) -> str:
    """The PROCESS environment's command (one executable, no arguments of its own): this interpreter, whose
    environment holds the project, running pipeline/sdk_worker_boot.py with the arguments Beam passes."""
    script = folder / "sdk-worker"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(PROJECT_ROOT))} exec {shlex.quote(sys.executable)} "
                      "-m pipeline.sdk_worker_boot \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def _distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = _free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _stop_processes(state: ClusterState) -> list[str]:
    """Stops each process (and its session's children) by id: TERM, then KILL what is left after a grace time."""
    stopped = []
    for process in reversed(state.processes):
        if not _alive(process.pid):
            continue
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        stopped.append(process)
    deadline = time.monotonic() + 30
    for process in stopped:
        while _alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
    for process in stopped:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # children that outlived their leader (SDK workers)
        except ProcessLookupError:
            pass
    return [p.name for p in stopped]


def stop(config: PipelineConfig) -> list[str]:
    """Stops every process the running cluster started; returns their names (none when nothing ran)."""
    folder = Path(config.flink_cluster_dir).resolve()
    state = read_state(folder)
    if state is None:
        return []
    stopped = _stop_processes(state)
    (folder / STATE_FILE).unlink()
    return stopped


@dataclass
class ClusterStatus:
    state: ClusterState
    alive: dict[str, bool]
    flink_version: str
    taskmanagers: list[dict]
    jobs: list[dict]


def status(config: PipelineConfig) -> ClusterStatus | None:
    """The running cluster as Flink's REST API reports it, or None when none was started."""
    state = read_state(Path(config.flink_cluster_dir).resolve())
    if state is None:
        return None
    alive = {p.name: _alive(p.pid) for p in state.processes}
    try:
        overview = rest(state, "/overview")
        managers = rest(state, "/taskmanagers")["taskmanagers"]
        jobs = rest(state, "/jobs/overview")["jobs"]
    except (urllib.error.URLError, OSError) as e:
        raise FlinkClusterError(f"the Flink cluster's REST API at {state.rest_url} does not answer ({e}); stop the "
                                "cluster with `mlops cluster flink stop` and start it again.") from e
    return ClusterStatus(state=state, alive=alive, flink_version=overview.get("flink-version", ""),
                         taskmanagers=managers, jobs=jobs)


def records_per_taskmanager(state: ClusterState, job_id: str) -> dict[str, int]:
    """The records each TaskManager read or wrote in one job, summed over the job's vertices (Flink's REST API)."""
    totals: dict[str, int] = {}
    for vertex in rest(state, f"/jobs/{job_id}")["vertices"]:
        for manager in rest(state, f"/jobs/{job_id}/vertices/{vertex['id']}/taskmanagers")["taskmanagers"]:
            metrics = manager.get("metrics", {})
            records = metrics.get("read-records", 0) + metrics.get("write-records", 0)
            key = manager.get("taskmanager-id", manager.get("host", ""))
            totals[key] = totals.get(key, 0) + records
    return totals
