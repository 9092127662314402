"""The Durable Streams protocol's own conformance suite against plain ``workflow-streams dev``.

The suite (npm ``@durable-streams/server-conformance-tests``, pinned in conformance/package-lock.json)
runs under vitest from the small npm project in conformance/, against dev as a user starts it: it
admits callers without a token on the protocol surface. Every test passes, forks included. The only
setting given is a shorter long-poll wait, so that the suite's long-poll tests take seconds, not tens.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.devproc import DevProcess
from workflow_streams.local.npm import npm_ci

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "conformance"
# the suite's long-poll tests wait this long for a 204; the server answers after LONG_POLL_SECONDS
LONG_POLL_SECONDS = 3
pytestmark = pytest.mark.slow  # dev and the npm suite under node: a minute or more


def outcomes(report: dict[str, Any]) -> dict[str, str]:
    """Every test's full name (describe blocks and title joined by " > ") and its status."""
    return {
        " > ".join([*test["ancestorTitles"], test["title"]]): test["status"]
        for file in report["testResults"]
        for test in file["assertionResults"]
    }


async def test_conformance_suite(tmp_path: Path) -> None:
    npm_ci(PROJECT, "the conformance suite")
    dev = DevProcess(tmp_path, token=None, WFS_DS_LONG_POLL_SECONDS=str(LONG_POLL_SECONDS))
    try:
        await asyncio.to_thread(dev.wait_ready)
        report_path = tmp_path / "report.json"
        env = {
            **os.environ,
            "DS_BASE_URL": f"{dev.url}/api/durable-streams",
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
        dev.stop()
    statuses = outcomes(report)
    failed = sorted(name for name, status in statuses.items() if status == "failed")
    assert failed == [], f"failed (dev's log: {dev.log_path})"
    # the suite really ran: all of it (0.3.6 has 332 tests, forks included)
    assert sum(status == "passed" for status in statuses.values()) >= 332, statuses
