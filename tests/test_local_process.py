"""The one process launcher (workflow_streams.local.process): readiness, failure messages, stopping, and
children that die with their parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.waiting import eventually
from workflow_streams.local.postgres import free_port
from workflow_streams.local.process import NotReady, Process, ProcessExited, http_ok

pytestmark = pytest.mark.unit


def python(code: str) -> list[str]:
    return [sys.executable, "-u", "-c", textwrap.dedent(code)]


def test_ready_on_a_url_and_stopped_with_sigterm(tmp_path: Path) -> None:
    port = free_port()
    server = Process(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        log=tmp_path / "http.log",
        cwd=tmp_path,
    )
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/", seconds=30)
        assert http_ok(f"http://127.0.0.1:{port}/")
    finally:
        status = server.stop()
    assert status == -signal.SIGTERM
    assert not http_ok(f"http://127.0.0.1:{port}/", timeout=1)


def test_output_is_captured_and_awaited(tmp_path: Path) -> None:
    proc = Process(python("print('listening on 4711'); import time; time.sleep(60)"), log=tmp_path / "out.log")
    try:
        found = proc.wait_for_output(r"listening on (\d+)", seconds=30)
        assert found[1] == "4711"
        assert "listening on 4711" in proc.output()
    finally:
        proc.stop()


def test_an_early_exit_fails_the_wait_at_once_with_the_output(tmp_path: Path) -> None:
    proc = Process(python("print('no database configured'); raise SystemExit(3)"), log=tmp_path / "out.log")
    with pytest.raises(ProcessExited, match="no database configured"):
        proc.wait_for_output("ready", seconds=600)  # fails on the exit, long before this deadline
    assert proc.stop() == 3


def test_a_process_that_never_gets_ready_is_named_in_the_timeout(tmp_path: Path) -> None:
    proc = Process(python("import time; time.sleep(60)"), log=tmp_path / "out.log", name="sleeper")
    try:
        with pytest.raises(NotReady, match="sleeper"):
            proc.wait_ready(f"http://127.0.0.1:{free_port()}/", seconds=0.3)
    finally:
        proc.stop()


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    code = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('ignoring SIGTERM')
        time.sleep(60)
    """
    proc = Process(python(code), log=tmp_path / "out.log")
    proc.wait_for_output("ignoring SIGTERM", seconds=30)
    assert proc.stop(grace=0.5) == -signal.SIGKILL


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # dead, waiting only for its new parent to reap it


async def test_a_child_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    # an intermediate process starts a child through the launcher, then is killed without any clean-up
    code = f"""
        import sys, time
        from pathlib import Path
        from workflow_streams.local.process import Process
        child = Process([sys.executable, "-c", "import time; time.sleep(120)"], log=Path({str(tmp_path / "c.log")!r}))
        print("child", child.pid, flush=True)
        time.sleep(120)
    """
    parent = Process(python(code), log=tmp_path / "parent.log")
    child_pid = int(parent.wait_for_output(r"child (\d+)", seconds=30)[1])
    assert not _gone(child_pid)
    parent.kill()
    parent.stop()
    await eventually(lambda: _gone(child_pid), message=f"child {child_pid} outlived its parent")


def test_the_environment_and_directory_are_the_callers(tmp_path: Path) -> None:
    proc = Process(
        python("import os; print(os.environ['WFS_PROBE'], os.getcwd())"),
        log=tmp_path / "out.log",
        env={**os.environ, "WFS_PROBE": "probe-value"},
        cwd=tmp_path,
    )
    proc.proc.wait(30)
    assert proc.stop() == 0
    assert proc.output().split() == ["probe-value", str(tmp_path)]


def test_a_missing_binary_is_an_error_at_start(tmp_path: Path) -> None:
    with pytest.raises((FileNotFoundError, subprocess.SubprocessError)):
        Process([str(tmp_path / "no-such-binary")], log=tmp_path / "out.log")
