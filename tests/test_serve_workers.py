"""``serve --workers N``: one port, N processes, and ready only once all N serve.

The kernel gives a new connection to one of the sockets listening on the port at that moment. A client
that connected while a worker was still starting stayed on the others for as long as its keep-alive
connection lived: ``/readyz`` answered as soon as the first worker could, 70 ms before the second
listened here, and the benchmark's first case then ran on one worker in some rounds.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.replica import Replica
from workflow_streams.local.process import listening_sockets

pytestmark = pytest.mark.slow


async def test_ready_only_once_every_worker_listens(database_url: str, tmp_path: Path) -> None:
    replica = Replica(database_url, tmp_path / "server.log", WFS_WORKERS="3")
    try:
        await replica.ready()  # the first 200 from /readyz, from whichever worker answered
        assert listening_sockets(replica.port) == 3
        # and every worker says so, whichever the kernel picks for each new connection
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(12):
                async with session.get(f"{replica.base}/readyz") as resp:
                    assert resp.status == 200, await resp.text()
    finally:
        replica.stop()
