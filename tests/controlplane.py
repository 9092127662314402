"""A real Kubernetes control plane for tests, the envtest way: etcd and kube-apiserver as local processes.

Both are built from their Go modules by scripts/bootstrap. The API server runs with RBAC and
service-account token issuing, so tests can act as real service accounts through kubectl.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from workflow_streams.localpg import free_port

CACHE_BIN = Path(os.environ.get("WFS_CACHE", Path.home() / ".cache" / "workflow-streams")) / "bin"
AUDIENCE = "https://kubernetes.default.svc.cluster.local"


def binaries_present() -> bool:
    return all((CACHE_BIN / name).is_file() for name in ("etcd", "kube-apiserver")) and bool(shutil.which("kubectl"))


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
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="wfs-kube-"))
        self.etcd_port, self.etcd_peer_port, self.port = free_port(), free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
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
        log = (self.dir / f"{name}.log").open("wb")
        self._logs.append(log)
        self.procs.append(subprocess.Popen([str(CACHE_BIN / name), *args], stdout=log, stderr=subprocess.STDOUT))

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
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"control plane process exited; logs in {self.dir}")
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready; logs in {self.dir}")

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
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def kind_available() -> bool:
    """kind needs a Docker engine; the client alone (as on CI machines) is not enough."""
    if not (shutil.which("kind") and shutil.which("docker")):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


class KindPlane(ControlPlane):
    """The same interface on a kind cluster (pytest-kind), where Docker and kind exist."""

    def __init__(self) -> None:
        super().__init__()
        from pytest_kind import KindCluster

        self.cluster = KindCluster(f"wfs-{self.port}", kind_path=Path(shutil.which("kind") or "kind"))

    @property
    def server(self) -> str:
        import yaml

        config = yaml.safe_load(self.kubeconfig.read_text())
        return str(config["clusters"][0]["cluster"]["server"])

    def start(self) -> None:
        self.cluster.create()
        self.kubeconfig = Path(self.cluster.kubeconfig_path)

    def write_kubeconfig(self, path: Path, user: dict[str, str]) -> Path:
        import yaml

        config = yaml.safe_load(self.kubeconfig.read_text())
        config["users"] = [{"name": "user", "user": user}]
        config["contexts"] = [
            {
                "name": "test",
                "context": {"cluster": config["clusters"][0]["name"], "user": "user", "namespace": "default"},
            }
        ]
        config["current-context"] = "test"
        path.write_text(yaml.safe_dump(config))
        return path

    def stop(self) -> None:
        self.cluster.delete()
        shutil.rmtree(self.dir, ignore_errors=True)


def sign_service_account_token(
    key_pem: bytes, namespace: str, name: str, uid: str, audience: str, expires_in: int
) -> str:
    """A service-account JWT shaped like the API server's own, signed with ``key_pem``. With the
    control plane's signing key and a past expiry it is a genuinely expired token; with another key,
    a forgery."""
    import base64
    import json as _json

    from cryptography.hazmat.primitives.asymmetric import padding

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    now = int(time.time())
    claims = {
        "iss": AUDIENCE,
        "sub": f"system:serviceaccount:{namespace}:{name}",
        "aud": [audience],
        "iat": now - 3600,
        "nbf": now - 3600,
        "exp": now + expires_in,
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": uid}},
    }
    signing_input = f"{b64(_json.dumps({'alg': 'RS256', 'typ': 'JWT'}).encode())}.{b64(_json.dumps(claims).encode())}"
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{b64(signature)}"
