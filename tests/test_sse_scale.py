"""SSE under stress: a Postgres crash-restart under load, and 1,000 subscribers on one LISTEN."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.support import ALICE, SseReader, StreamsApi
from tests.waiting import eventually
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.shells.compose import create_app
from workflow_streams.store.migrate import apply_migrations

pytestmark = pytest.mark.slow


async def _follow(session: aiohttp.ClientSession, url: str, count: int) -> list[int]:
    resp = await session.get(url, params={"after": "0"}, headers=ALICE)
    assert resp.status == 200, await resp.text()
    try:
        return await SseReader(resp).records(count, seconds=60)
    finally:
        resp.close()


async def _append_retrying(api: StreamsApi, value: int) -> None:
    """A producer that survives the restart: same Idempotency-Key on every retry."""
    key = f"p-{value}"

    async def appended() -> bool:
        try:
            resp = await api.append("r", "s", value, key=key)
        except aiohttp.ClientError:
            return False
        assert resp.status in (200, 201, 503), await resp.text()
        return resp.status != 503

    await eventually(appended, within=30, interval=0.1, message=f"append {value} never succeeded")


async def test_postgres_restart_under_load(aiohttp_client: Any, own_pg: LocalPostgres, settings_for: Any) -> None:
    await apply_migrations(own_pg.dsn)
    client = await aiohttp_client(create_app(settings_for(own_pg.dsn)))
    api = StreamsApi(client)
    assert (await api.create("r", "s")).status == 201
    total = 300
    url = str(client.make_url(api.url("r", "s", "/subscribe")))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        followers = [asyncio.create_task(_follow(session, url, total)) for _ in range(20)]

        async def produce() -> None:
            for value in range(1, total + 1):
                await _append_retrying(api, value)
                if value == total // 3:
                    await asyncio.to_thread(own_pg.restart, "immediate")

        await asyncio.wait_for(produce(), 120)
        results = await asyncio.wait_for(asyncio.gather(*followers), 120)
    for got in results:
        assert got == list(range(1, total + 1))
    page = await api.read_all("r", "s")
    assert [r["data"] for r in page] == list(range(1, total + 1)), "no value lost or duplicated"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        yield s


async def test_thousand_subscribers_share_one_listen_connection(
    aiohttp_client: Any, database_url: str, settings_for: Any, session: aiohttp.ClientSession
) -> None:
    app_name = f"wfs-listen-{uuid.uuid4().hex[:8]}"
    settings = settings_for(database_url, listen_application_name=app_name, sse_max_per_principal=1000)
    client = await aiohttp_client(create_app(settings))
    api = StreamsApi(client)
    await api.create("r", "s")
    await api.append("r", "s", 1)
    url = str(client.make_url(api.url("r", "s", "/subscribe")))

    responses = await asyncio.gather(*(session.get(url, headers=ALICE) for _ in range(1000)))
    readers = [SseReader(r) for r in responses]
    assert all(r.status == 200 for r in responses)
    firsts = await asyncio.gather(*(reader.records(1, seconds=60) for reader in readers))
    assert all(f == [1] for f in firsts)

    conn = await asyncpg.connect(database_url)
    try:
        listeners = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app_name)
        pooled = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'wfs-pool' AND datname = current_database()"
        )
    finally:
        await conn.close()
    assert listeners == 1
    assert pooled <= 20

    await api.append("r", "s", 2)
    seconds = await asyncio.gather(*(reader.records(1, seconds=60) for reader in readers))
    assert all(s == [2] for s in seconds), "every subscriber is woken through the one connection"
    for r in responses:
        r.close()
