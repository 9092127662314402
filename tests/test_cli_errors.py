"""Every error a user can provoke from the CLI, `serve` or `migrate` is one line with a stable code and no
traceback: the list of issue 41, walked through the real command as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from workflow_streams.local.postgres import free_port

pytestmark = pytest.mark.slow  # processes


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # no WFS_* of the caller's shell: exactly what the case says
    base = {k: v for k, v in os.environ.items() if not k.startswith("WFS_")}
    return subprocess.run(
        [sys.executable, "-m", "workflow_streams", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **env},
    )


def one_line(result: subprocess.CompletedProcess[str], code: str, status: int = 1) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {code}: "), lines[0]
    assert result.returncode == status, (result.returncode, result.stderr)
    return lines[0]


def test_a_binary_pins_file(tmp_path: Path) -> None:
    report = tmp_path / "report.pdf"
    report.write_bytes(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n" + os.urandom(4000))
    line = one_line(run("create", "run-1", "cli", "--pins", str(report)), "invalid_pins_file")
    assert "report.pdf" in line


def test_settings_that_do_not_parse() -> None:
    unreachable = f"postgresql://u:secret@127.0.0.1:{free_port()}/wfs"
    line = one_line(run("serve", WFS_DATABASE_URL=unreachable, WFS_TOKENS="{not json"), "invalid_setting")
    assert "WFS_TOKENS" in line and "JSON" in line
    regions = '{"eu-west-1": {"endpoint_url": "http://127.0.0.1:9000"}}'
    line = one_line(run("serve", WFS_DATABASE_URL=unreachable, WFS_S3_REGIONS=regions), "invalid_setting")
    assert "WFS_S3_REGIONS" in line and "bucket" in line and "secret_access_key" in line
    line = one_line(run("migrate", WFS_DATABASE_URL=unreachable, WFS_PORT="eighty"), "invalid_setting")
    assert "WFS_PORT" in line
    one_line(run("migrate"), "missing_setting")


@pytest.mark.parametrize("command", ["migrate", "serve"])
def test_an_unreachable_database(command: str) -> None:
    port = free_port()  # nothing listens there
    line = one_line(
        run(command, WFS_DATABASE_URL=f"postgresql://u:secret@127.0.0.1:{port}/wfs"), "database_unavailable"
    )
    assert f"127.0.0.1:{port}" in line
    assert "secret" not in line, "the DSN's password is never printed"


def test_ctrl_c_while_the_modules_are_imported() -> None:
    """-X importtime reports each import as it completes: the interrupt arrives while aiohttp and the rest
    are still being imported, long before any command runs."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("WFS_")}
    with subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "workflow_streams", "ls", "run-1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**base, "WFS_URL": f"http://127.0.0.1:{free_port()}"},
    ) as proc:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip().startswith("aiohttp."):
                break  # the first of aiohttp's modules is in: the rest of aiohttp, asyncpg, ... are still to come
        else:
            raise AssertionError("aiohttp was never imported:\n" + "".join(seen[-20:]))
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        status = proc.wait(60)
    lines = [line for line in rest.splitlines() if not line.startswith("import time:")]
    one_line(subprocess.CompletedProcess(proc.args, status, "", "\n".join(lines)), "interrupted", status=130)
