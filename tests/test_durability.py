"""Readers are served only what is as durable as an acknowledged append (runtime.durability).

Two apps on one database play two processes. A record that B did not write and has heard nothing about
is served by B only after a commit sent after B's read has returned: its own barrier commit, or one of
its group commits. Holding the barrier rows' locks in a test transaction keeps every barrier waiting, as
a synchronous standby that is away keeps every commit waiting: B's reads then hold the records back
instead of serving them, and serve them once a commit returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import make_settings
from tests.support import SseReader, StreamsApi, metric
from tests.test_sse import subscribe
from tests.waiting import eventually
from workflow_streams.shells.compose import create_app


@pytest.fixture
async def apps(aiohttp_client: Any, database_url: str) -> AsyncIterator[tuple[StreamsApi, StreamsApi]]:
    """Two processes' worth of app: A appends, B reads; B gives up on a confirmation after 1 s."""
    a: TestClient = await aiohttp_client(create_app(make_settings(database_url)))
    b: TestClient = await aiohttp_client(create_app(make_settings(database_url, database_timeout_seconds=1.0)))
    yield StreamsApi(a), StreamsApi(b)


async def _hold_barriers(db: asyncpg.Connection) -> Callable[[], Awaitable[None]]:
    """Lock every barrier row until the returned function is called: barrier commits wait meanwhile."""
    transaction = db.transaction()
    await transaction.start()
    await db.execute("SELECT 1 FROM wfs_barriers FOR UPDATE")
    return transaction.rollback


async def _sequences(api: StreamsApi, stream: str, after: int = 0) -> tuple[list[int], dict[str, Any]]:
    resp = await api.read("r", stream, after=after)
    assert resp.status == 200, await resp.text()
    page = await resp.json()
    return [r["sequence"] for r in page["records"]], page


async def test_a_read_not_confirmed_in_time_holds_its_records_back(
    apps: tuple[StreamsApi, StreamsApi], db: asyncpg.Connection
) -> None:
    a, b = apps
    assert (await a.create("r", "s")).status == 201
    assert (await a.append("r", "s", 1, 2, 3)).status == 201
    held_back = metric("wfs_durability_held_back_records_total")
    release = await _hold_barriers(db)
    try:
        sequences, page = await _sequences(b, "s")
        # B knows nothing of these records and no commit can return: none is served, and the head it
        # reports is no further than what it serves
        assert sequences == []
        assert page["latest"] == 0 and page["next_after"] == 0 and page["closed"] is False
        assert metric("wfs_durability_held_back_records_total") == held_back + 3
    finally:
        await release()
    sequences, page = await _sequences(b, "s")
    assert sequences == [1, 2, 3] and page["latest"] == 3
    # confirmed once: the next reads of what it has confirmed need no commit at all
    release = await _hold_barriers(db)
    try:
        assert (await _sequences(b, "s", after=1))[0] == [2, 3]
    finally:
        await release()


async def test_the_appender_serves_its_own_acknowledged_records_at_once(
    apps: tuple[StreamsApi, StreamsApi], db: asyncpg.Connection
) -> None:
    """A's own commits returned: what they wrote is known durable, and A serves it with no barrier."""
    a, _ = apps
    assert (await a.create("r", "s")).status == 201
    assert (await a.append("r", "s", 1, 2)).status == 201
    barriers = metric("wfs_durability_barriers_total")
    release = await _hold_barriers(db)
    try:
        assert (await _sequences(a, "s"))[0] == [1, 2]
    finally:
        await release()
    assert metric("wfs_durability_barriers_total") == barriers


async def test_a_commit_of_the_reader_confirms_what_it_read_before(
    apps: tuple[StreamsApi, StreamsApi], db: asyncpg.Connection
) -> None:
    """B's read waits for a commit sent after it: one of B's own appends (to any stream) will do, no
    barrier needed. Its subscriber, who had nothing from B, then gets the records."""
    a, b = apps
    for stream in ("s", "other"):
        assert (await a.create("r", stream)).status == 201
    assert (await a.append("r", "s", 1, 2)).status == 201
    waits = metric("wfs_durability_waits_total")
    release = await _hold_barriers(db)
    try:
        reader = asyncio.ensure_future(b.read("r", "s"))
        await eventually(lambda: metric("wfs_durability_waits_total") > waits)
        assert not reader.done()
        assert (await b.append("r", "other", "x")).status == 201  # B's group commit, sent after the read
        resp = await reader
        assert [r["sequence"] for r in (await resp.json())["records"]] == [1, 2]
    finally:
        await release()


async def test_a_subscriber_gets_held_back_records_once_confirmed(
    apps: tuple[StreamsApi, StreamsApi], db: asyncpg.Connection
) -> None:
    a, b = apps
    assert (await a.create("r", "s")).status == 201
    assert (await a.append("r", "s", 1, 2)).status == 201
    held_back = metric("wfs_durability_held_back_records_total")
    release = await _hold_barriers(db)
    try:
        events = SseReader(await subscribe(b, "r", "s"))
        # its backfill was read and held back: the subscription starts empty and waits
        await eventually(lambda: metric("wfs_durability_held_back_records_total") >= held_back + 2)
    finally:
        await release()
    assert await events.records(2) == [1, 2]
    assert (await a.append("r", "s", 3)).status == 201
    assert await events.records(1) == [3]
