"""A real MinIO server on loopback (``minio`` built into the tool cache by ``scripts/bootstrap``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from . import find_binary
from .postgres import free_port
from .process import Process

ACCESS_KEY = "wfs-test-access"
SECRET_KEY = "wfs-test-secret-key-0476"


def minio_binary() -> Path | None:
    return find_binary("minio", "WFS_MINIO_BIN")


class MinioServer:
    """``data``: where objects live (default: a temporary directory, removed by ``stop``); ``host``: the
    address it listens on (the one-node test cluster's pods reach it on the node's address)."""

    def __init__(
        self, binary: Path, data: Path | None = None, port: int | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.binary = binary
        self.host = host
        self.port = port or free_port()
        self.console_port = free_port()
        self._own_data = data is None
        self.data = data or Path(tempfile.mkdtemp(prefix="wfs-minio-"))
        self.log_path = self.data.parent / f"{self.data.name}.log"
        self.process: Process | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

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
        self.process = Process(
            [
                str(self.binary),
                "server",
                "--quiet",
                "--address",
                f"{self.host}:{self.port}",
                "--console-address",
                f"127.0.0.1:{self.console_port}",
                str(self.data),
            ],
            log=self.log_path,
            env=env,
            name="minio",
        )
        self.process.wait_ready(f"{self.endpoint}/minio/health/ready", seconds=timeout)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=10)
        if self._own_data:
            shutil.rmtree(self.data, ignore_errors=True)
            self.log_path.unlink(missing_ok=True)
