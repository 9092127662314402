"""Wakes and group commit across real server processes (issue 13): two `serve` processes on one Postgres.

These are the guarantees a single process cannot show: a wake another process hears is never ahead of the
commit it announces, and two processes whose group commits lock overlapping streams in opposite orders
never deadlock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from tests.replica import Replica, running
from tests.support import ALICE, pins
from tests.waiting import eventually
from workflow_streams import API_PREFIX
from workflow_streams.domain.wakes import CHANNEL, RECORDS, decode

pytestmark = pytest.mark.slow

RUN = "procs"


@pytest.fixture
async def replicas(database_url: str, tmp_path: Path) -> AsyncIterator[list[Replica]]:
    async with running(
        [Replica(database_url, tmp_path / f"replica-{i}.log", WFS_REGION="eu-west-1") for i in range(2)]
    ) as started:
        yield started


def _url(replica: Replica, stream: str | None = None, tail: str = "") -> str:
    path = f"{replica.base}{API_PREFIX}/runs/{RUN}/streams"
    return path if stream is None else f"{path}/{stream}{tail}"


async def _create(session: aiohttp.ClientSession, replica: Replica, streams: list[str]) -> None:
    for stream in streams:
        async with session.post(_url(replica), json={"stream_id": stream, "pins": pins()}) as resp:
            assert resp.status == 201, await resp.text()


async def _append(session: aiohttp.ClientSession, replica: Replica, stream: str, data: object) -> int:
    async with session.post(_url(replica, stream, "/records"), json={"data": data}) as resp:
        assert resp.status == 201, await resp.text()
        return int((await resp.json())["last_sequence"])


@contextlib.asynccontextmanager
async def _watching(session: aiohttp.ClientSession, replica: Replica, streams: list[str]) -> AsyncIterator[None]:
    """Live subscribers on ``replica``, one per stream, for the duration: a subscription's response starts
    after its first read, so once every one has answered, every stream is marked as watched there."""
    answered: list[asyncio.Event] = []

    async def subscribe(stream: str, started: asyncio.Event) -> None:
        async with session.get(_url(replica, stream, "/subscribe")) as resp:
            assert resp.status == 200, await resp.text()
            started.set()
            async for _line in resp.content:
                pass

    tasks = []
    for stream in streams:
        answered.append(asyncio.Event())
        tasks.append(asyncio.create_task(subscribe(stream, answered[-1])))
    try:
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in answered)), 30)
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _announcements(announced: list[tuple[str, int]]) -> Callable[[object, int, str, str], None]:
    """A LISTEN callback that records every (stream, last sequence) announced for this module's run."""

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        _sender, signals = decode(payload)
        announced.extend((s.stream_id, s.last) for s in signals if s.kind == RECORDS and s.run_id == RUN)

    return on_notify


async def test_a_wake_heard_by_another_process_never_precedes_its_commit(
    replicas: list[Replica], database_url: str
) -> None:
    """Listen on the wake channel like a second process does, and on every signal look in Postgres at
    once from another connection: the announced record must already be there, for every signal. The
    other replica watches the streams, so that the writer announces its commits at all."""
    streams = [f"w{i}" for i in range(8)]
    writer, watcher = replicas
    announced: list[tuple[str, int]] = []
    missing: list[tuple[str, int, int]] = []
    checks: list[asyncio.Task[None]] = []
    listener = await asyncpg.connect(database_url)
    reader = await asyncpg.connect(database_url)
    lock = asyncio.Lock()  # one reader connection: checks take turns, in arrival order

    async def check(stream: str, last: int) -> None:
        async with lock:
            head = await reader.fetchval(
                """SELECT max(r.sequence) FROM wfs_records r JOIN wfs_streams s USING (stream_key)
                   WHERE s.run_id = $1 AND s.stream_id = $2""",
                RUN,
                stream,
            )
        if head is None or head < last:
            missing.append((stream, last, head or 0))

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        _sender, signals = decode(payload)
        for signal in signals:
            if signal.kind == RECORDS and signal.run_id == RUN and signal.last > 0:
                announced.append((signal.stream_id, signal.last))
                checks.append(asyncio.create_task(check(signal.stream_id, signal.last)))

    await listener.add_listener(CHANNEL, on_notify)
    try:
        async with aiohttp.ClientSession(headers=ALICE) as session:
            await _create(session, writer, streams)

            async def produce(stream: str) -> int:
                last = 0
                for n in range(40):
                    last = await _append(session, writer, stream, n)
                return last

            async with _watching(session, watcher, streams):
                heads = await asyncio.gather(*(produce(s) for s in streams))
        # every stream's final sequence is announced eventually (coalesced signals may skip earlier ones)
        await eventually(
            lambda: all(any(a == (s, h) for a in announced) for s, h in zip(streams, heads, strict=True)),
            message="the last append of every stream was never announced to another process",
        )
        await asyncio.gather(*checks)
    finally:
        await listener.close()
        await reader.close()
    assert len(announced) >= len(streams)
    assert missing == [], f"wakes heard before their records were visible: {missing[:5]}"


async def test_only_streams_watched_in_some_process_are_announced(replicas: list[Replica], database_url: str) -> None:
    """A commit to a stream nobody watches is announced to no other process (a NOTIFY costs Postgres a
    transaction per listening process); once a subscriber on another replica watches it, it is. The
    writer's one notifier sends in commit order, so by the time the watched stream's append is heard,
    an announcement of the earlier, unwatched one would have been heard before it."""
    writer, watcher = replicas
    announced: list[tuple[str, int]] = []
    listener = await asyncpg.connect(database_url)
    await listener.add_listener(CHANNEL, _announcements(announced))
    try:
        async with aiohttp.ClientSession(headers=ALICE) as session:
            await _create(session, writer, ["quiet", "loud"])
            await _append(session, writer, "quiet", 1)
            async with _watching(session, watcher, ["loud"]):
                await _append(session, writer, "loud", 1)
                await eventually(lambda: ("loud", 1) in announced, message="the watched stream was not announced")
                assert [a for a in announced if a[0] == "quiet"] == []
                # and the same stream, once watched, is announced too
                async with _watching(session, watcher, ["quiet"]):
                    await _append(session, writer, "quiet", 2)
                    await eventually(
                        lambda: ("quiet", 2) in announced, message="a newly watched stream was not announced"
                    )
    finally:
        await listener.close()


async def test_a_subscriber_in_another_process_gets_every_record_once(replicas: list[Replica]) -> None:
    """Appends through one process, a live subscriber on the other: every record, in order, no repeats."""
    writer, follower = replicas
    async with aiohttp.ClientSession(headers=ALICE) as session:
        await _create(session, writer, ["live"])
        seen: list[int] = []
        done = asyncio.Event()

        async def follow() -> None:
            async with session.get(_url(follower, "live", "/subscribe")) as resp:
                assert resp.status == 200
                async for line in resp.content:
                    if line.startswith(b"id: "):
                        seen.append(int(line[4:]))
                        if len(seen) == 100:
                            done.set()
                            return

        task = asyncio.create_task(follow())
        for n in range(100):
            await _append(session, writer, "live", n)
        await asyncio.wait_for(done.wait(), 30)
        await task
    assert seen == list(range(1, 101))


async def test_opposite_order_group_commits_in_two_processes_never_deadlock(
    replicas: list[Replica], database_url: str
) -> None:
    """Each process gets bursts over the same streams, one in ascending and one in descending order, so
    their group commits hold overlapping sets of rows. Locking in one key order means Postgres never
    reports a deadlock (a retried deadlock would hide from the HTTP caller, so the counter is checked)."""
    streams = [f"d{i:03d}" for i in range(120)]
    rounds = 10
    unlimited = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers=ALICE, connector=unlimited) as session:
        await _create(session, replicas[0], streams)

        async def burst(replica: Replica, order: list[str]) -> None:
            for _ in range(rounds):
                await asyncio.gather(*(_append(session, replica, s, 1) for s in order))

        await asyncio.gather(burst(replicas[0], streams), burst(replicas[1], streams[::-1]))
    for replica in replicas:
        replica.stop()  # backends flush their statistics when they exit
    conn = await asyncpg.connect(database_url)
    try:
        counts = await conn.fetch(
            "SELECT stream_id, last_sequence FROM wfs_streams WHERE run_id = $1 ORDER BY stream_id", RUN
        )
        assert {r["stream_id"]: r["last_sequence"] for r in counts} == dict.fromkeys(streams, 2 * rounds)
        gaps = await conn.fetchval(
            """SELECT count(*) FROM (SELECT sequence - lag(sequence) OVER (PARTITION BY stream_key ORDER BY sequence)
                                       AS step FROM wfs_records
                                     WHERE stream_key IN (SELECT stream_key FROM wfs_streams WHERE run_id = $1)) t
               WHERE step <> 1""",
            RUN,
        )
        assert gaps == 0

        async def deadlocks() -> int:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            return int(await conn.fetchval("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"))

        assert await deadlocks() == 0
        for replica in replicas:
            assert "deadlock" not in replica.log_path.read_text().lower()
    finally:
        await conn.close()
