"""The test control plane: the package's etcd + kube-apiserver launcher, kind where Docker exists, and
service-account tokens signed like the API server's own.

The launcher lives in ``workflow_streams.local.kube`` because ``workflow-streams dev --kube`` runs
the same control plane; these names are re-exported for the tests.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from workflow_streams.local.kube import AUDIENCE, CACHE_BIN, ControlPlane, _key, _pem_key, binaries_present

__all__ = [
    "AUDIENCE",
    "CACHE_BIN",
    "ControlPlane",
    "KindPlane",
    "_key",
    "_pem_key",
    "binaries_present",
    "kind_available",
    "sign_service_account_token",
]


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
