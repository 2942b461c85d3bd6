"""The state stores and the controllers' lock: a stale write fails instead of overwriting (on a file and on a
ConfigMap that already exists), another model's rollout in the same ConfigMap is no conflict, and the Lease is held,
refused, renewed, taken over only once expired, and released as client-go's leader election does.

Against the fake API server (tests/rollout/fake_apiserver.py). tests/rollout/test_leases_real.py runs the same cases
against the real kube-apiserver, with the server's own 409s, and covers these fully: the stale ConfigMap write, another
model's rollout in the same ConfigMap, the takeover or renewal that meets another writer, the renewal seen on the
server, a second controller that waits for an expiring Lease (there a SIGKILLed process's). They stay here as the
fast, cluster-free check; the rest need what the real server cannot do on cue (403/422/500 answers, a moved clock)."""
from __future__ import annotations

import json
import re
import threading
import time

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from rollout import kube
from rollout.backends import BackendError
from rollout.kube import CONFLICT_RETRIES, ConfigMapStateStore, Lease, _parse_time, api_client
from rollout.state import ControllerBusyError, LocalStateStore, StateConflictError
from tests.rollout.fake_apiserver import FakeApiServer

NAMESPACE = "mlops-test"


def test_a_stale_local_write_fails_and_a_fresh_one_lands(tmp_path):
    store = LocalStateStore(tmp_path, "tiny")
    document, token = store.load()
    assert token == "0"
    first = store.save({**document, "current": {"id": "a"}}, token)
    assert first == "1"
    with pytest.raises(StateConflictError, match=r"changed \(revision 1, expected 0\)"):
        store.save({**document, "current": {"id": "b"}}, token)
    assert store.load() == ({"current": {"id": "a"}, "history": [], "revision": 1}, "1")
    assert store.save({"current": None, "history": []}, first) == "2"


def test_a_state_file_in_a_folder_not_made_yet_and_one_without_a_revision(tmp_path):
    store = LocalStateStore(tmp_path / "serving" / "not-yet", "tiny")
    assert store.save({"current": None, "history": []}, "0") == "1"
    store.path.write_text('{"current": null, "history": []}')  # written before revisions were recorded
    assert store.load() == ({"current": None, "history": []}, "0")


def test_the_local_lock_names_its_holder_and_can_be_waited_for(tmp_path):
    holder, other = LocalStateStore(tmp_path, "tiny"), LocalStateStore(tmp_path, "tiny")
    with holder.exclusive():
        with pytest.raises(ControllerBusyError) as refused:
            with other.exclusive():
                pass
        assert re.fullmatch(r"another rollout controller \(pid \d+\) has held this model's rollout for [01]s; wait "
                            r"for it to finish or stop it, then run the command again \(`--set "
                            r"rollout.lease_wait_seconds=N` waits up to N seconds\).", str(refused.value))
        with pytest.raises(ControllerBusyError, match=r"for [01]s after waiting 0.3s; wait"):
            with other.exclusive(wait_s=0.3):
                pass
    released = threading.Event()

    def hold_briefly() -> None:
        with holder.exclusive():
            released.wait(5)
            time.sleep(0.2)

    thread = threading.Thread(target=hold_briefly)
    thread.start()
    time.sleep(0.1)
    released.set()
    with other.exclusive(wait_s=5):
        pass
    thread.join()
    with LocalStateStore(tmp_path, "other-model").exclusive(), holder.exclusive():
        pass  # one lock per model


@pytest.fixture
def api(tmp_path):
    with FakeApiServer() as fake:
        yield fake, api_client(fake.kubeconfig(tmp_path / "kubeconfig"))


def test_a_stale_configmap_write_fails_when_the_configmap_exists(api):
    fake, api_client_ = api
    core = client.CoreV1Api(api_client_)
    store = ConfigMapStateStore(core, NAMESPACE, "rollout-state", "tiny")
    document, token = store.load()
    assert token == "0"
    token = store.save({**document, "current": {"id": "a"}}, token)  # creates the ConfigMap
    stale_document, stale = store.load()
    fresh = store.save({**stale_document, "current": {"id": "b"}}, stale)
    with pytest.raises(StateConflictError, match=r"changed \(revision 2, expected 1\)"):
        store.save({**stale_document, "current": {"id": "c"}}, stale)
    assert store.load()[0]["current"] == {"id": "b"} and store.load()[1] == fresh == "2"
    # A second controller that read nothing yet cannot create over it either.
    with pytest.raises(StateConflictError):
        store.save({"current": {"id": "d"}, "history": []}, "0")


def test_another_models_rollout_in_the_same_configmap_is_no_conflict(api):
    fake, api_client_ = api
    core = client.CoreV1Api(api_client_)
    tiny, taxi = (ConfigMapStateStore(core, NAMESPACE, "rollout-state", model) for model in ("tiny", "taxi"))
    tiny_document, tiny_token = tiny.load()
    tiny_token = tiny.save({**tiny_document, "current": {"id": "t"}}, tiny_token)
    taxi_document, taxi_token = taxi.load()
    taxi.save({**taxi_document, "current": {"id": "x"}}, taxi_token)
    fake.conflict_once("ConfigMap", "rollout-state")  # and someone else writes the ConfigMap meanwhile
    assert tiny.save({"current": None, "history": []}, tiny_token) == "2"
    assert taxi.load()[0]["current"] == {"id": "x"}


def lease(api_client_, duration_s: float = 1.0, clock=None, monotonic=time.monotonic) -> Lease:
    return Lease(client.CoordinationV1Api(api_client_), NAMESPACE, "rollout-tiny", duration_s, clock=clock,
                 monotonic=monotonic)


class Ticks:
    """A monotonic clock the test moves: the seconds this process has watched a Lease."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_held_lease_refuses_a_second_controller_until_released(api):
    fake, api_client_ = api
    first, second = lease(api_client_, 30), lease(api_client_, 30)
    first.acquire(0)
    first_renewal = fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]["renewTime"]
    with pytest.raises(ControllerBusyError) as refused:
        second.acquire(0)
    message = str(refused.value)
    assert f"Lease {NAMESPACE}/rollout-tiny: {first.identity}, renewed 0s ago" in message
    assert "has held this model's rollout for 0s" in message
    first.release()
    stored = fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]
    assert stored["holderIdentity"] == ""
    assert stored["leaseDurationSeconds"] == 1 and stored["renewTime"] != first_renewal, "released: it expires now"
    second.acquire(0)
    spec = fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]
    assert spec["holderIdentity"] == second.identity
    assert spec["leaseTransitions"] == 0, "taking a released Lease is no takeover"
    second.release()


def test_an_expired_lease_is_taken_over_and_its_old_holder_learns_it_lost(api):
    """Expiry as client-go judges it: the record unchanged for leaseDurationSeconds by the newcomer's own clock, from
    when it first saw it; the holder's renewTime against the newcomer's wall clock decides nothing."""
    fake, api_client_ = api
    import datetime

    wall = [datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)]
    ticks = Ticks()
    # The Lease's own duration decides, not the newcomer's.
    stalled = lease(api_client_, 10, clock=lambda: wall[0])
    # The newcomer's wall clock is an hour behind: judged by renewTime, the Lease would look fresh for an hour.
    newcomer = lease(api_client_, 30, clock=lambda: wall[0] - datetime.timedelta(hours=1), monotonic=ticks)
    stalled.acquire(0)
    stalled._stop.set()  # stalled: it renews no more
    with pytest.raises(ControllerBusyError, match="renewed -3600s ago by its clock"):
        newcomer.acquire(0)
    ticks.now += 9.9  # watched unchanged for 9.9 s of its 10
    with pytest.raises(ControllerBusyError):
        newcomer.acquire(0)
    ticks.now += 0.1  # 10 s: expired from that instant
    newcomer.acquire(0)
    spec = fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]
    assert spec["holderIdentity"] == newcomer.identity and spec["leaseTransitions"] == 1
    stalled.renew()
    assert stalled.holding.lost == f"Lease {NAMESPACE}/rollout-tiny is held by {newcomer.identity} now"
    assert not newcomer.holding.lost
    stalled.release()  # a lost lease is not released: it is the newcomer's
    assert fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]["holderIdentity"] == newcomer.identity
    newcomer.release()


def test_a_renewed_lease_restarts_the_newcomers_watch(api):
    """Each change of the record (a renewal) restarts the newcomer's count, whatever the clocks say."""
    fake, api_client_ = api
    ticks = Ticks()
    holder, newcomer = lease(api_client_, 10), lease(api_client_, 10, monotonic=ticks)
    holder.acquire(0)
    holder._stop.set()
    with pytest.raises(ControllerBusyError):
        newcomer.acquire(0)
    ticks.now += 9
    assert holder.renew()
    with pytest.raises(ControllerBusyError):
        newcomer.acquire(0)  # sees the renewal: its count starts again
    ticks.now += 9.9  # 18.9 s since first seen, 9.9 s since it saw the renewal
    with pytest.raises(ControllerBusyError):
        newcomer.acquire(0)
    ticks.now += 0.1
    newcomer.acquire(0)
    newcomer.release()


def test_a_holding_not_renewed_within_its_renew_deadline_fences_every_write(api):
    """The renew deadline (2/3 of the duration) ends a holding before any newcomer may take the Lease (the whole
    duration): a stalled controller's next write raises first."""
    fake, api_client_ = api
    ticks = Ticks()
    holder = lease(api_client_, 30, monotonic=ticks)
    holder.acquire(0)
    holder._stop.set()
    assert (holder.renew_deadline_s, holder.retry_period_s) == (20, 4)
    ticks.now += 19.9
    holder.holding.check()
    ticks.now += 0.2
    with pytest.raises(StateConflictError, match="lost its lease .*renew deadline"):
        holder.holding.check()


def test_a_write_retried_after_a_conflict_is_fenced_again(api):
    """update_with_retries runs the fence before every write, the retry after a 409 too."""
    fake, api_client_ = api
    from rollout.kube import update_with_retries

    fences, writes = [], []

    def write(obj):
        writes.append(obj)
        if len(writes) == 1:
            raise ApiException(status=409, reason="Conflict")

    update_with_retries(lambda: {}, lambda obj: True, write, "a route", fence=lambda: fences.append(len(writes)))
    assert fences == [0, 1] and len(writes) == 2

    def lost():
        raise StateConflictError("lost")

    with pytest.raises(StateConflictError):
        update_with_retries(lambda: {}, lambda obj: True, writes.append, "a route", fence=lost)
    assert len(writes) == 2, "nothing written once the fence refused"


def test_a_held_lease_is_renewed_while_the_controller_runs(api):
    fake, api_client_ = api
    holder = lease(api_client_, 1)
    holder.acquire(0)
    first = fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]["renewTime"]
    deadline = time.monotonic() + 5
    while fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]["renewTime"] == first:
        assert time.monotonic() < deadline, "the lease was not renewed"
        time.sleep(0.05)
    assert not holder.holding.lost
    holder.release()


def test_the_kubernetes_store_holds_its_lease_for_the_whole_command(api):
    fake, api_client_ = api
    store = ConfigMapStateStore(client.CoreV1Api(api_client_), NAMESPACE, "tfserving-rollout", "taxi_v2",
                                client.CoordinationV1Api(api_client_), lease_duration_s=30)
    other = ConfigMapStateStore(client.CoreV1Api(api_client_), NAMESPACE, "tfserving-rollout", "taxi_v2",
                                client.CoordinationV1Api(api_client_), lease_duration_s=30)
    with store.exclusive() as holding:
        assert not holding.lost
        # Lease names are DNS subdomains: the model's underscore becomes a dash.
        assert fake.find("Lease", NAMESPACE, "tfserving-rollout-taxi-v2")["spec"]["holderIdentity"]
        with pytest.raises(ControllerBusyError):
            with other.exclusive():
                pass
    with other.exclusive():
        pass


def test_a_takeover_or_a_renewal_that_meets_another_writer_does_not_hold_the_lease(api):
    fake, api_client_ = api
    import datetime

    now = [datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)]
    ticks = Ticks()
    stalled = lease(api_client_, 10, clock=lambda: now[0])
    newcomer = lease(api_client_, 10, clock=lambda: now[0], monotonic=ticks)
    stalled.acquire(0)
    stalled._stop.set()
    with pytest.raises(ControllerBusyError):
        newcomer.acquire(0)
    ticks.now += 11
    fake.conflict_once("Lease", "rollout-tiny")  # a third controller takes it first
    with pytest.raises(ControllerBusyError, match=r"rollout-tiny: another controller\) has held this model's rollout "
                                                  r"for 0s"):
        newcomer.acquire(0)
    stalled.release()
    holder = lease(api_client_, 10, clock=lambda: now[0])
    holder.acquire(0)
    holder._stop.set()
    fake.conflict_once("Lease", "rollout-tiny")
    holder.renew()
    assert holder.holding.lost == f"Lease {NAMESPACE}/rollout-tiny was changed by another controller"


def test_a_second_controller_may_wait_for_an_expiring_lease(api):
    fake, api_client_ = api
    stalled, waiting = lease(api_client_, 1), lease(api_client_, 1)
    stalled.acquire(0)
    stalled._stop.set()
    started = time.monotonic()
    waiting.acquire(wait_s=10)
    assert time.monotonic() - started < 10
    assert fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]["holderIdentity"] == waiting.identity
    waiting.release()


def test_the_configmap_store_reports_api_failures_in_one_sentence(api):
    fake, api_client_ = api
    store = ConfigMapStateStore(client.CoreV1Api(api_client_), NAMESPACE, "rollout-state", "tiny")
    fake.fail("GET", "ConfigMap", 403)
    with pytest.raises(BackendError, match=rf"^reading ConfigMap {NAMESPACE}/rollout-state failed: 403 Forbidden$"):
        store.load()
    fake.fail("POST", "ConfigMap", 403)
    with pytest.raises(BackendError, match=rf"^writing ConfigMap {NAMESPACE}/rollout-state failed: 403 Forbidden$"):
        store.save({"current": None, "history": []}, "0")
    assert fake.find("ConfigMap", NAMESPACE, "rollout-state") is None
    token = store.save({"current": None, "history": []}, "0")
    fake.fail("PUT", "ConfigMap", 422)
    with pytest.raises(BackendError, match=r"^writing ConfigMap .* failed: 422 Unprocessable Entity$"):
        store.save({"current": {"id": "a"}, "history": []}, token)
    assert store.load() == ({"current": None, "history": [], "revision": 1}, "1")


def test_a_configmap_created_meanwhile_or_without_data_is_written_into(api):
    fake, api_client_ = api
    core = client.CoreV1Api(api_client_)
    tiny = ConfigMapStateStore(core, NAMESPACE, "rollout-state", "tiny")

    def taxi_creates_it_first(path, body):
        fake.add({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rollout-state",
                  "namespace": NAMESPACE}, "data": {"taxi.json": '{"current": null, "history": [], "revision": 4}'}})
        return None  # then ours arrives: 409 AlreadyExists

    fake.intercept("POST", "ConfigMap", taxi_creates_it_first)
    assert tiny.save({"current": {"id": "t"}, "history": []}, "0") == "1"
    data = fake.find("ConfigMap", NAMESPACE, "rollout-state")["data"]
    assert sorted(data) == ["taxi.json", "tiny.json"] and json.loads(data["tiny.json"])["current"] == {"id": "t"}
    # Made by hand (`kubectl create configmap rollout-empty`): no data at all.
    fake.add({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rollout-empty", "namespace": NAMESPACE}})
    empty = ConfigMapStateStore(core, NAMESPACE, "rollout-empty", "tiny")
    assert empty.load() == ({"current": None, "history": []}, "0")
    assert empty.save({"current": None, "history": []}, "0") == "1"
    assert list(fake.find("ConfigMap", NAMESPACE, "rollout-empty")["data"]) == ["tiny.json"]


def test_a_configmap_that_keeps_changing_under_the_writer_gives_up_after_its_retries(api):
    fake, api_client_ = api
    store = ConfigMapStateStore(client.CoreV1Api(api_client_), NAMESPACE, "rollout-state", "tiny")
    token = store.save({"current": None, "history": []}, "0")

    def another_key_written_meanwhile(path, body):
        fake.conflict_once("ConfigMap", "rollout-state")
        return None

    fake.intercept("PUT", "ConfigMap", another_key_written_meanwhile, times=CONFLICT_RETRIES)
    with pytest.raises(StateConflictError, match=rf"kept conflicting with other writers \({CONFLICT_RETRIES} tries\)"):
        store.save({"current": {"id": "a"}, "history": []}, token)
    assert fake.conflicts_sent == CONFLICT_RETRIES
    fake.intercept("PUT", "ConfigMap", another_key_written_meanwhile, times=CONFLICT_RETRIES - 1)
    assert store.save({"current": {"id": "a"}, "history": []}, token) == "2", "the last try lands"


def test_the_lease_reports_api_failures_and_a_create_race(api):
    fake, api_client_ = api
    where = f"Lease {NAMESPACE}/rollout-tiny"
    fake.fail("GET", "Lease", 403)
    with pytest.raises(BackendError, match=rf"^reading {where} failed: 403 Forbidden$"):
        lease(api_client_, 30).acquire(0)
    fake.fail("POST", "Lease", 403)
    with pytest.raises(BackendError, match=rf"^creating {where} failed: 403 Forbidden$"):
        lease(api_client_, 30).acquire(0)
    fake.fail("POST", "Lease", 409)  # another controller created it between our read and create
    with pytest.raises(ControllerBusyError, match=rf"^another rollout controller \({where}: another controller\) has "
                                                  r"held this model's rollout for 0s"):
        lease(api_client_, 30).acquire(0)
    holder = lease(api_client_, 30)
    holder.acquire(0)
    holder._stop.set()
    holder._thread.join()
    fake.fail("GET", "Lease", 500)
    with pytest.raises(BackendError, match=rf"^reading {where} failed: 500 Internal Server Error$"):
        holder.renew()
    fake.fail("PUT", "Lease", 422)
    with pytest.raises(BackendError, match=rf"^renewing {where} failed: 422 Unprocessable Entity$"):
        holder.renew()
    assert not holder.holding.lost, "a failed renewal is retried; the lease is lost only after its duration"
    fake.fail("GET", "Lease", 500)
    holder.release()  # a release that fails leaves the lease to expire by itself
    assert fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]["holderIdentity"] == holder.identity
    holder.release()
    assert fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]["holderIdentity"] == ""
    released = lease(api_client_, 30)
    fake.fail("PUT", "Lease", 403)
    with pytest.raises(BackendError, match=rf"^taking {where} failed: 403 Forbidden$"):
        released.acquire(0)


class FakeTime:
    """time.monotonic and time.sleep for Lease.acquire: sleeping moves the clock on."""

    def __init__(self) -> None:
        self.now, self.sleeps = 100.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


def test_waiting_for_a_held_lease_tries_again_every_retry_period_until_the_wait_ends(api, monkeypatch):
    fake, api_client_ = api
    holder = lease(api_client_, 30)
    holder.acquire(0)
    fake_time = FakeTime()
    monkeypatch.setattr(kube, "time", fake_time)
    reads_before = sum(1 for method, path in fake.requests if method == "GET" and "/leases/" in path)
    with pytest.raises(ControllerBusyError, match=r"after waiting 10.0s"):
        lease(api_client_, 30, monotonic=fake_time.monotonic).acquire(wait_s=10)
    assert fake_time.sleeps == [4.0, 4.0, 2.0], "a try at 0, 4, 8 and 10 s (client-go's 2 s of 15), none after"
    fake_time.sleeps.clear()
    with pytest.raises(ControllerBusyError):
        lease(api_client_, 30, monotonic=fake_time.monotonic).acquire(wait_s=0.01)
    assert fake_time.sleeps == [0.05], "never a busy loop, however little of the wait is left"
    reads = sum(1 for method, path in fake.requests if method == "GET" and "/leases/" in path) - reads_before
    assert reads == 4 + 2
    holder.release()


def test_a_lease_records_when_it_was_acquired_and_how_often_it_changed_hands(api, monkeypatch):
    fake, api_client_ = api
    import datetime

    start = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
    now = [start]
    first = lease(api_client_, 10, clock=lambda: now[0])
    first.acquire(0)
    assert first._thread.daemon, "the renewal thread never keeps the process alive"
    first._stop.set()
    spec = fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == (first.identity, 10, 0)
    assert _parse_time(spec["acquireTime"]) == _parse_time(spec["renewTime"]) == start
    now[0] += datetime.timedelta(seconds=5)
    first.renew()
    now[0] += datetime.timedelta(seconds=3)
    with pytest.raises(ControllerBusyError,
                       match=r"renewed 3s ago by its clock\) has held this model's rollout for 8s"):
        lease(api_client_, 10, clock=lambda: now[0]).acquire(0)
    fake_time = FakeTime()
    monkeypatch.setattr(kube, "time", fake_time)
    for transitions in (1, 2):  # each holder that stopped renewing taken over in turn
        now[0] += datetime.timedelta(seconds=11)
        taker = lease(api_client_, 10, clock=lambda: now[0], monotonic=fake_time.monotonic)
        fake_time.sleeps.clear()
        # Its renewTime is old by this clock: a hint to watch it for a whole duration even with no wait asked for.
        taker.acquire(0)
        assert sum(fake_time.sleeps) >= 10
        taker._stop.set()
        spec = fake.find("Lease", NAMESPACE, "rollout-tiny")["spec"]
        assert spec["holderIdentity"] == taker.identity and spec["leaseTransitions"] == transitions
        assert _parse_time(spec["acquireTime"]) == now[0]
