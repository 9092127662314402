"""Streams marked as watched, so that appenders elsewhere announce exactly what someone may wait for
(issue 13; runtime.interest, migration 485)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime

import asyncpg

from tests.support import StreamsApi
from tests.waiting import eventually
from workflow_streams.domain.authz import Principal, Trusted
from workflow_streams.domain.records import RecordIn
from workflow_streams.domain.wakes import RECORDS, Signal
from workflow_streams.runtime.durability import Durability
from workflow_streams.runtime.group_commit import GroupCommit
from workflow_streams.runtime.interest import TTL_SECONDS, Interest
from workflow_streams.runtime.supervisor import Supervisor
from workflow_streams.runtime.wakes import Deliver, WakeHub
from workflow_streams.store import definitions
from workflow_streams.store.appends import AppendRequest
from workflow_streams.store.db import Pool, create_pool

ALICE = Principal("alice")


class _Captured:
    """A wake source that keeps what would have gone to other processes."""

    def __init__(self) -> None:
        self.connected = asyncio.Event()
        self.sent: list[Signal] = []

    def loops(self, deliver: Deliver, lost: Callable[[], None]) -> dict[str, Callable[[], Awaitable[None]]]:
        self.connected.set()
        return {}

    async def stop(self) -> None:
        pass

    def send(self, signals: Iterable[Signal]) -> None:
        self.sent.extend(signals)

    def records_of(self, stream: str) -> list[int]:
        return [s.last for s in self.sent if s.kind == RECORDS and s.stream_id == stream]


@contextlib.asynccontextmanager
async def _hub(
    database_url: str, poll_seconds: float, ttl: float = TTL_SECONDS
) -> AsyncIterator[tuple[WakeHub, _Captured, Pool]]:
    """A started hub that marks what it watches, its captured wake source, and the pool it marks with."""
    pool = await create_pool(database_url, 1, 2)
    source = _Captured()
    hub = WakeHub(source, pool, poll_seconds, interest=Interest(pool, ttl=ttl))
    supervisor = Supervisor()
    await hub.start(supervisor)
    try:
        yield hub, source, pool
    finally:
        await supervisor.stop()
        await hub.stop()
        await pool.close()


def _append(group: GroupCommit, stream: str) -> asyncio.Future[object]:
    return asyncio.ensure_future(group.append(AppendRequest("r", stream, [RecordIn("application/json", b"1")], ALICE)))


async def _mark_waits_for(db: asyncpg.Connection) -> bool:
    """Whether some backend's mark statement waits for a lock that ``db``'s backend holds."""
    # Inside a transaction Postgres answers pg_stat_activity from a snapshot taken at its first use
    # there: without this, a first look taken before the mark was sent would be the answer for good.
    await db.execute("SELECT pg_stat_clear_snapshot()")
    return bool(
        await db.fetchval(
            """SELECT count(*) > 0 FROM pg_stat_activity
               WHERE query LIKE '%watched_until = now()%' AND pg_backend_pid() = ANY(pg_blocking_pids(pid))"""
        )
    )


async def test_a_mark_waits_for_the_append_holding_the_row_and_later_appends_announce(
    api: StreamsApi, database_url: str, db: asyncpg.Connection
) -> None:
    """Unwatched, an append wakes only its own process. A watcher's mark takes the row lock, so it
    waits for an append that holds the row (whose records the watcher's first read, after the mark,
    then sees); every append after the mark reads it and announces its commit to other processes."""
    assert (await api.create("r", "fenced")).status == 201
    async with _hub(database_url, 0) as (hub, source, pool):
        group = GroupCommit(pool, hub, Durability(pool))
        async with asyncio.timeout(15):
            await _append(group, "fenced")
            assert source.records_of("fenced") == []  # nobody watches: nothing for other processes

            async with db.transaction():  # as an append that has locked the row and not committed yet
                await db.execute("SELECT 1 FROM wfs_streams WHERE stream_id = 'fenced' FOR UPDATE")
                entered = asyncio.Event()

                async def watch() -> None:
                    async with hub.watch_records("r", "fenced"):
                        entered.set()
                        await asyncio.Event().wait()  # held until cancelled

                assert not await _mark_waits_for(db)  # a first look before the mark: later ones see afresh
                watcher = asyncio.create_task(watch())
                await eventually(lambda: _mark_waits_for(db), message="the mark did not wait for the row lock")
                assert not entered.is_set()
            await entered.wait()

            await _append(group, "fenced")
            assert source.records_of("fenced") == [2]
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)


async def test_a_mark_is_renewed_while_watched_and_a_stream_made_again_is_marked_afresh(
    api: StreamsApi, database_url: str, db: asyncpg.Connection
) -> None:
    """Marks expire (a process that dies leaves no stream announced for ever), so the head poller renews
    them while someone here watches. A mark outlives its watchers here (a long poll that comes back at
    once writes nothing), except for a stream the head poller found gone: made again under its name,
    it starts unmarked, and its next watcher marks it."""
    assert (await api.create("r", "renewed")).status == 201

    async def watched_until() -> datetime | None:
        value: datetime | None = await db.fetchval("SELECT watched_until FROM wfs_streams WHERE stream_id = 'renewed'")
        return value

    async with _hub(database_url, 0.1, ttl=1.0) as (hub, _, _):
        assert await watched_until() is None
        async with hub.watch_records("r", "renewed") as wake:
            first = await watched_until()
            assert first is not None

            async def renewed() -> bool:
                value = await watched_until()
                return value is not None and value > first

            await eventually(renewed, message="the mark was never renewed")
            wake.cursor = 0  # at the head: the poller wakes us only when the stream moves or goes
            wake.clear()
            await definitions.delete_stream(db, "r", "renewed", Trusted("test"))
            assert await wake.wait(10), "the head poller never found the stream gone"
        assert (await api.create("r", "renewed")).status == 201
        assert await watched_until() is None
        async with hub.watch_records("r", "renewed"):
            assert await watched_until() is not None


async def test_a_watcher_that_comes_back_at_once_writes_no_mark(
    api: StreamsApi, database_url: str, db: asyncpg.Connection
) -> None:
    """A long poll ends and the next one starts; a subscriber reconnects. The stream's mark has time
    left, so the next watcher writes nothing (a write per long poll would contend with the appends)."""
    assert (await api.create("r", "again")).status == 201
    query = "SELECT watched_until FROM wfs_streams WHERE stream_id = 'again'"
    async with _hub(database_url, 0) as (hub, _, _):
        async with hub.watch_records("r", "again"):
            first = await db.fetchval(query)
            assert first is not None
        async with hub.watch_records("r", "again"):
            assert await db.fetchval(query) == first
