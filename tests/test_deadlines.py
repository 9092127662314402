"""Deadlines on every database call (store.db). A Postgres that stops answering, paused with SIGSTOP (its
connections stay open and the kernel still acknowledges what is sent, but nothing comes back: what a
partition that drops packets looks like, minus the network), costs a request a 503 with Retry-After
within the deadline instead of a hang; /readyz answers 503 promptly and 200 again once Postgres is back;
/healthz stays a liveness check; nothing acknowledged is lost. (tests/test_partition.py cuts a real
network.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import make_settings
from tests.support import StreamsApi, problem
from tests.waiting import eventually
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.shells.compose import create_app
from workflow_streams.store import db
from workflow_streams.store.migrate import apply_migrations

# what the app under test waits for Postgres; the tests' own bounds are far longer, so a request that
# hung instead of answering fails them
DEADLINE = 1.0
# a failure's bound, never a timing assertion: a request without a deadline would wait for Postgres
HANG = 20.0


def _postgres_pids(cluster: LocalPostgres) -> list[int]:
    postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


@pytest.fixture
def pause(own_pg: LocalPostgres) -> Iterator[Any]:
    """``pause()`` stops every process of ``own_pg``; ``resume()`` (also at teardown) lets them go on."""
    stopped: list[int] = []

    class Pause:
        def __call__(self) -> None:
            stopped.extend(_postgres_pids(own_pg))
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)

        def resume(self) -> None:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            stopped.clear()

    paused = Pause()
    yield paused
    paused.resume()


@pytest.fixture
async def client(aiohttp_client: Any, own_pg: LocalPostgres) -> AsyncIterator[TestClient]:
    await apply_migrations(own_pg.dsn)
    settings = make_settings(own_pg.dsn, database_timeout_seconds=DEADLINE, wake_poll_seconds=0.2)
    yield await aiohttp_client(create_app(settings))


async def test_requests_answer_503_within_the_deadline_while_postgres_does_not_answer(
    client: TestClient, pause: Any
) -> None:
    api = StreamsApi(client)
    assert (await api.create("r", "s")).status == 201
    assert (await api.append("r", "s", "before", key="k1")).status == 201
    pause()
    async with asyncio.timeout(HANG):
        resp = await api.append("r", "s", "during", key="k2")
        await problem(resp, 503, "database_unavailable")
        assert resp.headers["Retry-After"] == "1"
        await problem(await api.read("r", "s"), 503, "database_unavailable")
        ready = await client.get("/readyz")
        assert ready.status == 503, await ready.text()
        assert (await client.get("/healthz")).status == 200
    pause.resume()
    await eventually(lambda: _status(client, "/readyz", 200), message="/readyz did not come back")
    # the client retries with its key: whatever the first try did, the record is there once
    assert (await api.append("r", "s", "during", key="k2")).status in (200, 201)
    assert [r["data"] for r in await api.read_all("r", "s")] == ["before", "during"]


async def test_a_held_connection_past_its_deadline_is_closed_not_cancelled(own_pg: LocalPostgres) -> None:
    """The deadline closes the connection: Postgres sees its client go (a cancel would have been a
    query_canceled error in its log, and for a COMMIT waiting on a standby, a commit made visible
    unreplicated)."""
    pool = await db.create_pool(own_pg.dsn, 1, 1, connecting=db.Connecting(timeout_seconds=0.5))
    try:
        with pytest.raises(db.DatabaseTimeout):
            async with pool.acquire() as conn:
                await conn.execute("SELECT pg_sleep(30)")
        async with pool.acquire() as conn:  # the pool replaced it
            assert await conn.fetchval("SELECT 1") == 1
        log = (own_pg.base_dir / "postgres.log").read_text()
        assert "canceling statement due to user request" not in log
    finally:
        await pool.close()


async def test_pooled_connections_detect_a_dead_peer(database_url: str) -> None:
    """Keepalives and a user timeout on every connection's socket: an idle connection to a peer that went
    away is found dead by the kernel instead of hanging its next user."""
    import socket

    pool = await db.create_pool(database_url, 1, 1)
    try:
        async with pool.acquire() as conn:
            sock = conn._con._transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == db.KEEPALIVE_IDLE_SECONDS
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == db.USER_TIMEOUT_SECONDS * 1000
    finally:
        await pool.close()


async def _status(client: TestClient, path: str, status: int) -> bool:
    return (await client.get(path)).status == status
