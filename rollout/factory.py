"""Builds the controller for a PipelineConfig's `rollout` section and model."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from rollout.backends import Backend, BackendError, Endpoint, LocalBackend
from rollout.controller import Controller
from rollout.local_stack import running_stack
from rollout.prometheus import PrometheusSource, source_for
from rollout.shadow import ShadowLimits
from rollout.skew import SkewCheck
from rollout.verify import Limits, Verifier, load_golden_rows
from settings.config import (
    PipelineConfig,
    RolloutConfig,
    RolloutKubeDLConfig,
    RolloutKubernetesConfig,
    RolloutLocalConfig,
)


def _endpoints(section: RolloutLocalConfig | RolloutKubernetesConfig | RolloutKubeDLConfig
               ) -> dict[str, list[Endpoint]]:
    return {
        "stable": [Endpoint(r, g) for r, g in zip(section.stable_rest, section.stable_grpc, strict=True)],
        "canary": [Endpoint(r, g) for r, g in zip(section.canary_rest, section.canary_grpc, strict=True)],
    }


def metrics_source(rollout: RolloutConfig) -> PrometheusSource | None:
    """The configured Prometheus; on a cluster, where other deployments' servers carry a track label too, an empty
    rollout.prometheus.selector keeps to the rollout's namespace."""
    namespace = {"kubernetes": rollout.kubernetes.namespace, "kubedl": rollout.kubedl.namespace}.get(rollout.backend)
    return source_for(rollout.prometheus, f'namespace="{namespace}"' if namespace else "")


def build_backend(config: PipelineConfig) -> Backend:
    rollout = config.rollout
    metrics = metrics_source(rollout)
    if rollout.backend == "local":
        stack = running_stack(config.serving_base_dir, rollout.local.stack_dir)
        if stack is None:
            return LocalBackend(config.serving_base_dir, config.model_name, _endpoints(rollout.local),
                                rollout.request_timeout_seconds, metrics=metrics)
        # `mlops deploy local` runs: its servers, its router and (unless rollout.prometheus.url names another) its
        # Prometheus.
        metrics = metrics or PrometheusSource(stack.prometheus_url, stack.track_label, "", stack.scrape_interval_s,
                                              rollout.prometheus.request_timeout_seconds)
        return LocalBackend(config.serving_base_dir, config.model_name, stack.endpoints(),
                            rollout.request_timeout_seconds, router=stack.router(), metrics=metrics)
    from rollout import kube

    if rollout.backend == "kubernetes":
        if metrics is None:
            # The verifier's own requests to the canary Service cannot show what the routes send it: fail closed.
            raise BackendError("rollout.backend kubernetes reads its verification windows from Prometheus: set "
                               "rollout.prometheus.url to its HTTP API (e.g. http://prometheus-operated.monitoring.svc"
                               ":9090; docs/tutorials/kubernetes.md, Scraping).")
        return kube.KubernetesBackend(rollout.kubernetes, config.model_name, _endpoints(rollout.kubernetes),
                                      rollout.request_timeout_seconds,
                                      lease_duration_s=rollout.lease_duration_seconds, metrics=metrics,
                                      repository_dir=config.serving_base_dir)
    return kube.KubeDLBackend(rollout.kubedl, config.model_name, _endpoints(rollout.kubedl),
                              rollout.request_timeout_seconds, lease_duration_s=rollout.lease_duration_seconds,
                              metrics=metrics)


def build_controller(config: PipelineConfig, backend: Backend | None = None,
                     log: Callable[[str], None] = print) -> Controller:
    rollout = config.rollout
    backend = backend or build_backend(config)
    section = rollout.shadow
    # Where the router cannot copy requests the 0% step stays the verifier's own window.
    shadow = ShadowLimits(section.percent, section.min_requests, section.max_disagreement_rate,
                          section.max_relative_error, section.max_score_distance, section.max_latency_ratio,
                          section.examples) if section.percent and backend.can_mirror() else None
    limits = Limits(rollout.max_abs_diff, rollout.max_error_rate, rollout.max_p99_ms, rollout.window_seconds,
                    rollout.window_requests_per_second, rollout.request_timeout_seconds,
                    rollout.max_error_rate_increase, rollout.max_p99_ratio, rollout.share_tolerance_sigmas,
                    rollout.min_error_rate_regression, rollout.detection_power, rollout.false_rollback_rate,
                    rollout.max_window_extensions, user_steps=len(rollout.steps) + (1 if shadow else 0),
                    max_disagreement_rate=section.max_disagreement_rate, max_relative_error=section.max_relative_error)

    def verifier() -> Verifier:
        rows = load_golden_rows(rollout.golden_data, config.pipeline_root, rollout.golden_rows)
        return Verifier(backend, config.model_name, rows, limits, log, shadow=shadow)

    def stamped(message: str) -> None:
        log(f"{time.strftime('%H:%M:%S')} [rollout] {message}")

    return Controller(backend, config.model_name, rollout.steps, verifier, rollout.load_timeout_seconds,
                      rollout.keep_previous_seconds, rollout.poll_seconds, log=stamped,
                      report_dir=report_dir(config),
                      limits={**dataclasses.asdict(limits),
                              **({"shadow": dataclasses.asdict(shadow)} if shadow else {})},
                      max_inconclusive=rollout.max_inconclusive_windows, on_inconclusive=rollout.on_inconclusive,
                      history_limit=rollout.history_limit, lease_wait_s=rollout.lease_wait_seconds,
                      skew_check=skew_check(config), shadow_percent=shadow.percent if shadow else 0)


def skew_check(config: PipelineConfig) -> SkewCheck | None:
    """The check rollout.skew_check asks for: the servers' request logs against each candidate's own training data
    (the schema and statistics the Publisher copies into its version folder), at the monitoring thresholds."""
    if not config.rollout.skew_check:
        return None
    from monitoring.monitor import training_data

    return SkewCheck(config.request_log_dir, config.model_name, config.monitoring, config.rollout.skew_min_requests,
                     lambda version: training_data(config, version),
                     logging_enabled=config.serving.request_log.enabled)


def report_dir(config: PipelineConfig) -> str:
    """Where finished rollouts land as JSON and HTML: beside the local state file, else under the output root (the
    cluster backends keep their state in a ConfigMap); any folder or URI tf.io.gfile serves."""
    if config.rollout.backend == "local":
        return str(Path(config.serving_base_dir) / ".rollouts")
    return f"{str(config.output_root).rstrip('/')}/rollouts"
