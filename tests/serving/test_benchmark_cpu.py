"""The serving benchmarks' CPU per request (benchmarks/cpu_per_request.py, benchmarks/request_log.py): the /proc reader,
the per-1,000 arithmetic, the targets' verdicts just inside and just outside each threshold, and where a process
saturates. Fast: no server starts; /proc is this process's own or a written file."""
from __future__ import annotations

import os
import threading
import time

import pytest

from benchmarks.cpu_per_request import (
    added,
    cores_used,
    cpu_snapshot,
    per_1000,
    process_cpu_s,
    requests_per_s_at,
    stat_cpu_ticks,
)
from benchmarks.request_log import (
    IN_SERVER_100,
    OFF,
    PROXY,
    PROXY_100,
    PROXY_OFF,
    SERVER,
    container_cpu_limits,
    logging_target_lines,
    saturation_lines,
)
from benchmarks.serving_benchmark import ENVOY, router_target_lines

# proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...
STAT = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 120 0 0 0 {utime} {stime} 3 4 20 0 9 0 100 0 0"


def test_the_stat_reader_adds_user_and_system_ticks_after_a_command_name_with_parentheses():
    assert stat_cpu_ticks(STAT.format(utime=250, stime=50)) == 300


def test_a_process_cpu_is_read_from_its_stat_file(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "stat").write_text(STAT.format(utime=200, stime=100))
    assert process_cpu_s(4242, tmp_path) == pytest.approx(300 / os.sysconf("SC_CLK_TCK"))
    assert cpu_snapshot({"server": 4242}, tmp_path) == {"server": pytest.approx(300 / os.sysconf("SC_CLK_TCK"))}


def test_this_process_cpu_grows_by_what_its_threads_spend():
    """Every thread counts (a server's gRPC and writer threads): CPU spent in a second thread shows in the process."""
    before = process_cpu_s(os.getpid())

    def spin() -> None:
        started = time.thread_time()
        while time.thread_time() - started < 0.2:
            pass

    thread = threading.Thread(target=spin)
    thread.start()
    thread.join()
    assert process_cpu_s(os.getpid()) - before >= 0.2 - 2 / os.sysconf("SC_CLK_TCK")  # a tick lost at each end


def test_cpu_seconds_per_1000_requests_and_cores_used():
    before, after = {"server": 10.0, "log proxy": 2.0}, {"server": 13.0, "log proxy": 2.5}
    assert per_1000(before, after, 2000) == {"server": 1.5, "log proxy": 0.25}
    assert cores_used(before, after, 4.0) == {"server": 0.75, "log proxy": 0.125}
    with pytest.raises(ValueError, match="at least one request"):
        per_1000(before, after, 0)


def test_what_a_path_adds_and_where_a_process_saturates():
    assert added({"server": 1.0, "Envoy": 0.15}, {"server": 1.0}) == pytest.approx(0.15)
    assert added({"server": 0.9}, {"server": 1.0}) == pytest.approx(-0.1)
    assert requests_per_s_at(0.5, 1) == 2000  # 0.5 s per 1,000 requests: 2,000 requests fill one CPU
    assert requests_per_s_at(1.25, 2) == 1600


def envoy_cell(envoy: float, server: float = 1.0, route: str = "envoy") -> dict:
    cost = {"server": server, ENVOY: envoy} if route == "envoy" else {"server": server}
    return {"batching": "off", "cell": "alone", "transport": "rest", "clients": 16, "route": route,
            "cpu_s_per_1000": cost}


@pytest.mark.parametrize("envoy, verdict", [(0.149, "met"), (0.151, "MISSED")])
def test_the_router_target_is_met_just_inside_15_percent_and_missed_just_outside(envoy, verdict):
    [line] = router_target_lines([envoy_cell(0, route="direct"), envoy_cell(envoy)])
    assert line.endswith(f"{verdict})"), line


def log_cells(server_on: float, proxy_on: float, proxy_off: float) -> dict:
    return {("rest", 16, OFF): {"cpu_s_per_1000": {SERVER: 1.0}},
            ("rest", 16, IN_SERVER_100): {"cpu_s_per_1000": {SERVER: server_on}},
            ("rest", 16, PROXY_100): {"cpu_s_per_1000": {PROXY: proxy_on, SERVER: 1.0}, "cores_used": {PROXY: 0.3},
                                      "requests_per_s": 500.0},
            ("rest", 16, PROXY_OFF): {"cpu_s_per_1000": {PROXY: proxy_off, SERVER: 1.0}}}


@pytest.mark.parametrize("share, verdict", [(0.099, "met"), (0.101, "MISSED")])
def test_the_logging_target_is_met_just_inside_10_percent_and_missed_just_outside(share, verdict):
    lines = logging_target_lines(log_cells(1 + share, share, 0.05))
    in_server = next(line for line in lines if IN_SERVER_100 in line)
    proxy = next(line for line in lines if PROXY_100 in line)
    assert in_server.endswith(f"{verdict})") and proxy.endswith(f"{verdict})"), lines
    [forwarding] = [line for line in lines if "forwarding" in line]
    assert f"logging {share - 0.05:+.3f} s per 1,000" in forwarding


@pytest.mark.parametrize("proxy, verdict", [(0.49, "(it does not)"), (0.51, "(it SATURATES FIRST)")])
def test_the_proxy_saturates_first_when_its_limit_runs_out_before_the_servers(proxy, verdict):
    """Limits of 1 CPU (proxy) and 2 CPU (server) at 1 s per 1,000 server requests: the proxy keeps up to 0.5 s."""
    [line] = saturation_lines(log_cells(1.0, proxy, 0.1), {"log-proxy": 1.0, "tfserving": 2.0})
    assert verdict in line and f"needs {2 * proxy:.2f} CPU" in line, line
    # A limit above one CPU does not help one process: the verdict stays.
    [line] = saturation_lines(log_cells(1.0, proxy, 0.1), {"log-proxy": 2.0, "tfserving": 2.0})
    assert verdict in line and "at the 1 CPU it can use (limit 2)" in line, line


def test_the_cpu_limits_are_read_from_the_deployment(tmp_path):
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text("""
spec:
  template:
    spec:
      containers:
        - {name: tfserving, resources: {limits: {cpu: "2"}}}
        - {name: log-proxy, resources: {limits: {cpu: 1500m}}}
""")
    assert container_cpu_limits(deployment) == {"tfserving": 2.0, "log-proxy": 1.5}
    assert set(container_cpu_limits()) == {"tfserving", "log-proxy"}  # the project's own stable Deployment
