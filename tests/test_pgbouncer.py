"""Behind Debian's PgBouncer in transaction pooling, with its stock settings (store.db's pooler mode):
startup parameters refused, server connections shared between clients' transactions, LISTEN dead.

Two `serve` processes run through it, one polling for other processes' commits (no LISTEN anywhere),
one with LISTEN on a direct DSN; producers append through both and subscribers follow on both while
PgBouncer is killed and started again, twice. Nothing acknowledged is lost or stored twice, and every
subscriber gets every record, once, in order. Migrations run through it too.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from tests.conftest import create_database
from tests.replica import Replica, running
from tests.support import pins
from tests.waiting import eventually
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.local.topologies import PgBouncer
from workflow_streams.local.workload import Workload

pytestmark = pytest.mark.slow

POOLED = {"WFS_DATABASE_POOLER": "transaction", "WFS_WAKE_POLL_SECONDS": "0.2", "WFS_REGION": "eu-west-1"}


@pytest.fixture
async def database(pg: LocalPostgres) -> str:
    """A migrated database's name."""
    return (await create_database(pg)).rsplit("/", 1)[1]


@pytest.fixture
async def replicas(
    pgbouncer: PgBouncer, pg: LocalPostgres, database: str, tmp_path: Path
) -> AsyncIterator[list[Replica]]:
    through = pgbouncer.dsn_for(database)
    polling = Replica(through, tmp_path / "polling.log", **POOLED)
    listening = Replica(through, tmp_path / "listening.log", WFS_LISTEN_DATABASE_URL=pg.dsn_for(database), **POOLED)
    async with running([polling, listening]) as started:
        yield started


async def test_appends_and_subscribers_survive_pgbouncer_restarts(
    replicas: list[Replica], pgbouncer: PgBouncer
) -> None:
    async with aiohttp.ClientSession() as session:
        work = Workload(session, [r.base for r in replicas], "tok-alice", streams=3)
        await work.create(pins())
        work.subscribe(per_stream_and_base=2)
        restarts = 0
        halfway = asyncio.Event()

        def progress(acknowledged: int) -> None:
            if acknowledged >= 60 * (restarts + 1):
                halfway.set()

        async def restarter() -> None:
            nonlocal restarts
            for _ in range(2):
                await halfway.wait()
                halfway.clear()
                await asyncio.to_thread(pgbouncer.restart)  # killed (SIGKILL), then started on its port
                restarts += 1

        try:
            faults = asyncio.create_task(restarter())
            await work.produce(producers=6, appends_each=40, on_ack=progress)
            await faults
            assert restarts == 2
            await eventually(work.caught_up, within=30, message="subscribers did not catch up")
            assert await work.check() == []
        finally:
            await work.close()
        assert len(work.acknowledged) == 240
        # the restarts cost some attempts a 503 (or no answer); every one was retried to an acknowledgement
        assert set(work.attempts.statuses) <= {0, 200, 201, 503}, work.attempts.statuses


async def test_readiness_and_listen_wakes_behind_the_pooler(replicas: list[Replica]) -> None:
    """The poll-only replica never LISTENs (the pooler would swallow it); the other's LISTEN connection
    is direct. Both are ready, and a commit on one wakes a subscriber on the other."""
    async with aiohttp.ClientSession() as session:
        work = Workload(session, [r.base for r in replicas], "tok-alice", streams=1)
        await work.create(pins())
        work.subscribe()
        try:
            for base in work.bases:
                await work.append(base, "s0", f"from-{base}")
            await eventually(work.caught_up, message="a wake did not cross between the replicas")
            assert await work.check() == []
        finally:
            await work.close()


async def test_migrations_run_through_the_pooler(pg: LocalPostgres, pgbouncer: PgBouncer) -> None:
    """Each migration holds a transaction-level lock: nothing outlives a transaction on a pooled server
    connection. Twice: the second run finds nothing to do."""
    name = (await create_database(pg, template=None)).rsplit("/", 1)[1]
    env = {"WFS_DATABASE_URL": pgbouncer.dsn_for(name), "WFS_DATABASE_POOLER": "transaction", "PATH": "/usr/bin:/bin"}
    for _ in range(2):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "workflow_streams", "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    conn = await asyncpg.connect(pg.dsn_for(name))
    try:
        assert await conn.fetchval("SELECT count(*) FROM wfs_barriers") == 64
    finally:
        await conn.close()
