"""The local TF-Serving-compatible model server: model manager, config poller, REST and gRPC front ends."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from tensorflow_serving.config import model_server_config_pb2

from serving import DEFAULT_GRPC_PORT, DEFAULT_HOST, DEFAULT_MAX_BATCH_SIZE, DEFAULT_REST_PORT
from serving.grpc_api import GrpcServer
from serving.model_manager import ConfigError, ModelManager, single_model_config
from serving.model_repository import RepositoryError, parse_model_server_config
from serving.rest_api import RestServer

logger = logging.getLogger(__name__)


class ModelServer:
    """Serves the models of a ModelServerConfig (given, or read from `config_path`) over REST and gRPC.

    A port of 0 binds a free port (read `rest_port` / `grpc_port` after `start`); None disables that API.
    With `poll_seconds` > 0 the config file and the model folders are re-read on that interval.
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
    ) -> None:
        if (config is None) == (config_path is None):
            raise ValueError("Give exactly one of config (a ModelServerConfig) or config_path (a models.config file).")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}.")
        self.config_path = Path(config_path) if config_path else None
        self._initial_config = config
        self.host = host
        self.manager = manager or ModelManager()
        self.poll_seconds = poll_seconds
        self.max_batch_size = max_batch_size
        self.grpc_workers = grpc_workers
        self._requested_ports = (rest_port, grpc_port)
        self.rest_port: int | None = None
        self.grpc_port: int | None = None
        self._rest: RestServer | None = None
        self._grpc: GrpcServer | None = None
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
        rest_port, grpc_port = self._requested_ports
        try:
            if rest_port is not None:
                self._rest = RestServer(self.manager, self.host, rest_port, self.max_batch_size)
                self.rest_port = self._rest.port
                self._rest.start()
            if grpc_port is not None:
                self._grpc = GrpcServer(self.manager, self.host, grpc_port, self.max_batch_size, self.grpc_workers)
                self.grpc_port = self._grpc.port
                self._grpc.start()
        except BaseException:
            self.stop()
            raise
        if self.poll_seconds > 0:
            self._poller = threading.Thread(target=self._poll_loop, name="model-config-poller", daemon=True)
            self._poller.start()
        return problems

    def stop(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=10)
        if self._grpc is not None:
            self._grpc.stop()
            self._grpc = None
        if self._rest is not None:
            self._rest.stop()
            self._rest = None
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
                raise ConfigError(f"Model config file {self.config_path} does not exist; write it first.")
            return [f"Model config file {self.config_path} disappeared; keeping the current config."]
        if not force and text == self._last_config_text:
            # Unchanged: its problems were logged when it was read; still report them.
            return [*self._config_file_problems, *self.manager.refresh()]
        try:
            config = parse_model_server_config(text, str(self.config_path))
        except RepositoryError as e:
            if force:
                raise ConfigError(str(e)) from e
            return self._keep_current_config(text, str(e))
        try:
            problems = self.manager.apply_config(config)
        except ConfigError as e:
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
