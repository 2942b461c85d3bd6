"""The one error type the local server raises for a request, with TF Serving's gRPC and HTTP codes."""
from __future__ import annotations

import grpc

# TF Serving's mapping from canonical status codes to HTTP (model_servers/http_server.cc).
HTTP_STATUS_BY_GRPC_CODE = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


class ServingRequestError(Exception):
    """A request the server refuses: `code` is the gRPC status, `http_status` the REST one."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS_BY_GRPC_CODE.get(self.code, 500)


def invalid_argument(message: str) -> ServingRequestError:
    return ServingRequestError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingRequestError:
    return ServingRequestError(grpc.StatusCode.NOT_FOUND, message)
