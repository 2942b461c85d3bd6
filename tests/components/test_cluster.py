"""TF_CONFIG and the chief rule, free ports, and which worker exits the launcher restarts."""
import json
import signal
import socket

import pytest

from components.distributed.cluster import free_ports, tf_config, worker_role
from components.distributed.launcher import describe_exit, retryable


def test_no_tf_config_is_one_worker_and_the_chief():
    for value in (None, "", "{}"):
        role = worker_role(value)
        assert (role.workers, role.index, role.is_chief) == (1, 0, True)


def test_tf_config_for_each_worker_of_a_worker_only_cluster():
    addresses = ["127.0.0.1:4001", "127.0.0.1:4002", "127.0.0.1:4003"]
    roles = [worker_role(json.dumps(tf_config(addresses, i))) for i in range(3)]
    assert [r.is_chief for r in roles] == [True, False, False]
    assert [(r.index, r.workers) for r in roles] == [(0, 3), (1, 3), (2, 3)]
    assert tf_config(addresses, 2) == {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 2}}


def test_a_chief_task_is_the_chief_and_worker_0_is_not():
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    chief = worker_role(json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    worker0 = worker_role(json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    assert chief.is_chief and not worker0.is_chief
    assert chief.workers == 3


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(4)
    assert len(set(ports)) == 4
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize("code, expected", [(-signal.SIGKILL, True), (-signal.SIGTERM, True), (137, True),
                                            (138, True), (1, False), (2, False), (127, False)])
def test_killed_workers_are_restarted_failed_ones_are_not(code, expected):
    assert retryable(code) is expected


def test_exit_descriptions():
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(1) == "exited with code 1"
