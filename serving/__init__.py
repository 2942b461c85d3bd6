"""TF Serving's model repository layout, clients and the local serving tools."""
from collections.abc import Iterable
from dataclasses import dataclass

# TF Serving's own defaults, shared by the server and the command line without importing TensorFlow.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_REST_PORT = 8501
DEFAULT_GRPC_PORT = 8500
DEFAULT_MAX_BATCH_SIZE = 1024
# TF Serving's own ports inside a serving pod, behind `mlops log-proxy` on the two above (k8s/serving/base).
DEFAULT_UPSTREAM_REST = "127.0.0.1:9501"
DEFAULT_UPSTREAM_GRPC = "127.0.0.1:9500"
# TF Serving's defaults for --max_num_load_retries and --load_retry_interval_micros (in seconds here).
DEFAULT_MAX_NUM_LOAD_RETRIES = 5
DEFAULT_LOAD_RETRY_INTERVAL_S = 60.0
# The header (and gRPC metadata key) the rollout's verifier marks its golden requests with, and its value: the
# servers and `mlops log-proxy` leave them out of the request logs, so `mlops monitor` judges users' requests alone.
TRAFFIC_HEADER = "x-mlops-traffic"
VERIFIER_TRAFFIC = "verifier"


# The request id Envoy gives every request it routes (x-request-id, generated unless trusted from a client) and keeps on
# the copy a RequestMirror sends: the servers keep each answer under it, so the shadow step joins the candidate's
# answer to a request with stable's (serving/server/answers.py).
REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_CHARS = 128


def request_id(headers: Iterable[tuple[str | bytes, str | bytes]]) -> str:
    """A request's id from its headers or gRPC metadata ("" without one), cut at MAX_REQUEST_ID_CHARS."""
    for name, value in headers:
        name = name.decode("latin-1") if isinstance(name, bytes) else name
        if name.lower() == REQUEST_ID_HEADER:
            value = value.decode("latin-1") if isinstance(value, bytes) else value
            return value.strip()[:MAX_REQUEST_ID_CHARS]
    return ""


def is_verifier(headers: Iterable[tuple[str | bytes, str | bytes]]) -> bool:
    """Whether a request's headers (HTTP or gRPC metadata pairs, bytes or text) mark it as the verifier's."""
    for name, value in headers:
        name = name.decode("latin-1") if isinstance(name, bytes) else name
        if name.lower() == TRAFFIC_HEADER:
            value = value.decode("latin-1") if isinstance(value, bytes) else value
            if value.strip().lower() == VERIFIER_TRAFFIC:
                return True
    return False


@dataclass(frozen=True)
class ServingLimits:
    """The server's bounds on one request and on all requests in flight; the defaults suit a laptop."""

    max_request_bytes: int = 64 * 1024 * 1024  # a REST body (however framed) or a gRPC message
    max_in_flight_requests: int = 256  # both transports together; more get UNAVAILABLE / HTTP 503
    max_in_flight_bytes: int = 256 * 1024 * 1024  # request bytes held by requests in flight
    max_connections: int = 1024  # REST connections; requests on more get HTTP 503 and the connection closes
    backlog: int = 1024  # REST listen queue (connections the kernel completes before the server accepts them)
    max_header_bytes: int = 64 * 1024  # REST request line plus headers
    header_timeout_s: float = 10.0  # from a connection's (or request's) first byte to the end of its headers
    body_timeout_s: float = 60.0  # to receive a whole REST body once its headers are in
    keep_alive_timeout_s: float = 30.0  # an idle keep-alive REST connection is closed after this
    inline_bytes: int = 256 * 1024  # requests larger than this are parsed on a worker thread, not the event loop

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value <= 0:
                raise ValueError(f"ServingLimits.{name} must be positive, got {value}.")
