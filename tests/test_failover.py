"""Failover to a synchronous standby, as a deployment with a multi-host DSN
(``target_session_attrs=read-write``) goes through it.

What an acknowledged append survives is what replication makes a commit survive: with a synchronous
standby, the primary's loss. Two things are checked: promoting the standby under load loses no
acknowledged append; and a record that the failover erases (committed on the primary, never received by
the standby, made visible by the primary's crash recovery) is never served to a reader or subscriber,
who then gets the record stored at its sequence instead (runtime.durability).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from tests.replica import Replica, running
from tests.support import pins
from tests.waiting import eventually
from workflow_streams import API_PREFIX
from workflow_streams.local.postgres import migrated_database
from workflow_streams.local.topologies import Replication
from workflow_streams.local.workload import Workload

pytestmark = pytest.mark.slow

DATABASE = "wfs"
TOKEN = "tok-alice"


@pytest.fixture
async def dsn(sync_replication: Replication) -> str:
    """A migrated database on the primary (and so on its standby), by the multi-host DSN."""
    return await migrated_database(sync_replication.primary.dsn, DATABASE, sync_replication.dsn_for(DATABASE))


@pytest.fixture
async def replicas(dsn: str, tmp_path: Path) -> AsyncIterator[list[Replica]]:
    started = [
        Replica(dsn, tmp_path / f"replica-{i}.log", WFS_DATABASE_TIMEOUT_SECONDS="1", WFS_REGION="eu-west-1")
        for i in range(2)
    ]
    async with running(started):
        yield started


async def _fail_over(replication: Replication) -> None:
    """The primary lost for good, the standby promoted: what an HA manager does."""
    await asyncio.to_thread(replication.primary.kill)
    await asyncio.to_thread(replication.standby.promote)


async def test_promoting_a_synchronous_standby_under_load_loses_no_acknowledged_append(
    sync_replication: Replication, replicas: list[Replica]
) -> None:
    async with aiohttp.ClientSession() as session:
        work = Workload(session, [r.base for r in replicas], TOKEN, streams=3)
        await work.create(pins())
        work.subscribe()
        failed_over = asyncio.Event()
        started_failover = False

        def progress(acknowledged: int) -> None:
            nonlocal started_failover
            if acknowledged >= 80 and not started_failover:
                started_failover = True
                asyncio.get_running_loop().create_task(_fail_over(sync_replication)).add_done_callback(
                    lambda _task: failed_over.set()
                )

        try:
            await work.produce(producers=6, appends_each=40, on_ack=progress)
            await failed_over.wait()
            await eventually(work.caught_up, within=30, message="subscribers did not catch up")
            assert await work.check() == []
        finally:
            await work.close()
        assert len(work.acknowledged) == 240
        assert await asyncio.to_thread(sync_replication.standby.accepts_writes)


async def test_a_record_that_failover_erases_is_never_served(
    sync_replication: Replication, dsn: str, tmp_path: Path
) -> None:
    replica = Replica(dsn, tmp_path / "replica.log", WFS_DATABASE_TIMEOUT_SECONDS="1", WFS_REGION="eu-west-1")
    await replica.ready()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with aiohttp.ClientSession(headers=headers) as session:
            work = Workload(session, [replica.base], TOKEN, streams=1)
            await work.create(pins())
            work.subscribe()
            for n in range(3):
                await work.append(replica.base, "s0", f"kept-{n}")
            await eventually(lambda: work.subscribers[0].last == 3)

            # the standby stops receiving: a commit now waits for it, and the append's deadline closes
            # the connection (never cancels it), so its client gets a 503 and the commit stays pending
            await asyncio.to_thread(sync_replication.standby.pause_replication)
            url = f"{replica.base}{API_PREFIX}/runs/workload/streams/s0/records"
            async with session.post(url, json={"data": "erased"}, headers={"Idempotency-Key": "erased"}) as resp:
                assert resp.status == 503, await resp.text()
            # the primary's crash recovery makes that commit visible, unreplicated
            await asyncio.to_thread(sync_replication.primary.crash_restart)
            direct = await asyncpg.connect(sync_replication.primary.dsn_for(DATABASE))
            try:
                assert await direct.fetchval("SELECT max(sequence) FROM wfs_records") == 4
            finally:
                await direct.close()
            # the data plane reads it, and holds it back: it is not as durable as an acknowledgement
            await eventually(lambda: _held_back(session, replica), within=30)
            async with session.get(url + "?after=3") as resp:
                page = await resp.json()
                assert resp.status == 200 and page["records"] == [] and page["latest"] == 3, page

            await _fail_over(sync_replication)
            replacement = await work.append(replica.base, "s0", "replacement")
            assert replacement.sequence == 4
            await eventually(lambda: work.subscribers[0].last == 4, within=30)
            assert [data for _, data in work.subscribers[0].seen] == [
                '"kept-0"',
                '"kept-1"',
                '"kept-2"',
                '"replacement"',
            ]
            assert await work.check() == []
            await work.close()
    finally:
        replica.stop()


async def _held_back(session: aiohttp.ClientSession, replica: Replica) -> bool:
    async with session.get(f"{replica.base}/metrics") as resp:
        text = await resp.text()
    return any(
        line.startswith("wfs_durability_held_back_records_total") and float(line.split()[-1]) > 0
        for line in text.splitlines()
    )
