"""The Kubernetes backend's Lease and state ConfigMap against the real kube-apiserver of tests/conftest.py's
`control_plane` (tests/k8s/controlplane.py), one namespace per test: controller processes contend for the Lease and
one is SIGKILLed; every 409 is the one the server answers for a stale resourceVersion or an existing name, never one a
fake decides to send. tests/rollout/test_state_stores.py keeps the fake-server tests of what the real server cannot be
made to do on cue (a 403/422/500 answer, a clock the test moves)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from rollout.kube import ConfigMapStateStore, Lease, api_client
from rollout.state import ControllerBusyError, StateConflictError
from tests.k8s.controlplane import REPO, _die_with_parent

LEASE_S = 3  # the contended Lease's duration: renewed every 0.4 s, lost after 2 s unrenewed, taken over after 3 s
STATE = "tfserving-rollout"
# A controller as `mlops rollout` holds its lock: the Kubernetes state store's Lease for the whole command, a state
# write while it holds it, then it holds on until the test closes its stdin (a clean exit) or SIGKILLs it.
CONTROLLER = """
import sys, time
from kubernetes import client
from rollout.kube import ConfigMapStateStore, api_client
from rollout.state import ControllerBusyError

kubeconfig, namespace, wait_s, duration_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
api = api_client(kubeconfig)
coordination = client.CoordinationV1Api(api)
store = ConfigMapStateStore(client.CoreV1Api(api), namespace, "tfserving-rollout", "taxi", coordination, duration_s)
print("started", flush=True)
began = time.monotonic()
try:
    with store.exclusive(wait_s=wait_s):
        waited = time.monotonic() - began
        identity = coordination.read_namespaced_lease(store.lease_name, namespace).spec.holder_identity
        document, token = store.load()
        store.save({**document, "current": {"holder": identity}}, token)
        print(f"held {identity} waited {waited:.3f}", flush=True)
        sys.stdin.read()
except ControllerBusyError as error:
    print(f"busy {error}", flush=True)
    sys.exit(3)
"""


@pytest.fixture
def namespace(control_plane) -> str:
    name = f"leases-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    return name


@pytest.fixture
def api(control_plane) -> client.ApiClient:
    return api_client(str(control_plane.kubeconfig))


class Controller:
    """A controller process (CONTROLLER) against the real API server."""

    def __init__(self, kubeconfig: str, namespace: str, wait_s: float, duration_s: float = LEASE_S) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CONTROLLER, kubeconfig, namespace, str(wait_s), str(duration_s)], cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_die_with_parent)
        assert self.line() == "started", self.process.stderr.read()

    def line(self) -> str:
        line = self.process.stdout.readline().strip()
        if not line:
            self.process.wait(timeout=60)
            raise AssertionError(f"the controller exited ({self.process.returncode}):\n{self.process.stderr.read()}")
        return line

    def held(self) -> tuple[str, float]:
        """(its Lease identity, seconds it waited) once it holds the Lease."""
        match = re.fullmatch(r"held (\S+) waited ([\d.]+)", self.line())
        assert match, "not held"
        return match[1], float(match[2])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # SIGKILL
        self.process.wait(timeout=60)
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            pipe.close()


def wait_until(condition, what: str, limit_s: float = 90) -> None:
    """Polls `condition`; the limit only ends a test that would hang (nothing here is timed by it)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {limit_s} s"
        time.sleep(0.1)


def read_lease(api: client.ApiClient, namespace: str, name: str = f"{STATE}-taxi") -> client.V1Lease:
    return client.CoordinationV1Api(api).read_namespaced_lease(name, namespace)


def state_of(api: client.ApiClient, namespace: str) -> dict:
    return json.loads(client.CoreV1Api(api).read_namespaced_config_map(STATE, namespace).data["taxi.json"])


def test_a_second_controller_process_is_refused_then_takes_over_only_after_the_killed_holders_lease_ran_out(
        control_plane, api, namespace):
    kubeconfig = str(control_plane.kubeconfig)
    first = Controller(kubeconfig, namespace, wait_s=0)
    controllers = [first]
    try:
        identity, _ = first.held()
        assert f"-{first.process.pid}-" in identity
        assert state_of(api, namespace)["current"] == {"holder": identity}
        refused = Controller(kubeconfig, namespace, wait_s=0)
        controllers.append(refused)
        answer = refused.line()
        assert refused.process.wait(timeout=60) == 3
        assert answer.startswith(f"busy another rollout controller (Lease {namespace}/{STATE}-taxi: {identity}, "
                                 "renewed "), answer
        # Alive, the holder renews: the record changes, so no newcomer may count it as expired.
        seen = read_lease(api, namespace).metadata.resource_version
        wait_until(lambda: read_lease(api, namespace).metadata.resource_version != seen, "the holder renewed")
        first.stop()  # SIGKILL: no release, the Lease stays its until it runs out
        waiting = Controller(kubeconfig, namespace, wait_s=120)
        controllers.append(waiting)
        last = read_lease(api, namespace)
        assert last.spec.holder_identity == identity and last.spec.lease_duration_seconds == LEASE_S
        observed = []  # the Lease as the test sees it while the newcomer waits

        def taken_over() -> bool:
            lease = read_lease(api, namespace)
            observed.append((lease.spec.holder_identity, lease.metadata.resource_version))
            return lease.spec.holder_identity != identity

        wait_until(taken_over, "the takeover", limit_s=150)
        taker, waited = waiting.held()
        assert f"-{waiting.process.pid}-" in taker
        # Until the takeover the record stayed what the killed holder last wrote: nobody renewed or took it meanwhile.
        assert set(observed[:-1]) <= {(identity, last.metadata.resource_version)}
        assert observed[-1][0] == taker
        # Taken only after it watched the record unchanged for the whole duration, by its own clock (a lower bound:
        # a busy machine only makes it later).
        assert waited >= LEASE_S
        taken = read_lease(api, namespace)
        assert taken.spec.lease_transitions == 1, "a takeover, not a release"
        assert state_of(api, namespace)["current"] == {"holder": taker}
        assert state_of(api, namespace)["revision"] == 2
        waiting.process.stdin.close()  # a clean exit releases it: the next controller takes it at once
        assert waiting.process.wait(timeout=60) == 0
        released = read_lease(api, namespace)
        assert released.spec.holder_identity == "" and released.spec.lease_duration_seconds == 1
        after = Controller(kubeconfig, namespace, wait_s=0)
        controllers.append(after)
        after.held()
        assert read_lease(api, namespace).spec.lease_transitions == 1, "taking a released Lease is no takeover"
    finally:
        for controller in controllers:
            controller.stop()


class Between:
    """An API whose first call of `method` is followed, before it returns or raises, by `meanwhile` (another
    controller's write landing between this one's read and its write); records the status of each ApiException."""

    def __init__(self, api, method: str, meanwhile) -> None:
        self.api, self.method, self.meanwhile, self.statuses = api, method, meanwhile, []

    def __getattr__(self, name: str):
        call = getattr(self.api, name)

        def recorded(*args, **kwargs):
            try:
                return call(*args, **kwargs)
            except ApiException as error:
                self.statuses.append(error.status)
                raise
            finally:
                if name == self.method and self.meanwhile is not None:
                    meanwhile, self.meanwhile = self.meanwhile, None
                    meanwhile()

        return recorded


def test_a_takeover_and_a_renewal_that_meet_another_writer_get_the_servers_409_and_do_not_hold(api, namespace):
    coordination = client.CoordinationV1Api(api)
    # 30 s: nobody here waits for it; the newcomer's clock is moved by hand.
    stalled = Lease(coordination, namespace, "rollout-taxi", 30)
    stalled.acquire(0)
    stalled._stop.set()
    stalled._thread.join()
    ticks = [1000.0]
    racing = Between(coordination, "read_namespaced_lease", None)
    newcomer = Lease(racing, namespace, "rollout-taxi", 30, monotonic=lambda: ticks[0])
    with pytest.raises(ControllerBusyError):
        newcomer.acquire(0)
    ticks[0] += 30  # watched unchanged for its whole duration: it takes over, but the holder renews just then
    racing.meanwhile = stalled.renew
    with pytest.raises(ControllerBusyError, match=rf"Lease {namespace}/rollout-taxi: another controller\)"):
        newcomer.acquire(0)
    assert racing.statuses == [409]
    assert read_lease(api, namespace, "rollout-taxi").spec.holder_identity == stalled.identity
    assert not stalled.holding.lost
    # The holder's renewal meets another write between its read and its write: the server's 409, and it is lost.
    renewing = Between(coordination, "read_namespaced_lease",
                       lambda: coordination.patch_namespaced_lease("rollout-taxi", namespace,
                                                                   {"metadata": {"labels": {"touched": "yes"}}}))
    stalled.api = renewing
    assert stalled.renew() is False
    assert renewing.statuses == [409]
    assert stalled.holding.lost == f"Lease {namespace}/rollout-taxi was changed by another controller"
    with pytest.raises(StateConflictError, match="lost its lease"):
        stalled.holding.check()


def test_a_stale_state_write_fails_on_the_servers_resource_version(api, namespace):
    core = client.CoreV1Api(api)
    store = ConfigMapStateStore(core, namespace, STATE, "taxi")
    document, token = store.load()
    token = store.save({**document, "current": {"id": "a"}}, token)  # creates the ConfigMap
    # Another controller of the same model writes between this one's read and its write: the server refuses the
    # stale resourceVersion (409), the store reads again, sees the other revision and stops.
    other = ConfigMapStateStore(core, namespace, STATE, "taxi")
    racing = Between(core, "read_namespaced_config_map",
                     lambda: other.save({**document, "current": {"id": "b"}}, token))
    store.core = racing
    with pytest.raises(StateConflictError, match=r"changed \(revision 2, expected 1\); another controller is "
                                                 r"running"):
        store.save({**document, "current": {"id": "c"}}, token)
    assert racing.statuses == [409]
    assert store.load() == ({"current": {"id": "b"}, "history": [], "revision": 2}, "2")
    # Another model's rollout writes its key meanwhile: the same 409, then this write lands beside it.
    store.core = racing = Between(core, "read_namespaced_config_map", lambda: ConfigMapStateStore(
        core, namespace, STATE, "tiny").save({"current": {"id": "t"}, "history": []}, "0"))
    assert store.save({"current": {"id": "d"}, "history": []}, "2") == "3"
    assert racing.statuses == [409]
    data = core.read_namespaced_config_map(STATE, namespace).data
    assert sorted(data) == ["taxi.json", "tiny.json"] and json.loads(data["taxi.json"])["current"] == {"id": "d"}
    # A stale token with no race: refused by the revision before any write.
    with pytest.raises(StateConflictError, match=r"changed \(revision 3, expected 2\)"):
        store.save({"current": None, "history": []}, "2")
    # Nor can a controller that read nothing yet create over it: refused by the revision it reads, nothing written.
    store.core = racing = Between(core, "", None)
    with pytest.raises(StateConflictError, match=r"changed \(revision 3, expected 0\)"):
        store.save({"current": None, "history": []}, "0")
    assert racing.statuses == []


def test_a_state_configmap_created_meanwhile_gets_the_servers_409_and_is_written_into(api, namespace):
    core = client.CoreV1Api(api)
    # The read finds nothing (404); another model's controller creates the ConfigMap before this one's create.
    racing = Between(core, "read_namespaced_config_map", lambda: ConfigMapStateStore(
        core, namespace, STATE, "tiny").save({"current": {"id": "t"}, "history": []}, "0"))
    taxi = ConfigMapStateStore(racing, namespace, STATE, "taxi")
    assert taxi.save({"current": {"id": "x"}, "history": []}, "0") == "1"
    assert racing.statuses == [404, 409], "NotFound, then AlreadyExists, from the server"
    data = core.read_namespaced_config_map(STATE, namespace).data
    assert sorted(data) == ["taxi.json", "tiny.json"]
    assert json.loads(data["tiny.json"])["current"] == {"id": "t"}


def test_a_held_lease_is_renewed_on_the_server_and_lost_once_its_renewals_are_blocked(api, namespace):
    coordination = client.CoordinationV1Api(api)
    holder = Lease(coordination, namespace, "rollout-taxi", LEASE_S)
    holder.acquire(0)
    try:
        renewals = [read_lease(api, namespace, "rollout-taxi").spec.renew_time]

        def renewed() -> bool:  # renewed every retry period (0.4 s): the record's renewTime moves on
            renew_time = read_lease(api, namespace, "rollout-taxi").spec.renew_time
            if renew_time != renewals[-1]:
                renewals.append(renew_time)
            return len(renewals) >= 3

        wait_until(renewed, "two renewals")
        assert renewals == sorted(renewals) and not holder.holding.lost
        holder.holding.check()
        # The Lease deleted (by hand, or by a namespace cleanup): every renewal fails with 404, and after the renew
        # deadline the holding is lost, so the next traffic write stops at its fence.
        coordination.delete_namespaced_lease("rollout-taxi", namespace)
        wait_until(lambda: holder.holding.lost, "the holding lost")
        # (a renewal in flight as it went reads it, then fails to write it: "renewing ... 404")
        assert re.fullmatch(rf"Lease {namespace}/rollout-taxi was not renewed within its renew deadline of 2s "
                            rf"\((reading|renewing) Lease {namespace}/rollout-taxi failed: 404 Not Found\)",
                            holder.holding.lost), holder.holding.lost
        with pytest.raises(StateConflictError, match="lost its lease"):
            holder.holding.check()
    finally:
        holder.release()
    # Taken over by another identity (one that misjudged it expired): the next renewal sees it and the holding is lost.
    second = Lease(coordination, namespace, "rollout-taxi", LEASE_S)
    second.acquire(0)
    try:
        coordination.patch_namespaced_lease("rollout-taxi", namespace, {"spec": {"holderIdentity": "someone-else"}})
        wait_until(lambda: second.holding.lost, "the holding lost")
        # (a renewal in flight as it changed hands gets the server's 409 instead)
        assert second.holding.lost in (f"Lease {namespace}/rollout-taxi is held by someone-else now",
                                       f"Lease {namespace}/rollout-taxi was changed by another controller")
        with pytest.raises(StateConflictError):
            second.holding.check()
    finally:
        second.release()
    assert read_lease(api, namespace, "rollout-taxi").spec.holder_identity == "someone-else", \
        "a lost Lease is not released: it is the other's"
