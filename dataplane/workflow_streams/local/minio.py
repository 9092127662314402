"""A real MinIO server on loopback (``minio`` built into the tool cache by ``scripts/bootstrap``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from ..localpg import free_port
from . import find_binary

ACCESS_KEY = "wfs-test-access"
SECRET_KEY = "wfs-test-secret-key-0476"


def minio_binary() -> Path | None:
    return find_binary("minio", "WFS_MINIO_BIN")


class MinioServer:
    """``data``: where objects live (default: a temporary directory, removed by ``stop``)."""

    def __init__(self, binary: Path, data: Path | None = None, port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.console_port = free_port()
        self._own_data = data is None
        self.data = data or Path(tempfile.mkdtemp(prefix="wfs-minio-"))
        self.log_path = self.data.parent / f"{self.data.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def region_config(self, bucket: str) -> dict[str, object]:
        """One ``WFS_S3_REGIONS`` entry on this server."""
        return {
            "endpoint_url": self.endpoint,
            "bucket": bucket,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "create_bucket": True,
        }

    def start(self, timeout: float = 60.0) -> None:
        env = {
            **os.environ,
            "MINIO_ROOT_USER": ACCESS_KEY,
            "MINIO_ROOT_PASSWORD": SECRET_KEY,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
        }
        self.data.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"minio exited during start-up; log in {self.log_path}")
            time.sleep(0.1)
        raise RuntimeError(f"minio did not become ready; log in {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self._log is not None:
            self._log.close()
        if self._own_data:
            shutil.rmtree(self.data, ignore_errors=True)
            self.log_path.unlink(missing_ok=True)
