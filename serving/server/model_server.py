"""The local TF-Serving-compatible model server: model manager, config poller, REST and gRPC front ends.

REST (uvicorn) and gRPC (grpc.aio) run in one event loop on one thread; both hand model calls to one batch
scheduler, where requests from both transports share a queue (and, with batching on, share batches) and are
taken in turn, so neither transport can push the other's requests to the back.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import uvloop
from tensorflow_serving.config import model_server_config_pb2

from serving import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_LOAD_RETRY_INTERVAL_S,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_NUM_LOAD_RETRIES,
    DEFAULT_REST_PORT,
    ServingLimits,
)
from serving.repository.base import RepositoryError, parse_model_server_config
from serving.server.batching import BatchingParameters, BatchScheduler, scheduler_for
from serving.server.grpc.servicer import GrpcServer
from serving.server.limits import AdmissionControl
from serving.server.model_manager import ModelConfigError, ModelManager, single_model_config
from serving.server.monitoring import RequestMetrics
from serving.server.predictor import Predictor
from serving.server.request_log import RequestLogger
from serving.server.rest.app import RestApp
from serving.server.rest.endpoints import RestApi
from serving.server.rest.transport import RestServer, bind_socket

logger = logging.getLogger(__name__)


class ModelServer:
    """Serves the models of a ModelServerConfig (given, or read from `config_path`) over REST and gRPC.

    A port of 0 binds a free port (read `rest_port` / `grpc_port` after `start`); None disables that API.
    With `poll_seconds` > 0 the config file and the model folders are re-read on that interval (and failed loads
    retried, see ModelManager). `batching` turns on server-side batching with TF Serving's parameters; without it
    each request runs alone, one per CPU core at a time. gRPC's status, metadata and reload calls run on
    `grpc_workers` threads (predictions run on the event loop). `limits` bounds each request and the load in flight.
    With a `request_logger`, sampled predictions of both transports are logged (serving/server/request_log.py); `stop`
    writes what it holds and closes it.
    """

    def __init__(
        self,
        config: model_server_config_pb2.ModelServerConfig | None = None,
        config_path: str | Path | None = None,
        host: str = DEFAULT_HOST,
        rest_port: int | None = DEFAULT_REST_PORT,
        grpc_port: int | None = DEFAULT_GRPC_PORT,
        poll_seconds: float = 1.0,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        grpc_workers: int = 8,
        manager: ModelManager | None = None,
        batching: BatchingParameters | None = None,
        limits: ServingLimits | None = None,
        max_num_load_retries: int = DEFAULT_MAX_NUM_LOAD_RETRIES,
        load_retry_interval_s: float = DEFAULT_LOAD_RETRY_INTERVAL_S,
        request_logger: RequestLogger | None = None,
    ) -> None:
        if (config is None) == (config_path is None):
            raise ValueError("Give exactly one of config (a ModelServerConfig) or config_path (a models.config file).")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}.")
        self.config_path = Path(config_path) if config_path else None
        self._initial_config = config
        self.host = host
        self.manager = manager or ModelManager(
            max_num_load_retries=max_num_load_retries, load_retry_interval_s=load_retry_interval_s
        )
        self.poll_seconds = poll_seconds
        # With batching, TF Serving refuses a request larger than a batch; --max-batch-size still applies too.
        self.max_batch_size = min(max_batch_size, batching.max_batch_size) if batching else max_batch_size
        self.grpc_workers = grpc_workers
        self.batching = batching
        self.limits = limits or ServingLimits()
        self.admission = AdmissionControl(self.limits.max_in_flight_requests, self.limits.max_in_flight_bytes)
        # TF Serving's request counters and latency histogram, shared by REST and gRPC (serving/server/monitoring.py).
        self.metrics = RequestMetrics()
        self.request_logger = request_logger
        if request_logger is not None:
            self.metrics.request_log = request_logger.metrics
            self.metrics.failures.on_users_failure = request_logger.submit_failure
        self.scheduler: BatchScheduler | None = None
        self._requested_ports = (rest_port, grpc_port)
        self.rest_port: int | None = None
        self.grpc_port: int | None = None
        self._rest: RestServer | None = None
        self._grpc: GrpcServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._last_config_text: str | None = None
        self._config_file_problems: list[str] = []  # why the current file text is not in force (empty: it is)
        # Read, compare and apply as one step: a poll and a reload() must not apply an older text after a newer one.
        self._config_file_lock = threading.Lock()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    @classmethod
    def for_model(cls, model_name: str, model_base_path: str | Path, **kwargs) -> ModelServer:
        """One model, latest version, like the real server's --model_name and --model_base_path."""
        return cls(config=single_model_config(model_name, str(Path(model_base_path).resolve())), **kwargs)

    @property
    def rest_url(self) -> str:
        return f"http://{self.host}:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def start(self) -> list[str]:
        """Loads the models, then opens the ports; returns the problems of the initial load (also logged)."""
        if self._initial_config is not None:
            problems = self.manager.apply_config(self._initial_config)
        else:
            problems = self._reload_config_file(force=True)
        try:
            self._start_front_ends()
        except BaseException:
            self.stop()
            raise
        if self.poll_seconds > 0:
            self._poller = threading.Thread(target=self._poll_loop, name="model-config-poller", daemon=True)
            self._poller.start()
        return problems

    def _start_front_ends(self) -> None:
        self.scheduler = scheduler_for(self.batching, self.max_batch_size)
        predictor = Predictor(self.scheduler, self.max_batch_size)
        # Large requests (REST bodies, gRPC messages) are parsed here rather than on the event loop.
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="request-parser")
        rest_port, grpc_port = self._requested_ports
        if rest_port is None and grpc_port is None:
            return
        rest_socket = bind_socket(self.host, rest_port) if rest_port is not None else None

        async def start_front_ends() -> None:
            if rest_socket is not None:
                api = RestApi(self.manager, predictor, self._executor, self.limits.inline_bytes, self.metrics,
                              self.request_logger)
                self._rest = RestServer(RestApp(api, self.limits, self.admission), rest_socket, self.limits)
                self.rest_port = self._rest.port
                await self._rest.start()
            if grpc_port is not None:
                self._grpc = GrpcServer(self.manager, predictor, self.admission, self.limits, self.host, grpc_port,
                                        self.grpc_workers, self._executor, self.metrics, self.request_logger)
                self.grpc_port = self._grpc.port
                await self._grpc.start()

        try:
            self._loop = uvloop.new_event_loop()
            self._loop_thread = threading.Thread(target=self._loop.run_forever, name="serving-event-loop",
                                                 daemon=True)
            self._loop_thread.start()
            asyncio.run_coroutine_threadsafe(start_front_ends(), self._loop).result(timeout=60)
        except BaseException:
            if rest_socket is not None and self._rest is None:
                rest_socket.close()
            raise

    def stop(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=10)
        if self._loop is not None:
            async def stop_front_ends() -> None:
                if self._grpc is not None:
                    await self._grpc.stop()
                if self._rest is not None:
                    await self._rest.stop()

            try:
                asyncio.run_coroutine_threadsafe(stop_front_ends(), self._loop).result(timeout=30)
            finally:
                self._grpc = None
                self._rest = None
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop_thread.join(timeout=10)
                self._loop.close()
                self._loop = None
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        if self.request_logger is not None:  # after the front ends: no request is left to log
            self.request_logger.close()
        self.manager.unload_all()

    def reload(self) -> list[str]:
        """One poll: re-read the config file if it changed, and look for new version folders."""
        if self.config_path is not None:
            return self._reload_config_file(force=False)
        return self.manager.refresh()

    def wait_until_available(self, model_name: str, version: int | None = None, timeout_s: float = 30.0) -> None:
        """Blocks until `model_name` (or that version of it) serves; raises TimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            available = self.manager.available_versions(model_name)
            if available and (version is None or version in available):
                return
            time.sleep(0.05)
        raise TimeoutError(f"Model {model_name} version {version or 'any'} did not become available in {timeout_s}s.")

    def __enter__(self) -> ModelServer:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _reload_config_file(self, force: bool) -> list[str]:
        with self._config_file_lock:
            return self._reload_config_file_locked(force)

    def _reload_config_file_locked(self, force: bool) -> list[str]:
        text = self.config_path.read_text() if self.config_path.exists() else None
        if text is None:
            if force:
                raise ModelConfigError(f"Model config file {self.config_path} does not exist; write it first.")
            return [f"Model config file {self.config_path} disappeared; keeping the current config."]
        if not force and text == self._last_config_text:
            # Unchanged: its problems were logged when it was read; still report them.
            return [*self._config_file_problems, *self.manager.refresh()]
        try:
            config = parse_model_server_config(text, str(self.config_path))
        except RepositoryError as e:
            if force:
                raise ModelConfigError(str(e)) from e
            return self._keep_current_config(text, str(e))
        try:
            problems = self.manager.apply_config(config)
        except ModelConfigError as e:
            if force:
                raise
            return self._keep_current_config(text, str(e))
        self._last_config_text = text
        self._config_file_problems = []
        return problems

    def _keep_current_config(self, text: str, problem: str) -> list[str]:
        logger.error("%s; keeping the current config", problem)
        self._last_config_text = text
        self._config_file_problems = [f"{problem}; keeping the current config."]
        return [*self._config_file_problems, *self.manager.refresh()]

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.reload()
            except Exception:  # noqa: BLE001 - the poller must survive anything a bad file can cause
                logger.exception("model config poll failed; will try again")
