"""PrometheusSource against a real Prometheus scraping TF Serving 2.16.1 metrics pages (tests/rollout/clusters.py
PodExporter, two stable and one canary): the latest raw sample of every server per track, a server whose scrape fails
is `missing`, `fresh_after` waits for a scrape after that moment, and a query Prometheus refuses is one clear
error."""
from __future__ import annotations

import time

import pytest

from rollout import local_stack
from rollout.metrics import model_counters, parse_prometheus_text
from rollout.prometheus import PrometheusError, PrometheusSource
from tests.rollout.clusters import SCRAPE_S, PodExporter
from tests.rollout.conftest import MODEL
from tests.rollout.fake_pods import prometheus_text


class Pods:
    def __init__(self, folder) -> None:
        self.exporters = {"stable-a": PodExporter(0.0), "stable-b": PodExporter(0.0), "canary-a": PodExporter(0.05)}
        for exporter in self.exporters.values():
            exporter.start()
        targets = {track: [e.address for pod, e in self.exporters.items() if pod.startswith(track)]
                   for track in ("stable", "canary")}
        self.prometheus, self.prometheus_url = local_stack.run_prometheus(folder, targets, SCRAPE_S)

    def stop(self) -> None:
        self.prometheus.terminate()
        self.prometheus.wait(timeout=20)
        for exporter in self.exporters.values():
            if exporter.thread.is_alive():
                exporter.stop()


@pytest.fixture
def cluster(tmp_path):
    try:
        local_stack.prometheus_binary()
    except local_stack.StackError as e:
        pytest.fail(str(e))
    pods = Pods(tmp_path / "prometheus")
    try:
        yield pods
    finally:
        pods.stop()


def test_a_snapshot_is_every_pods_latest_scrape_and_a_failed_scrape_is_missing(cluster):
    source = PrometheusSource(cluster.prometheus_url, scrape_interval_s=SCRAPE_S, timeout_s=5)
    marked = time.time()
    snapshot = source.snapshot(MODEL, fresh_after=marked)
    assert snapshot.missing == {}
    assert {track: len(servers) for track, servers in snapshot.counters.items()} == {"stable": 2, "canary": 1}
    [canary] = snapshot.counters["canary"].values()
    # What the pod's page said at that scrape, to the request: the scrape numbers a page's counts.
    scrapes = round(sum(canary.requests.values()) / 102)
    assert canary == model_counters(parse_prometheus_text(prometheus_text(MODEL, scrapes, 0.05)), MODEL)
    assert scrapes <= cluster.exporters["canary-a"].scrapes
    cluster.exporters["canary-a"].stop()
    stopped = time.time()
    snapshot = source.snapshot(MODEL, fresh_after=stopped)
    assert snapshot.missing == {"canary": [cluster.exporters["canary-a"].address]}
    assert snapshot.counters["canary"] == {} and len(snapshot.counters["stable"]) == 2
    assert time.time() - stopped < 3 * SCRAPE_S + 3, "the wait is bounded by scrape intervals"


def test_a_refused_query_is_one_clear_error(cluster):
    source = PrometheusSource(cluster.prometheus_url, selector='namespace="x', scrape_interval_s=SCRAPE_S)
    with pytest.raises(PrometheusError, match=r"^Prometheus at http://127\.0\.0\.1:\d+ refused the query .*\(bad_data"):
        source.snapshot(MODEL)
