"""What a TF Serving 2.16.1 pod answers through the API server's pod proxy, where the local `mlops serve` server the
tests run differs from it (each rule from tensorflow/serving at tag 2.16.1):
- GetModelStatus ignores a version label and answers every version of the model (get_model_status_impl.cc), so a
  status request naming a label is answered as the model's status;
- a config that points an existing label at a version not AVAILABLE is refused as a whole, nothing of it loaded
  (server_core.cc ReloadConfig / UpdateModelVersionLabelMap; with --allow_version_labels_for_unavailable_models a
  label that is new is admitted);
- the Prometheus page (util/prometheus_exporter.cc): `:tensorflow:serving:request_count{model_name,status}` over
  every request naming the model, status GETs included, and the `request_latency` histogram (model_name, API,
  entrypoint; microseconds, buckets 10 * 1.8^i) of successful requests only."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

LABEL_STATUS = re.compile(r"^(v1/models/[^/:]+)/labels/[^/:]+/?$")
LATENCY_BOUNDS = [10 * 1.8**i for i in range(33)]
FAST, SLOW, STATUS_GET = 10, 16, 25  # bucket indexes: most predictions, the slowest 1 %, status and metadata GETs


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def tf_serving_get(server_url: str, path: str) -> tuple[int, str]:
    """GET `path` on a local server as TF Serving would answer it."""
    label_status = LABEL_STATUS.match(path)
    return http_get(f"{server_url}/{label_status.group(1) if label_status else path}")


def available(server_url: str, model: str, version: int) -> bool:
    status, body = http_get(f"{server_url}/v1/models/{model}/versions/{version}")
    return status == 200 and json.loads(body)["model_version_status"][0]["state"] == "AVAILABLE"


def refused_label(server_url: str, model: str, old_labels: dict[str, int], new_labels: dict[str, int]) -> str | None:
    """Why TF Serving would refuse a config moving `old_labels` to `new_labels` now, or None."""
    for label, version in new_labels.items():
        if label in old_labels and old_labels[label] != version and not available(server_url, model, version):
            return (f"Request to assign label to version {version} of model {model}, which is not currently "
                    "available for inference")
    return None


def p99_ms_of_fast_bucket() -> float:
    return float(f"{LATENCY_BOUNDS[FAST]:.6g}") / 1000.0


def prometheus_text(model: str, scrapes: int, error_share: float) -> str:
    """The page after `scrapes` windows of 100 predictions (half REST, half gRPC; `error_share` of them failed, 99 %
    of the rest fast) and 2 status GETs each, and some traffic of another model."""
    predictions = 100 * scrapes
    errors = round(predictions * error_share)
    gets = 2 * scrapes
    ok = predictions - errors
    slow = ok // 100
    lines = ["# TYPE :tensorflow:serving:request_count counter",
             f':tensorflow:serving:request_count{{model_name="{model}",status="OK"}} {ok + gets}',
             f':tensorflow:serving:request_count{{model_name="{model}",status="INVALID_ARGUMENT"}} {errors}',
             ':tensorflow:serving:request_count{model_name="other",status="INTERNAL"} 50',
             "# TYPE :tensorflow:serving:request_latency histogram"]

    def histogram(labels: str, counts: dict[int, int]) -> None:
        cumulative = 0
        for i, bound in enumerate([*LATENCY_BOUNDS, None]):
            cumulative += counts.get(i, 0)
            le = "+Inf" if bound is None else f"{bound:.6g}"
            lines.append(f':tensorflow:serving:request_latency_bucket{{{labels},le="{le}"}} {cumulative}')
        lines.append(f":tensorflow:serving:request_latency_sum{{{labels}}} {cumulative * 1000}")
        lines.append(f":tensorflow:serving:request_latency_count{{{labels}}} {cumulative}")

    rest_fast = (ok - slow) // 2
    histogram(f'model_name="{model}",API="predict",entrypoint="REST"', {FAST: rest_fast, SLOW: slow})
    histogram(f'model_name="{model}",API="Predict",entrypoint="GRPC"', {FAST: ok - slow - rest_fast})
    histogram(f'model_name="{model}",API="",entrypoint="REST"', {STATUS_GET: gets})
    histogram('model_name="other",API="predict",entrypoint="REST"', {STATUS_GET: 50})
    return "\n".join(lines) + "\n"
