"""``workflow-streams serve`` as a separate OS process, configured through its environment."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from workflow_streams.local.postgres import free_port
from workflow_streams.local.process import Process, workflow_streams


class Replica:
    """``workflow-streams serve`` as a separate OS process."""

    def __init__(self, database_url: str, log_path: Path, port: int | None = None, **env_overrides: str) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        env = {
            **os.environ,
            "WFS_DATABASE_URL": database_url,
            "WFS_PORT": str(self.port),
            "WFS_TOKENS": json.dumps({"tok-alice": "alice"}),
            "WFS_PRUNE_INTERVAL_SECONDS": "0",
            "WFS_WORKERS": "1",  # one process, so kill() is a crash of the whole replica
            "WFS_REGION": "eu-west-1",  # the region the test streams pin for client egress and logs
            **env_overrides,
        }
        self.process = Process(workflow_streams("serve"), log=log_path, env=env, name="replica")
        self.base = f"http://127.0.0.1:{self.port}"

    async def ready(self, session: aiohttp.ClientSession | None = None) -> None:
        """Until /readyz answers 200 (``session`` is accepted for the callers that pass theirs)."""
        await self.process.ready(f"{self.base}/readyz", seconds=30)

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop(grace=10)

    def rss_bytes(self) -> int:
        """Resident memory of the process, from /proc."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


@contextlib.asynccontextmanager
async def running(replicas: list[Replica]) -> AsyncIterator[list[Replica]]:
    """``replicas``, each ready; all stopped when the block ends, however it ends."""
    try:
        for replica in replicas:
            await replica.ready()
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()
