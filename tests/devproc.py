"""``workflow-streams dev`` as a process, driven from the outside as a user would."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from workflow_streams.localpg import free_port


class DevProcess:
    def __init__(self, workdir: Path, *args: str, token: str | None = "dev-secret", **env: str) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.data_dir = workdir / "dev-data"
        self.log_path = workdir / "dev.log"
        self._log = self.log_path.open("wb")
        command = [sys.executable, "-m", "workflow_streams.cli", "dev", "--port", str(self.port)]
        command += ["--data-dir", str(self.data_dir), *args]
        if token is not None:
            command += ["--token", token]
        # no WFS_* of the caller's shell: dev's defaults, then exactly what the test says
        base = {k: v for k, v in os.environ.items() if not k.startswith("WFS_") or k in ("WFS_CACHE", "WFS_PG_BINDIR")}
        self.proc = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env={**base, **env}, cwd=workdir
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"{self.url}/api/workflow-streams"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, seconds: float = 180.0) -> None:
        """Until dev has printed that it is ready and /readyz answers."""
        deadline = time.monotonic() + seconds
        while "workflow-streams dev: ready" not in self.output():
            assert self.proc.poll() is None, f"dev exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"dev never became ready:\n{self.output()}"
            time.sleep(0.1)
        with urllib.request.urlopen(f"{self.url}/readyz", timeout=5) as resp:
            assert resp.status == 200

    def wait_for_output(self, pattern: str, seconds: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + seconds
        while True:
            found = re.search(pattern, self.output())
            if found:
                return found
            assert self.proc.poll() is None, f"dev exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"{pattern!r} never appeared:\n{self.output()[-4000:]}"
            time.sleep(0.1)

    def token(self) -> str:
        found = re.search(r"dev token \(principal 'dev'\): (\S+)", self.output())
        assert found, self.output()
        return found[1]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def wait_http_ok(url: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        assert time.monotonic() < deadline, f"{url} never answered 200"
        time.sleep(0.1)
