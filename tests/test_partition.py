"""A network partition between one data plane and Postgres: the data plane runs in a network namespace,
and iptables inside it drops every packet to and from the Postgres port (the host still reaches the data
plane, as a Service would). Requests to it answer 503 within the deadline instead of hanging for the cut
and TCP's backoff; its /readyz answers 503, so a Service stops routing to it, and 200 after the heal; the
data plane outside the namespace never notices; nothing acknowledged is lost and every subscriber,
on either side, gets every record. Skipped, with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.replica import Replica
from tests.support import pins
from tests.waiting import eventually
from workflow_streams import API_PREFIX
from workflow_streams.local.postgres import migrated_database
from workflow_streams.local.topologies import ConfiguredPostgres, Partition, ServeInNamespace
from workflow_streams.local.workload import Workload

pytestmark = pytest.mark.slow

DATABASE = "wfs"
DEADLINE = "2"
# a failure's bound, never a timing assertion: without deadlines a request hangs for the whole cut
HANG = 30.0


@pytest.fixture
async def planes(
    partition: Partition, partitioned_pg: ConfiguredPostgres, tmp_path: Path
) -> AsyncIterator[tuple[ServeInNamespace, Replica]]:
    await migrated_database(partitioned_pg.dsn, DATABASE, partitioned_pg.dsn_for(DATABASE))
    inside = ServeInNamespace(
        partition, DATABASE, tmp_path / "inside.log", WFS_DATABASE_TIMEOUT_SECONDS=DEADLINE, WFS_REGION="eu-west-1"
    )
    outside = Replica(
        partitioned_pg.dsn_for(DATABASE),
        tmp_path / "outside.log",
        WFS_DATABASE_TIMEOUT_SECONDS=DEADLINE,
        WFS_REGION="eu-west-1",
    )
    try:
        await inside.ready()
        await outside.ready()
        yield inside, outside
    finally:
        inside.stop()
        outside.stop()


async def test_a_partitioned_data_plane_answers_503_in_time_and_recovers_after_the_heal(
    partition: Partition, planes: tuple[ServeInNamespace, Replica]
) -> None:
    inside, outside = planes
    async with aiohttp.ClientSession() as session:
        work = Workload(session, [inside.base, outside.base], "tok-alice", streams=2)
        await work.create(pins())
        work.subscribe()
        try:
            for n in range(4):
                await work.append(work.bases[n % 2], work.streams[n % 2], f"before-{n}")

            await asyncio.to_thread(partition.cut)
            headers = {"Authorization": "Bearer tok-alice", "Idempotency-Key": "during"}
            url = f"{inside.base}{API_PREFIX}/runs/{work.run}/streams/s0/records"
            async with asyncio.timeout(HANG):
                async with session.post(url, json={"data": "during"}, headers=headers) as resp:
                    assert resp.status == 503, await resp.text()
                    assert resp.headers["Retry-After"] == "1"
                async with session.get(f"{inside.base}/readyz") as resp:
                    assert resp.status == 503, await resp.text()
                async with session.get(f"{inside.base}/healthz") as resp:
                    assert resp.status == 200
            # the other side of the cut goes on, and its subscribers with it
            await work.append(outside.base, "s1", "outside-during")

            await asyncio.to_thread(partition.heal)
            await eventually(lambda: _ready(session, inside.base), within=HANG, message="no 200 after the heal")
            await work.append(inside.base, "s0", "during")  # the client's retry, with its key
            await work.append(inside.base, "s1", "after")
            await eventually(work.caught_up, within=HANG, message="subscribers did not catch up")
            assert await work.check() == []
        finally:
            await work.close()


async def _ready(session: aiohttp.ClientSession, base: str) -> bool:
    try:
        async with session.get(f"{base}/readyz", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
