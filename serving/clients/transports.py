"""Python clients for TF Serving over REST or gRPC: the same calls work against the real server and the local one.

    with connect(rest="http://127.0.0.1:8501") as client:        # or connect(grpc="127.0.0.1:8500")
        client.predict({"fare": 12.5, "company": ""}, model="taxi", label="canary")  # -> [0.37]
        client.predict_outputs(rows, model="iris")   # -> [{"class": "setosa", "probabilities": [...], ...}]

Rows are raw feature dicts. The client asks the server for the signature's inputs and converts each value to
the declared dtype; None, "" and NaN become the model's missing markers (NaN, -1, "").
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np

from serving.clients.base import ServingClient, _describe
from serving.clients.errors import ServingTimeoutError, ServingUnavailableError, error_for
from serving.clients.values import ModelMetadata, parse_model_status, parse_signature_defs

HTTP_STATUS_TO_CODE = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT", 499: "CANCELLED",
    501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}


class _NoDelayHTTPConnection(http.client.HTTPConnection):
    # http.client sends a body over 2920 bytes in a second write; without TCP_NODELAY, Nagle plus the
    # server's delayed ACK hold it back ~40 ms.
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoDelayHTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class RestClient(ServingClient):
    """TF Serving's REST API (`http://HOST:8501`), one keep-alive connection per thread."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"REST address {url!r} is not a URL like http://127.0.0.1:8501.")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 8501)
        self._prefix = parts.path.rstrip("/")
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._connections_lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"{self._scheme}://{self._host}:{self._port}{self._prefix}"

    def _model_path(self, model: str, version: int | None, label: str | None) -> str:
        path = f"{self._prefix}/v1/models/{quote(model, safe='')}"
        if version is not None:
            path += f"/versions/{int(version)}"
        elif label:
            path += f"/labels/{quote(label, safe='')}"
        return path

    def _predict(self, model, version, label, signature_name, columns, signature, timeout):
        body = {"signature_name": signature_name, "inputs": {k: v.tolist() for k, v in columns.items()}}
        payload = self._request("POST", self._model_path(model, version, label) + ":predict", body, timeout)
        outputs = payload.get("outputs")
        if isinstance(outputs, dict) and len(signature.outputs) != 1:
            return {k: np.asarray(v) for k, v in outputs.items()}
        return {next(iter(signature.outputs), "outputs"): np.asarray(outputs)}

    def _metadata(self, model, version, label, timeout):
        payload = self._request("GET", self._model_path(model, version, label) + "/metadata", None, timeout)
        spec = payload.get("model_spec", {})
        signature_defs = payload.get("metadata", {}).get("signature_def", {}).get("signature_def", {})
        return ModelMetadata(spec.get("name", model), int(spec.get("version", 0)), parse_signature_defs(signature_defs))

    def _status(self, model, version, label, timeout):
        return parse_model_status(self._request("GET", self._model_path(model, version, label), None, timeout))

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            return connection, True
        factory = _NoDelayHTTPSConnection if self._scheme == "https" else _NoDelayHTTPConnection
        connection = factory(self._host, self._port, timeout=timeout)
        self._local.connection = connection
        with self._connections_lock:
            self._connections.append(connection)
        return connection, False

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None
            with self._connections_lock:
                self._connections.remove(connection)

    def close(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()

    def _request(self, method: str, path: str, body: Any, timeout: float) -> dict[str, Any]:
        data = json.dumps(body, allow_nan=True).encode("utf-8") if body is not None else None
        headers = {**self.headers, "Content-Type": "application/json"} if data is not None else dict(self.headers)
        for _ in range(2):
            connection, reused = self._connection(timeout)
            try:
                connection.request(method, path, body=data, headers=headers)
                response = connection.getresponse()
                raw = response.read()
                break
            except TimeoutError:
                self._drop_connection()
                raise ServingTimeoutError(
                    f"{method} {self.address}{path} got no answer within {timeout}s; retry or raise the timeout.",
                    "DEADLINE_EXCEEDED",
                ) from None
            except (OSError, http.client.HTTPException) as e:
                self._drop_connection()
                if reused:
                    continue  # the server closed an idle keep-alive connection: reconnect once
                raise ServingUnavailableError(
                    f"Cannot reach TF Serving at {self.address}: {e}; is the server running?", "UNAVAILABLE"
                ) from e
        try:
            payload = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            payload = {"error": raw[:200].decode("utf-8", errors="replace")}
        if response.will_close:
            self._drop_connection()
        if response.status == 200:
            return payload
        code = HTTP_STATUS_TO_CODE.get(response.status, "INTERNAL" if response.status >= 500 else "UNKNOWN")
        message = payload.get("error", "") if isinstance(payload, dict) else str(payload)
        raise error_for(code, f"{method} {path} failed with HTTP {response.status}: {message}")


class GrpcClient(ServingClient):
    """TF Serving's gRPC API (`HOST:8500`) with the tensorflow-serving-api messages, built without importing
    TensorFlow (serving/clients/protos.py)."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        import grpc

        from serving.clients.protos import ModelServiceStub, PredictionServiceStub, serving_protos

        self._grpc = grpc
        self._protos = serving_protos()
        self._target = target
        self._channel = grpc.insecure_channel(
            target,
            options=[("grpc.max_receive_message_length", 256 * 1024 * 1024),
                     ("grpc.max_send_message_length", 256 * 1024 * 1024)],
        )
        self._prediction = PredictionServiceStub(self._channel, self._protos)
        self._models = ModelServiceStub(self._channel, self._protos)

    @property
    def address(self) -> str:
        return self._target

    def close(self) -> None:
        self._channel.close()

    def _call(self, method, request, timeout: float, what: str):
        grpc = self._grpc
        try:
            return method(request, timeout=timeout, metadata=tuple(self.headers.items()) or None)
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ServingTimeoutError(
                    f"{what} at {self._target} got no answer within {timeout}s; retry or raise the timeout.", code.name
                ) from None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise ServingUnavailableError(
                    f"Cannot reach TF Serving at {self._target}: {e.details()}; is the server running?", code.name
                ) from None
            raise error_for(code.name, f"{what} failed with {code.name}: {e.details()}") from None

    def _predict(self, model, version, label, signature_name, columns, signature, timeout):
        from serving.clients.protos import predict_request, tensor_values

        dtypes = {name: signature.inputs[name].dtype for name in columns}
        request = predict_request(self._protos, model, columns, dtypes, version, label, signature_name)
        what = f"Predict on {_describe(model, version, label)}"
        response = self._call(self._prediction.Predict, request, timeout, what)
        return {name: tensor_values(tensor, self._protos) for name, tensor in response.outputs.items()}

    def _metadata(self, model, version, label, timeout):
        from google.protobuf import json_format

        from serving.clients.protos import metadata_request

        request = metadata_request(self._protos, model, version, label)
        what = f"GetModelMetadata on {_describe(model, version, label)}"
        response = self._call(self._prediction.GetModelMetadata, request, timeout, what)
        signature_defs = self._protos.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_defs)
        as_dict = json_format.MessageToDict(signature_defs, preserving_proto_field_name=True)
        return ModelMetadata(
            response.model_spec.name, response.model_spec.version.value,
            parse_signature_defs(as_dict.get("signature_def", {})),
        )

    def _status(self, model, version, label, timeout):
        from google.protobuf import json_format

        from serving.clients.protos import status_request

        request = status_request(self._protos, model, version, label)
        response = self._call(
            self._models.GetModelStatus, request, timeout, f"GetModelStatus on {_describe(model, version, label)}"
        )
        return parse_model_status(
            json_format.MessageToDict(response, preserving_proto_field_name=True, including_default_value_fields=True)
        )


def connect(rest: str | None = None, grpc: str | None = None, **kwargs: Any) -> ServingClient:
    """A client for `rest` (http://HOST:8501) or `grpc` (HOST:8500); exactly one of them."""
    if (rest is None) == (grpc is None):
        raise ValueError("Give exactly one of rest='http://HOST:8501' or grpc='HOST:8500'.")
    return RestClient(rest, **kwargs) if rest is not None else GrpcClient(grpc, **kwargs)
