"""``workflow-streams dev`` as a process, driven from the outside as a user would."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from workflow_streams.local.postgres import free_port
from workflow_streams.local.process import Process, workflow_streams


class DevProcess:
    def __init__(self, workdir: Path, *args: str, token: str | None = "dev-secret", **env: str) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.data_dir = workdir / "dev-data"
        self.log_path = workdir / "dev.log"
        command = workflow_streams("dev", "--port", str(self.port), "--data-dir", str(self.data_dir), *args)
        if token is not None:
            command += ["--token", token]
        # no WFS_* of the caller's shell: dev's defaults, then exactly what the test says
        base = {k: v for k, v in os.environ.items() if not k.startswith("WFS_") or k in ("WFS_CACHE", "WFS_PG_BINDIR")}
        self.process = Process(command, log=self.log_path, env={**base, **env}, cwd=workdir, append=False, name="dev")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"{self.url}/api/workflow-streams"

    def output(self) -> str:
        return self.process.output()

    def wait_ready(self, seconds: float = 180.0) -> None:
        """Until dev has printed that it is ready and /readyz answers."""
        self.process.wait_for_output("workflow-streams dev: ready", seconds=seconds)
        self.process.wait_ready(f"{self.url}/readyz", seconds=5)

    def wait_for_output(self, pattern: str, seconds: float = 60.0) -> re.Match[str]:
        return self.process.wait_for_output(pattern, seconds=seconds)

    def token(self) -> str:
        found = re.search(r"dev token \(principal 'dev'\): (\S+)", self.output())
        assert found, self.output()
        return found[1]

    def stop(self) -> int:
        """Ctrl-C, as a user ends dev; its exit status."""
        return self.process.stop(signal.SIGINT, grace=60)
