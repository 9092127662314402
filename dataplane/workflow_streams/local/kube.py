"""A real Kubernetes control plane on one machine, the envtest way: etcd and kube-apiserver as local
processes, built into the tool cache by ``scripts/bootstrap controlplane``.

The API server runs with RBAC and service-account token issuing, so tests (and ``workflow-streams
dev --kube``) can act as real service accounts through kubectl. Used by the tests and by ``dev``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from . import cache_bin, checkout_file
from .postgres import free_port
from .process import Process, http_ok, wait_until

CACHE_BIN = cache_bin()
AUDIENCE = "https://kubernetes.default.svc.cluster.local"


class KubectlError(AssertionError):
    """A kubectl command failed (an AssertionError, so a test reads it as a failed expectation)."""


def crds_dir() -> Path | None:
    """The CustomResourceDefinitions: ``crds/`` of the checkout, or their copy in the wheel."""
    return checkout_file("crds", "_crds")


def binaries_present() -> bool:
    return all((cache_bin() / name).is_file() for name in ("etcd", "kube-apiserver")) and bool(shutil.which("kubectl"))


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject: x509.Name,
    key: rsa.RSAPrivateKey,
    issuer: x509.Name,
    issuer_key: rsa.RSAPrivateKey,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


class ControlPlane:
    """``directory``: certificates, kubeconfig, etcd data and logs (default: a new temporary one)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or Path(tempfile.mkdtemp(prefix="wfs-kube-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.etcd_port, self.etcd_peer_port, self.port = free_port(), free_port(), free_port()
        self.procs: list[Process] = []
        self.kubeconfig = self.dir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    ca_name = "wfs-test-ca"

    def _server_sans(self) -> list[x509.GeneralName]:
        """The names the API server's certificate holds: how its clients reach it."""
        return [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        ]

    def _write_pki(self) -> None:
        ca_key = _key()
        ca_name = _name(self.ca_name)
        ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
        server_key = _key()
        server = _cert(_name("kube-apiserver"), server_key, ca_name, ca_key, sans=self._server_sans())
        admin_key = _key()
        admin = _cert(_name("admin", "system:masters"), admin_key, ca_name, ca_key)
        sa_key = _key()
        files = {
            "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
            "ca.key": _pem_key(ca_key),  # a controller manager signs with it
            "server.crt": server.public_bytes(serialization.Encoding.PEM),
            "server.key": _pem_key(server_key),
            "admin.crt": admin.public_bytes(serialization.Encoding.PEM),
            "admin.key": _pem_key(admin_key),
            "sa.key": _pem_key(sa_key),
            "sa.pub": sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        }
        for name, content in files.items():
            (self.dir / name).write_bytes(content)
            (self.dir / name).chmod(0o600)
        self.write_kubeconfig(
            self.kubeconfig,
            user={"client-certificate": str(self.dir / "admin.crt"), "client-key": str(self.dir / "admin.key")},
        )

    def write_kubeconfig(self, path: Path, user: dict[str, str]) -> Path:
        import yaml

        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "test", "cluster": {"server": self.server, "certificate-authority": str(self.dir / "ca.crt")}}
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user", "namespace": "default"}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    @property
    def logs_dir(self) -> Path:
        return self.dir

    def _spawn(self, name: str, args: list[str], binary: str | None = None) -> Process:
        """One of the cluster's commands (from the tool cache unless ``binary`` says), logged as ``name``."""
        process = Process(
            [binary or str(cache_bin() / name), *args], log=self.logs_dir / f"{name}.log", append=False, name=name
        )
        self.procs.append(process)
        return process

    def _admin_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        context.load_cert_chain(str(self.dir / "admin.crt"), str(self.dir / "admin.key"))
        return context

    def _start_etcd(self) -> None:
        self._spawn(
            "etcd",
            [
                "--data-dir",
                str(self.dir / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{self.etcd_peer_port}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )

    def _start_apiserver(
        self, *, address: str, service_cidr: str, authorization: str, more: list[str], seconds: float
    ) -> None:
        """kube-apiserver on ``address`` with RBAC and service-account tokens (``more`` flags besides),
        waited for until it is ready."""
        d = self.dir
        apiserver = self._spawn(
            "kube-apiserver",
            [
                "--etcd-servers",
                f"http://127.0.0.1:{self.etcd_port}",
                "--cert-dir",
                str(d),
                "--tls-cert-file",
                str(d / "server.crt"),
                "--tls-private-key-file",
                str(d / "server.key"),
                "--client-ca-file",
                str(d / "ca.crt"),
                "--secure-port",
                str(self.port),
                "--bind-address",
                address,
                "--advertise-address",
                address,
                "--service-cluster-ip-range",
                service_cidr,
                "--authorization-mode",
                authorization,
                "--service-account-issuer",
                AUDIENCE,
                "--api-audiences",
                AUDIENCE,
                "--service-account-key-file",
                str(d / "sa.pub"),
                "--service-account-signing-key-file",
                str(d / "sa.key"),
                *more,
                "--allow-privileged=true",
                "--v=0",
            ],
        )
        context = self._admin_context()
        wait_until(
            lambda: http_ok(f"{self.server}/readyz", ssl_context=context),
            seconds=seconds,
            alive=lambda: all(proc.running() for proc in self.procs),
            describe=lambda: "\n".join(proc.tail(2000) for proc in self.procs),
            what=apiserver.name,
        )

    def start(self) -> None:
        self._write_pki()
        self._start_etcd()
        # no controller manager runs here to make the ServiceAccounts that admission would require
        self._start_apiserver(
            address="127.0.0.1",
            service_cidr="10.0.0.0/24",
            authorization="RBAC",
            more=["--disable-admission-plugins", "ServiceAccount"],
            seconds=120,
        )

    def kubectl(
        self, *args: str, input: str | None = None, kubeconfig: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig or self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def install_crds(self) -> None:
        """The project's CRDs, established, and the cluster-wide Kopf peering the operator expects."""
        crds = crds_dir()
        if crds is None:
            raise RuntimeError("the CRDs are not found (neither crds/ of a checkout nor in the package)")
        self.kubectl("apply", "-f", str(crds))
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(grace=10)
        shutil.rmtree(self.dir, ignore_errors=True)
