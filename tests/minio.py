"""A real MinIO server on loopback, built from its Go module by scripts/bootstrap."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from workflow_streams.localpg import free_port

ACCESS_KEY = "wfs-test-access"
SECRET_KEY = "wfs-test-secret-key-0476"


def minio_binary() -> Path | None:
    cache = Path(os.environ.get("WFS_CACHE", Path.home() / ".cache" / "workflow-streams"))
    for candidate in (os.environ.get("WFS_MINIO_BIN"), cache / "bin" / "minio", shutil.which("minio")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


class MinioServer:
    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.port = free_port()
        self.console_port = free_port()
        self.data = Path(tempfile.mkdtemp(prefix="wfs-minio-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "MINIO_ROOT_USER": ACCESS_KEY,
            "MINIO_ROOT_PASSWORD": SECRET_KEY,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
        }
        self._log = (self.data.parent / f"{self.data.name}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                "server",
                "--quiet",
                "--address",
                f"127.0.0.1:{self.port}",
                "--console-address",
                f"127.0.0.1:{self.console_port}",
                str(self.data),
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            assert self.proc.poll() is None, "minio exited during start-up"
            time.sleep(0.1)
        raise RuntimeError("minio did not become ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self._log.close()
        shutil.rmtree(self.data, ignore_errors=True)
