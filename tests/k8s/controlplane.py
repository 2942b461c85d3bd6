"""A real Kubernetes control plane for the tests: etcd and kube-apiserver (v1.34.3, built from source by
`make controlplane`, tools/controlplane/build.sh) on free loopback ports, with generated certificates, an admin client
certificate in system:masters, a service-account signing key, the Node and RBAC authorizers and the API server's
default admission plugins (PodSecurity among them), and the CRDs the manifests under k8s/ use installed and
Established. One per test session (the `control_plane` fixture of tests/conftest.py)."""
from __future__ import annotations

import ctypes
import datetime
import ipaddress
import json
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "controlplane"
BIN = CACHE / "bin"
CRDS = CACHE / "crds"
KUBECTL = REPO / ".venv-tools" / "bin" / "kubectl"
# KubeDL's CRDs: the Go module proxy does not serve github.com/alibaba/kubedl (nor kubedl-io/kubedl) at any version
# (403 "not available"), so they are rebuilt from the schemas tests/fixtures/crds/extract.py took from KubeDL b93a2b4.
KUBEDL_FIXTURES = REPO / "tests" / "fixtures" / "crds"
KUBEDL_CRDS = {"inference.serving.kubedl.io.json": "inferences", "modelversion.model.kubedl.io.json": "modelversions",
               "tfjob.training.kubedl.io.json": "tfjobs"}
SERVICE_CIDR = "10.96.0.0/16"
READY_TIMEOUT_S = 180


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills it when the test process dies, even by SIGKILL (a CI
    timeout), so no etcd or API server outlives the session (prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _certificate(subject: x509.Name, key, issuer: x509.Name, issuer_key, *, ca: bool = False,
                 names: list[str] = (), ips: list[str] = (), client: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                                        critical=True)
    else:
        usage = x509.ExtendedKeyUsageOID.CLIENT_AUTH if client else x509.ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if names or ips:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def write_pki(folder: Path) -> None:
    """A CA, the API server's serving certificate, the admin's client certificate (system:masters) and the
    service-account signing key, as PEM files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("tfx-mlops-test-ca")
    ca = _certificate(ca_name, ca_key, ca_name, ca_key, ca=True)
    service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
    server_key = _key()
    server = _certificate(_name("kube-apiserver"), server_key, ca_name, ca_key, ips=["127.0.0.1", service_ip],
                          names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                 "kubernetes.default.svc.cluster.local"])
    admin_key = _key()
    admin = _certificate(_name("admin", "system:masters"), admin_key, ca_name, ca_key, client=True)
    service_account_key = _key()
    files = {"ca.crt": ca.public_bytes(serialization.Encoding.PEM), "ca.key": _pem_key(ca_key),
             "apiserver.crt": server.public_bytes(serialization.Encoding.PEM), "apiserver.key": _pem_key(server_key),
             "admin.crt": admin.public_bytes(serialization.Encoding.PEM), "admin.key": _pem_key(admin_key),
             "sa.key": _pem_key(service_account_key),
             "sa.pub": service_account_key.public_key().public_bytes(
                 serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)}
    for name, data in files.items():
        (folder / name).write_bytes(data)
        (folder / name).chmod(0o600)


def kubedl_crd(fixture: Path, plural: str) -> dict:
    """A CustomResourceDefinition rebuilt from an extract.py record (schemas without descriptions)."""
    record = json.loads(fixture.read_text())
    kind, group = record["kind"], record["group"]
    versions = [{"name": name, "served": True, "storage": i == 0, "schema": {"openAPIV3Schema": schema},
                 "subresources": {"status": {}}} for i, (name, schema) in enumerate(sorted(record["versions"].items()))]
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}", "annotations": {"tfx-mlops/source": record["source"]}},
            "spec": {"group": group, "scope": "Namespaced", "versions": versions,
                     "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                               "singular": kind.lower()}}}


class ControlPlane:
    """etcd and kube-apiserver as child processes; `kubeconfig` is the admin's."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.pki = folder / "pki"
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.kubeconfig = folder / "kubeconfig"
        self.port = 0
        self.startup_seconds = 0.0

    # Lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        missing = [b for b in ("etcd", "kube-apiserver") if not (BIN / b).exists()]
        if missing or not CRDS.is_dir():
            pytest.fail(f"{', '.join(missing) or 'the CRDs'} missing under {CACHE}: run `make controlplane` "
                        "(it builds the test control plane from tools/controlplane).")
        if not KUBECTL.exists():
            pytest.fail(f"{KUBECTL} is missing: run `make setup` (it builds .venv-tools from requirements-tools.lock).")
        began = time.monotonic()
        write_pki(self.pki)
        etcd_port, etcd_peer_port, self.port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn("etcd", [
            str(BIN / "etcd"), "--name=test", f"--data-dir={self.folder / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}",
            f"--initial-cluster=test=http://127.0.0.1:{etcd_peer_port}",
            # A test cluster's data need not survive a power cut; fsync on a busy disk slows every write.
            "--unsafe-no-fsync", "--log-level=warn"])
        self._spawn("kube-apiserver", [
            str(BIN / "kube-apiserver"), f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={self.pki / 'apiserver.crt'}", f"--tls-private-key-file={self.pki / 'apiserver.key'}",
            f"--client-ca-file={self.pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.pki / 'sa.pub'}",
            f"--service-account-signing-key-file={self.pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
            # The default plugins (PodSecurity, ServiceAccount, LimitRanger, ResourceQuota, ...) plus kubeadm's.
            "--enable-admission-plugins=NodeRestriction", "--profiling=false",
            f"--cert-dir={self.folder / 'apiserver-certs'}"])
        self._write_kubeconfig()
        self._wait_ready()
        self._install_crds()
        self.startup_seconds = time.monotonic() - began

    def start_controller_manager(self, controllers: tuple[str, ...] = (
            "serviceaccount-controller", "serviceaccount-token-controller", "root-ca-certificate-publisher-controller",
            "deployment-controller", "replicaset-controller", "job-controller", "garbage-collector-controller"),
    ) -> None:
        """kube-controller-manager with only `controllers` (Deployments make ReplicaSets make Pods, Jobs make
        Pods; no kubelet runs them, so a test writes the pods' status itself); at most once per control plane."""
        if "kube-controller-manager" in self.processes:
            return
        if not (BIN / "kube-controller-manager").exists():
            pytest.fail(f"kube-controller-manager is missing under {BIN}: run `make controlplane`.")
        self._spawn("kube-controller-manager", [
            str(BIN / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false",
            f"--controllers={','.join(controllers)}", f"--root-ca-file={self.pki / 'ca.crt'}",
            f"--service-account-private-key-file={self.pki / 'sa.key'}", "--use-service-account-credentials=false",
            f"--cert-dir={self.folder / 'controller-manager-certs'}"])

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()

    def _spawn(self, name: str, command: list[str]) -> None:
        log = self.folder / f"{name}.log"
        self.logs[name] = log
        with log.open("wb") as out:
            self.processes[name] = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def log_tail(self, name: str, lines: int = 30) -> str:
        return "\n".join(self.logs[name].read_text(errors="replace").splitlines()[-lines:])

    def _write_kubeconfig(self) -> None:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
                  "clusters": [{"name": "test", "cluster": {"server": self.server,
                                                            "certificate-authority": str(self.pki / "ca.crt")}}],
                  "users": [{"name": "admin", "user": {"client-certificate": str(self.pki / "admin.crt"),
                                                        "client-key": str(self.pki / "admin.key")}}],
                  "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}]}
        self.kubeconfig.write_text(yaml.safe_dump(config))

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _wait_ready(self) -> None:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError as error:
                last = str(error)
            time.sleep(0.5)
        raise RuntimeError(f"kube-apiserver not ready in {READY_TIMEOUT_S} s ({last}):\n"
                           f"{self.log_tail('kube-apiserver')}")

    def _install_crds(self) -> None:
        crds = sorted(CRDS.glob("*.yaml"))
        kubedl = [kubedl_crd(KUBEDL_FIXTURES / f, plural) for f, plural in KUBEDL_CRDS.items()]
        self.kubectl("apply", "--server-side", *[a for c in crds for a in ("-f", str(c))])
        self.kubectl("apply", "--server-side", "-f", "-",
                     input=yaml.safe_dump_all(kubedl))
        self.kubectl("wait", "--for=condition=Established", "--timeout=120s", "crd", "--all")

    # Use ---------------------------------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                as_user: str | None = None) -> subprocess.CompletedProcess:
        command = [str(KUBECTL), f"--kubeconfig={self.kubeconfig}", *args]
        if as_user:
            command.append(f"--as={as_user}")
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def wait_for(self, kind: str, name: str, namespace: str, timeout_s: float = 120) -> None:
        """Until the object exists (a controller creates it)."""
        deadline = time.monotonic() + timeout_s
        while self.kubectl("get", kind, name, "-n", namespace, check=False).returncode != 0:
            for process_name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{process_name} exited with {process.returncode}:\n"
                                       f"{self.log_tail(process_name)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {kind} {namespace}/{name} after {timeout_s} s")
            time.sleep(0.5)

    def namespace(self, name: str) -> None:
        """Creates a namespace the manifests expect but do not create, labelled for the restricted Pod Security
        Standard as docs/tutorials/kubernetes.md tells users to label theirs."""
        labels = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")}
        self.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}))

    def api_client(self):
        """The official Python client, as the admin."""
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig))


def start_control_plane() -> ControlPlane:
    plane = ControlPlane(Path(tempfile.mkdtemp(prefix="controlplane-")))
    try:
        plane.start()
    except BaseException:
        plane.stop()
        raise
    return plane


def remove(plane: ControlPlane) -> None:
    plane.stop()
    shutil.rmtree(plane.folder, ignore_errors=True)
