"""The Durable Streams protocol's own conformance suite against a real ``serve`` process.

The suite (npm ``@durable-streams/server-conformance-tests``, pinned in conformance/package-lock.json)
runs under vitest from the small npm project in conformance/, against a server that allows anonymous
callers on the protocol surface, as ``workflow-streams dev`` does. Its failures must be exactly the
ones listed in conformance/expected-failures.txt (the fork tests: forks are not implemented).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.replica import Replica

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "conformance"
EXPECTED = PROJECT / "expected-failures.txt"
# the suite's long-poll tests wait this long for a 204; the server answers after LONG_POLL_SECONDS
LONG_POLL_SECONDS = 3
pytestmark = pytest.mark.slow  # a serve process and the npm suite under node: a minute or more


def _npm_ci() -> None:
    """Install the pinned suite once per lockfile: a stamp records which lockfile node_modules holds."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.fail("Node.js and npm are needed for the conformance suite (Node 20: apt-get install nodejs npm)")
    lock = (PROJECT / "package-lock.json").read_bytes()
    stamp = PROJECT / "node_modules" / ".wfs-lock"
    if stamp.is_file() and stamp.read_bytes() == lock:
        return
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=PROJECT, check=True, timeout=600)
    stamp.write_bytes(lock)


def expected_failures() -> set[str]:
    lines = EXPECTED.read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}


def outcomes(report: dict[str, Any]) -> dict[str, str]:
    """Every test's full name (describe blocks and title joined by " > ") and its status."""
    return {
        " > ".join([*test["ancestorTitles"], test["title"]]): test["status"]
        for file in report["testResults"]
        for test in file["assertionResults"]
    }


async def test_conformance_suite(database_url: str, tmp_path: Path) -> None:
    _npm_ci()
    server = Replica(
        database_url,
        tmp_path / "server.log",
        WFS_DS_ANONYMOUS="true",
        WFS_DS_LONG_POLL_SECONDS=str(LONG_POLL_SECONDS),
    )
    try:
        async with aiohttp.ClientSession() as session:
            await server.ready(session)
        report_path = tmp_path / "report.json"
        env = {
            **os.environ,
            "DS_BASE_URL": f"{server.base}/api/durable-streams",
            "DS_LONG_POLL_TIMEOUT_MS": str(LONG_POLL_SECONDS * 1000),
        }
        vitest = await asyncio.create_subprocess_exec(
            "node",
            "node_modules/vitest/vitest.mjs",
            "run",
            "--reporter=json",
            f"--outputFile={report_path}",
            cwd=PROJECT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(vitest.communicate(), timeout=1200)
        assert report_path.is_file(), f"vitest wrote no report:\n{output.decode(errors='replace')[-5000:]}"
        report = json.loads(report_path.read_text())
    finally:
        server.stop()
    statuses = outcomes(report)
    failed = {name for name, status in statuses.items() if status == "failed"}
    expected = expected_failures()
    assert failed - expected == set(), f"unexpected failures (server log: {server.log_path})"
    assert expected - failed == set(), "these now pass: remove them from conformance/expected-failures.txt"
    # the suite really ran: everything that is not an expected failure (or the suite's own opt-in
    # groups it skips) passed
    passed = [name for name, status in statuses.items() if status == "passed"]
    assert len(passed) >= 250, statuses
    assert all(name.startswith("Fork") for name in expected)
