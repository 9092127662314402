"""``workflow-streams serve`` as a separate OS process, configured through its environment."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from workflow_streams.localpg import free_port


class Replica:
    """``workflow-streams serve`` as a separate OS process."""

    def __init__(self, database_url: str, log_path: Path, port: int | None = None, **env_overrides: str) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._log = log_path.open("ab")
        env = {
            **os.environ,
            "WFS_DATABASE_URL": database_url,
            "WFS_PORT": str(self.port),
            "WFS_TOKENS": json.dumps({"tok-alice": "alice"}),
            "WFS_PRUNE_INTERVAL_SECONDS": "0",
            "WFS_WORKERS": "1",  # one process, so kill() is a crash of the whole replica
            **env_overrides,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workflow_streams.cli", "serve"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.base = f"http://127.0.0.1:{self.port}"

    async def ready(self, session: aiohttp.ClientSession) -> None:
        for _ in range(200):
            try:
                async with session.get(f"{self.base}/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert self.proc.poll() is None, self.log_path.read_text()
            await asyncio.sleep(0.05)
        raise AssertionError("replica never became ready")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def rss_bytes(self) -> int:
        """Resident memory of the process, from /proc."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")
