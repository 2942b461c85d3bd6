"""A Google Cloud Storage emulator that TensorFlow's built-in gs:// file system and Beam's gcsio both talk to.

`gcp-storage-emulator` (PyPI) serves the GCS JSON, upload, batch and XML APIs over plain HTTP on 127.0.0.1. Beam's
gcsio (google-cloud-storage) reaches it through STORAGE_EMULATOR_HOST. TensorFlow's own GCS client has no endpoint
setting: it always calls https://www.googleapis.com and https://storage.googleapis.com. It does honour libcurl's
`https_proxy` and `CURL_CA_BUNDLE`, so this module also runs a proxy that accepts the client's CONNECT to those two
hosts, terminates TLS with a certificate from a throw-away CA, and forwards each request to the emulator. Nothing
leaves 127.0.0.1: the proxy only ever connects to the emulator.

The emulator ignores GCS's preconditions (`ifGenerationMatch`), which the model repository on gs:// relies on
(serving/repository/gcs.py), so google-cloud-storage reaches it through a plain-HTTP front that answers an upload
whose precondition fails with 412 Precondition Failed, as GCS does (simple and multipart uploads, copies and
rewrites; a resumable upload passes unchecked).

(tensorflow-io-gcs-filesystem, TF_USE_MODULAR_FILESYSTEM=1, does read CLOUD_STORAGE_EMULATOR_ENDPOINT, but 0.37.1
dereferences unset GCS_* variables and corrupts memory on its first read: see docs/architecture.md.)
"""
from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import logging
import os
import socket
import ssl
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TLS_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}


def _certificates(folder: str) -> tuple[str, str, str]:
    """A CA certificate and a certificate for TLS_HOSTS signed by it; returns (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    validity = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tfx-mlops test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(validity[0]).not_valid_after(validity[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(host) for host in TLS_HOSTS] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TLS_HOSTS[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(validity[0]).not_valid_after(validity[1])
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    paths = tuple(os.path.join(folder, name) for name in ("ca.pem", "cert.pem", "key.pem"))
    with open(paths[0], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(paths[1], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(paths[2], "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return paths


class _Forwarder(BaseHTTPRequestHandler):
    """Handles the HTTP requests inside one TLS tunnel: each goes to the emulator, its answer comes back."""

    protocol_version = "HTTP/1.1"
    emulator: tuple[str, int]
    host: str
    # The client speaks TLS to this forwarder (so upload URLs the emulator builds with http:// become https://).
    tls = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (BaseHTTPRequestHandler's name)
        pass

    def _body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            # TensorFlow's uploads announce both; chunked framing wins (RFC 9112, 6.3).
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if self.command in ("POST", "PUT", "PATCH"):
            return self.rfile.read(length)
        return self.rfile.read(length) if length else None

    def _forward(self) -> None:
        self._relay(self._body())

    def _relay(self, body: bytes | None) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length", "expect"}}
        if body == b"" and "uploadType=media" in self.path:
            # TensorFlow makes a folder by uploading an empty "name/" object; the emulator reads an empty media upload
            # as no data at all, so the same object goes as a multipart upload.
            body = (b"--empty\r\nContent-Type: application/json\r\n\r\n{}\r\n--empty\r\n"
                    b"Content-Type: application/octet-stream\r\n\r\n\r\n--empty--\r\n")
            self.path = self.path.replace("uploadType=media", "uploadType=multipart")
            headers["Content-Type"] = "multipart/related; boundary=empty"
        if body is not None:
            headers["Content-Length"] = str(len(body))
        connection = http.client.HTTPConnection(*self.emulator, timeout=120)
        try:
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() in HOP_BY_HOP or name.lower() == "content-length":
                continue
            if name.lower() == "location" and self.tls:
                # The emulator builds upload URLs from the Host header with its own scheme (http).
                value = value.replace(f"http://{self.host}", f"https://{self.host}")
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _dispatch(self) -> None:
        self._forward()  # looked up on the instance, so a subclass's _forward handles every method

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _dispatch


def _write_precondition(command: str, path: str, headers: Any, body: bytes | None) -> tuple[str, str, int] | None:
    """(bucket, object, required generation) of a simple or multipart upload, or of a copy or rewrite (to the
    destination), with ifGenerationMatch; else None."""
    url = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(url.query)
    parts = [urllib.parse.unquote(part) for part in url.path.split("/")]
    if command != "POST" or "ifGenerationMatch" not in query:
        return None
    required = int(query["ifGenerationMatch"][0])
    # /storage/v1/b/<bucket>/o/<object>/(copyTo|rewriteTo)/b/<bucket>/o/<object>
    if parts[1:4] == ["storage", "v1", "b"] and len(parts) == 12 and parts[7] in ("copyTo", "rewriteTo"):
        return parts[9], parts[11], required
    if parts[1:5] != ["upload", "storage", "v1", "b"]:
        return None
    bucket = parts[5]
    kind = query.get("uploadType", [""])[0]
    if kind == "media":
        name = query["name"][0]
    elif kind == "multipart":
        boundary = headers.get("Content-Type", "").split("boundary=")[1].strip('"').encode()
        metadata = (body or b"").split(b"--" + boundary)[1].split(b"\r\n\r\n", 1)[1]
        name = json.loads(metadata)["name"]
    else:
        return None
    return bucket, name, required


class _PreconditionFront(_Forwarder):
    """Plain HTTP between google-cloud-storage and the emulator: an upload, copy or rewrite whose ifGenerationMatch
    does not hold (0: the object must not exist; N: its generation must be N) is refused with 412, checked and done
    under one lock."""

    tls = False
    lock: threading.Lock

    def _forward(self) -> None:
        body = self._body()
        condition = _write_precondition(self.command, self.path, self.headers, body)
        if condition is None:
            self._relay(body)
            return
        bucket, name, required = condition
        with self.lock:
            if self._generation(bucket, name) != required:
                payload = json.dumps({"error": {"code": 412, "message": "Precondition Failed",
                                                "errors": [{"reason": "conditionNotMet"}]}}).encode()
                self.send_response(412, "Precondition Failed")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            self._relay(body)

    def _generation(self, bucket: str, name: str) -> int:
        """The object's live generation, 0 when it does not exist."""
        url = f"http://{self.emulator[0]}:{self.emulator[1]}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, '')}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                return int(json.load(response)["generation"])
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return 0
            raise


# What the GCE metadata server answers: google-auth (Beam's gcsio) then finds credentials at once, instead of
# probing the real metadata address and retrying for half a minute before connecting anonymously.
SERVICE_ACCOUNT = "emulator@test.iam.gserviceaccount.com"
METADATA = {
    "": "",
    "project/project-id": "test",
    "project/numeric-project-id": "1234",
    "universe/universe-domain": "googleapis.com",
}


def _metadata(key: str) -> str | dict[str, Any] | None:
    """The metadata server's answer for `key` (a path below /computeMetadata/v1/), None when it has none."""
    if key in METADATA:
        return METADATA[key]
    parts = key.rstrip("/").split("/")
    if parts[:2] == ["instance", "service-accounts"] and len(parts) in (3, 4):
        answers = {"token": {"access_token": "emulator", "expires_in": 3600, "token_type": "Bearer"},
                   "email": SERVICE_ACCOUNT, "scopes": "https://www.googleapis.com/auth/cloud-platform",
                   "aliases": "default"}
        if len(parts) == 3:
            return {"email": SERVICE_ACCOUNT, "aliases": ["default"],
                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
        return answers.get(parts[3])
    return None


class _Proxy(BaseHTTPRequestHandler):
    """Accepts CONNECT to the GCS hosts only, and speaks TLS to the client in place of Google; plain GETs are
    answered as the GCE metadata server."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        value = _metadata(path.removeprefix("/computeMetadata/v1/").removeprefix("/"))
        if value is None:
            self.send_error(404)
            return
        body = (value if isinstance(value, str) else json.dumps(value)).encode()
        self.send_response(200)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "text/plain" if isinstance(value, str) else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_CONNECT(self) -> None:  # noqa: N802  (BaseHTTPRequestHandler's naming)
        host = self.path.split(":")[0]
        if host not in TLS_HOSTS:
            self.send_error(403, f"this test proxy only serves {', '.join(TLS_HOSTS)}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        tls = self.server.tls_context.wrap_socket(self.connection, server_side=True)
        forwarder = type("Forwarder", (_Forwarder,), {"emulator": self.server.emulator, "host": host})
        try:
            forwarder(tls, self.client_address, self.server)
        except (ssl.SSLError, ConnectionError):
            pass
        self.close_connection = True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GcsEmulator:
    """The emulator and the TLS proxy, on free loopback ports; `environment()` is what a client process needs."""

    def __init__(self) -> None:
        from gcp_storage_emulator.server import create_server

        # It warns about every response it sends.
        logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
        self._folder = tempfile.TemporaryDirectory(prefix="gcs-emulator-")
        self.port = _free_port()
        self._server = create_server("127.0.0.1", self.port, in_memory=True)
        self._ca, cert, key = _certificates(self._folder.name)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._proxy = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
        self._proxy.daemon_threads = True
        self._proxy.tls_context = context
        self._proxy.emulator = ("127.0.0.1", self.port)
        self._proxy_thread = threading.Thread(target=self._proxy.serve_forever, name="gcs-proxy", daemon=True)
        front = type("Front", (_PreconditionFront,), {"emulator": ("127.0.0.1", self.port), "host": "",
                                                      "lock": threading.Lock()})
        self._front = ThreadingHTTPServer(("127.0.0.1", 0), front)
        self._front.daemon_threads = True
        self._front_thread = threading.Thread(target=self._front.serve_forever, name="gcs-front", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GcsEmulator:
        self._server.start()
        self._proxy_thread.start()
        self._front_thread.start()
        return self

    def stop(self) -> None:
        for server in (self._proxy, self._front):
            server.shutdown()
            server.server_close()
        self._server.stop()
        self._folder.cleanup()

    def __enter__(self) -> GcsEmulator:
        return self.start()

    def __exit__(self, *args: object) -> None:
        self.stop()

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def list_objects(self, bucket: str, prefix: str = "") -> list[str]:
        names, token = [], ""
        while True:
            query = f"prefix={urllib.request.quote(prefix)}&pageToken={token}"
            with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o?{query}", timeout=30) as response:
                page = json.load(response)
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return names

    def environment(self) -> dict[str, str]:
        """Variables that point TensorFlow's gs:// (through the proxy) and Beam's gcsio (directly) here."""
        proxy = f"127.0.0.1:{self._proxy.server_address[1]}"
        return {
            # google-cloud-storage (Beam's gcsio, the gs:// model repository): plain HTTP through the precondition
            # front, anonymous credentials.
            "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{self._front.server_address[1]}",
            # TensorFlow's GCS client: the proxy and a CA it trusts.
            "https_proxy": f"http://{proxy}",
            "CURL_CA_BUNDLE": self._ca,
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
            # Both clients ask the metadata server for a token; it is the proxy, never the real address.
            "GCE_METADATA_HOST": proxy,
            "GCE_METADATA_ROOT": proxy,
            "GCE_METADATA_IP": proxy,
            "GOOGLE_CLOUD_PROJECT": "test",
        }
