"""The one launcher of child processes for ``workflow-streams dev``, the tests and the benchmark.

A ``Process`` starts a command with a given environment, writes its output to a file (read back for
readiness and for failure messages), waits until it is ready (a URL answers 200, or a line appears in its
output) while failing at once if it exits, and stops it with a signal, then SIGKILL after a grace period.
Started from the main thread, the child is also killed when this process dies (PR_SET_PDEATHSIG), so an
interrupted test run or dev session leaves no servers behind.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# Resolved before any fork: the child runs only this call between fork and exec.
_prctl = getattr(ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True), "prctl", None)
# Readiness is asked of local servers only: a caller's HTTP(S)_PROXY must not route 127.0.0.1 elsewhere.
_NO_PROXY = urllib.request.ProxyHandler({})


class ProcessExited(RuntimeError):
    """The process ended while it was awaited (its output's tail is in the message)."""


class NotReady(TimeoutError):
    """The process was still running but not ready when the wait ran out."""


def workflow_streams(*args: str) -> list[str]:
    """The ``workflow-streams`` command of this very interpreter (the installed script may be another's)."""
    return [sys.executable, "-m", "workflow_streams", *args]


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def http_ok(url: str, *, ssl_context: ssl.SSLContext | None = None, timeout: float = 2.0) -> bool:
    """Whether ``url`` answers 200 now; no answer at all counts as not yet."""
    handlers: list[urllib.request.BaseHandler] = [_NO_PROXY]
    if ssl_context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=ssl_context))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def listening_sockets(port: int) -> int:
    """Sockets listening on ``port`` on this machine (each ``serve`` worker has its own, SO_REUSEPORT),
    from /proc/net (Linux)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                count += 1
    return count


def wait_until(
    ready: Callable[[], bool],
    *,
    seconds: float,
    alive: Callable[[], bool] = lambda: True,
    describe: Callable[[], str] = lambda: "",
    what: str = "the process",
    interval: float = 0.1,
) -> None:
    """Poll ``ready`` until it holds; raise ProcessExited as soon as ``alive`` says no, NotReady after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not ready():
        if not alive():
            raise ProcessExited(f"{what} exited before it was ready:\n{describe()}")
        if time.monotonic() >= deadline:
            raise NotReady(f"{what} was not ready within {seconds:g} s:\n{describe()}")
        time.sleep(interval)


class Process:
    """One child process; its output goes to ``log`` (appended, so a restart keeps the earlier lines)."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        append: bool = True,
        name: str | None = None,
    ) -> None:
        self.command = list(command)
        self.name = name or Path(self.command[0]).name
        self.log_path = log
        self._log = log.open("ab" if append else "wb")
        # PDEATHSIG fires when the *thread* that forked exits: only the main thread lives as long as we do.
        on_main_thread = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                self.command,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if on_main_thread else None,
            )
        except BaseException:
            self._log.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, chars: int = 4000) -> str:
        return f"(log: {self.log_path})\n{self.output()[-chars:]}"

    def wait_ready(self, url: str, *, seconds: float = 60.0, ssl_context: ssl.SSLContext | None = None) -> None:
        """Until ``url`` answers 200."""
        wait_until(
            lambda: http_ok(url, ssl_context=ssl_context),
            seconds=seconds,
            alive=self.running,
            describe=self.tail,
            what=self.name,
        )

    async def ready(self, url: str, *, seconds: float = 60.0) -> None:
        """``wait_ready`` for a caller on an event loop (the polling runs in a thread)."""
        await asyncio.to_thread(self.wait_ready, url, seconds=seconds)

    def wait_for_output(self, pattern: str, *, seconds: float = 60.0) -> re.Match[str]:
        """Until ``pattern`` (a regular expression) appears in the output; returns the first match."""
        found: list[re.Match[str]] = []

        def appeared() -> bool:
            match = re.search(pattern, self.output())
            if match:
                found.append(match)
            return match is not None

        wait_until(appeared, seconds=seconds, alive=self.running, describe=self.tail, what=f"{self.name} ({pattern!r})")
        return found[0]

    def send_signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL, as a crash would; the log stays open for a ``stop`` or a later restart's reading."""
        self.proc.kill()
        self.proc.wait()

    def stop(self, signum: int = signal.SIGTERM, *, grace: float = 15.0) -> int:
        """``signum``, then SIGKILL if it has not ended within ``grace`` seconds; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
