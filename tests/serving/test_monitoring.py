"""`mlops serve`'s Prometheus page counts as TF Serving 2.16.1 does: every REST request naming a model (status and
metadata GETs too) and every gRPC Predict by status; latency of successful requests only, by API and entrypoint."""
from __future__ import annotations

import urllib.request

import pytest

from rollout.metrics import model_counters, parse_prometheus_text
from serving.clients import GrpcClient, ModelNotFoundError, RestClient, ServingError
from tests.serving.conftest import MODEL, ROW, http_json


def page(server) -> str:
    with urllib.request.urlopen(f"{server.rest_url}/monitoring/prometheus/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode()


def test_requests_are_counted_by_model_and_status_and_latency_by_api(server):
    server.wait_until_available(MODEL, 2)
    with RestClient(server.rest_url, retries=0) as rest, GrpcClient(server.grpc_target, retries=0) as grpc:
        rest.predict(ROW, MODEL, version=1)  # one metadata GET, one predict
        rest.predict(ROW, MODEL, version=1)
        grpc.predict(ROW, MODEL, label="canary")
        with pytest.raises(ModelNotFoundError):
            rest.status("absent")
        with pytest.raises(ServingError):
            grpc.predict(ROW, MODEL, version=9)
    assert http_json("POST", f"{server.rest_url}/v1/models/{MODEL}:predict", raw=b"{")[0] == 400
    samples = parse_prometheus_text(page(server))
    counts = {(s.labels["model_name"], s.labels["status"]): s.value for s in samples
              if s.name == ":tensorflow:serving:request_count"}
    assert counts[("absent", "NOT_FOUND")] == 1
    assert counts[(MODEL, "INVALID_ARGUMENT")] == 1
    # Version 9 over gRPC failed at its GetModelMetadata, which TF Serving does not count; no Predict was sent.
    assert (MODEL, "NOT_FOUND") not in counts
    latency_counts = {(s.labels["API"], s.labels["entrypoint"]): s.value for s in samples
                      if s.name == ":tensorflow:serving:request_latency_count" and s.labels["model_name"] == MODEL}
    assert latency_counts[("predict", "REST")] == 2 and latency_counts[("Predict", "GRPC")] == 1
    assert latency_counts[("", "REST")] >= 1, "metadata GETs have API \"\""
    counters = model_counters(samples, MODEL)
    assert counters.latency_buckets[float("inf")] == 3, "the prediction APIs' successful requests"
    assert counts[(MODEL, "OK")] == 3 + latency_counts[("", "REST")]


def test_the_page_is_not_a_request_and_other_paths_stay_unknown(server):
    before = page(server)
    assert page(server) == before
    assert http_json("GET", f"{server.rest_url}/monitoring/other")[0] == 404
