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

    def _write_pki(self) -> None:
        ca_key = _key()
        ca_name = _name("wfs-test-ca")
        ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
        server_key = _key()
        sans: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        ]
        server = _cert(_name("kube-apiserver"), server_key, ca_name, ca_key, sans=sans)
        admin_key = _key()
        admin = _cert(_name("admin", "system:masters"), admin_key, ca_name, ca_key)
        sa_key = _key()
        files = {
            "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
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

    def _spawn(self, name: str, args: list[str]) -> None:
        self.procs.append(Process([str(cache_bin() / name), *args], log=self.dir / f"{name}.log", append=False))

    def start(self) -> None:
        self._write_pki()
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
        d = self.dir
        self._spawn(
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
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
                "--service-cluster-ip-range",
                "10.0.0.0/24",
                "--authorization-mode",
                "RBAC",
                "--service-account-issuer",
                AUDIENCE,
                "--api-audiences",
                AUDIENCE,
                "--service-account-key-file",
                str(d / "sa.pub"),
                "--service-account-signing-key-file",
                str(d / "sa.key"),
                "--disable-admission-plugins",
                "ServiceAccount",
                "--allow-privileged=true",
                "--v=0",
            ],
        )
        context = ssl.create_default_context(cafile=str(d / "ca.crt"))
        context.load_cert_chain(str(d / "admin.crt"), str(d / "admin.key"))
        apiserver = self.procs[-1]
        wait_until(
            lambda: http_ok(f"{self.server}/readyz", ssl_context=context),
            seconds=120,
            alive=lambda: all(proc.running() for proc in self.procs),
            describe=lambda: "\n".join(proc.tail(2000) for proc in self.procs),
            what=apiserver.name,
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
