"""`workflow-streams dev`: the one command that runs the whole thing with an embedded Postgres."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from tests.support import pins
from workflow_streams.localpg import free_port

pytestmark = pytest.mark.slow
# this test drives a process from the outside on purpose
# ruff: noqa: ASYNC220, ASYNC240


async def test_dev_serves_with_a_throwaway_postgres(tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "dev.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workflow_streams.cli", "dev", "--port", str(port), "--token", "dev-secret"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=os.environ,
    )
    base = f"http://127.0.0.1:{port}/api/workflow-streams"
    headers = {"Authorization": "Bearer dev-secret"}
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (tmp_path / "dev.log").read_text()
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "dev never became ready"
                await asyncio.sleep(0.2)
            body = {"stream_id": "s", "pins": pins(authorization={"append": ["dev"], "read": ["dev"]})}
            async with session.post(f"{base}/runs/r/streams", json=body, headers=headers) as resp:
                assert resp.status == 201, await resp.text()
            async with session.post(f"{base}/runs/r/streams/s/records", json={"data": "hi"}, headers=headers) as resp:
                assert resp.status == 201
            async with session.get(f"{base}/runs/r/streams/s/records", headers=headers) as resp:
                page = await resp.json()
                assert [r["data"] for r in page.get("records", [])] == ["hi"], page
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        log.close()
    output = (tmp_path / "dev.log").read_text()
    assert "dev token (principal 'dev'): dev-secret" in output
    data_dir = re.search(r"data in (\S+)\)", output)
    assert data_dir and not Path(data_dir[1]).exists(), "the throwaway Postgres is removed on exit"
