"""Wakes after commit and group commit across streams (issue 13)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support import SseReader, StreamsApi
from tests.test_sse import subscribe
from tests.waiting import eventually
from workflow_streams.domain.authz import Principal
from workflow_streams.domain.errors import Forbidden, IdempotencyKeyReused, StreamClosed, StreamNotFound
from workflow_streams.domain.records import RecordIn
from workflow_streams.runtime.durability import Durability
from workflow_streams.runtime.group_commit import GroupCommit
from workflow_streams.runtime.wakes import PollOnly, WakeHub
from workflow_streams.shells.compose import create_app
from workflow_streams.store import appends, streams
from workflow_streams.store.appends import AppendRequest, AppendResult, append_batch
from workflow_streams.store.db import create_pool

REPO = Path(__file__).resolve().parents[1]


def _record(text: str) -> RecordIn:
    return RecordIn("application/json", f'"{text}"'.encode(), None)


async def test_cross_stream_batch_decides_each_request_alone(api: StreamsApi, database_url: str) -> None:
    for stream in ("a", "b", "closed", "keyed"):
        assert (await api.create("r", stream)).status == 201
    assert (await api.close("r", "closed")).status == 200
    assert (await api.append("r", "keyed", 1, key="k1")).status == 201
    alice, eve = Principal("alice"), Principal("eve")
    requests = [
        AppendRequest("r", "b", [_record("b1")], alice),
        AppendRequest("r", "closed", [_record("x")], alice),
        AppendRequest("r", "a", [_record("a1"), _record("a2")], alice),
        AppendRequest("r", "a", [_record("evil")], eve),
        AppendRequest("r", "keyed", [_record("other")], alice, idempotency_key="k1"),
        AppendRequest("r", "missing", [_record("x")], alice),
        AppendRequest("r", "b", [_record("b2")], alice),
    ]
    # the lock statement leaves the pins document out; those not cached in this process are read
    # (eve's refusal below is decided by them)
    streams._PINS_CACHE.clear()
    pool = await create_pool(database_url, 1, 2)
    try:
        async with pool.acquire() as conn, conn.transaction():
            batch = await append_batch(conn, requests)
    finally:
        await pool.close()
    outcomes = batch.outcomes
    assert outcomes[0] == AppendResult(1, 1, False)
    assert isinstance(outcomes[1], StreamClosed)
    assert outcomes[2] == AppendResult(1, 2, False)
    assert isinstance(outcomes[3], Forbidden)
    assert isinstance(outcomes[4], IdempotencyKeyReused)
    assert isinstance(outcomes[5], StreamNotFound)
    assert outcomes[6] == AppendResult(2, 2, False)
    assert [r["data"] for r in await api.read_all("r", "a")] == ["a1", "a2"]
    assert [r["data"] for r in await api.read_all("r", "b")] == ["b1", "b2"]
    assert [r["data"] for r in await api.read_all("r", "keyed")] == [1]
    assert await api.read_all("r", "closed") == []


async def test_poll_only_mode_delivers_another_processes_commits(
    aiohttp_client: Any, database_url: str, settings_for: Any, db: asyncpg.Connection
) -> None:
    """With LISTEN disabled, a subscriber still gets records committed elsewhere (head polling)."""
    settings = settings_for(database_url, wake_source="poll", wake_poll_seconds=0.1)
    api = StreamsApi(await aiohttp_client(create_app(settings)))
    await api.create("r", "s")
    events = SseReader(await subscribe(api, "r", "s"))
    # a commit this process never hears of: another replica's
    other = StreamsApi(await aiohttp_client(create_app(settings)))
    assert (await other.append("r", "s", 1, 2)).status == 201
    assert await events.records(2) == [1, 2]
    assert await db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%'") == 0


async def test_woken_subscriber_gets_the_record_without_another_append(
    aiohttp_client: Any, database_url: str, settings_for: Any
) -> None:
    """Many subscribers woken by one commit each get it, with no later append to rescue a stale read."""
    settings = settings_for(database_url, wake_poll_seconds=3600)  # no polling: the wake alone must do it
    api = StreamsApi(await aiohttp_client(create_app(settings)))
    await api.create("r", "s")
    readers = [SseReader(await subscribe(api, "r", "s")) for _ in range(20)]
    for sequence in range(1, 6):
        assert (await api.append("r", "s", sequence)).status == 201
        for reader in readers:
            assert await reader.records(1) == [sequence]


async def test_batches_locking_the_same_streams_in_opposite_orders_never_deadlock(
    api: StreamsApi, database_url: str
) -> None:
    """Two transactions, each a group commit over the same 300 streams, given in opposite orders and run
    at the same time, again and again: rows are locked in one key order, so Postgres never has to abort
    one as a deadlock (with the locks taken in request order this fails within a few rounds)."""
    streams = [f"o{i:03d}" for i in range(300)]
    async with asyncio.TaskGroup() as tasks:
        for stream in streams:
            tasks.create_task(api.create("r", stream))
    alice = Principal("alice")
    pool = await create_pool(database_url, 2, 2)

    async def batch(order: list[str]) -> None:
        async with pool.acquire() as conn, conn.transaction():
            outcomes = (await append_batch(conn, [AppendRequest("r", s, [_record(s)], alice) for s in order])).outcomes
        assert all(isinstance(o, AppendResult) for o in outcomes)

    try:
        for _ in range(10):
            await asyncio.gather(batch(streams), batch(streams[::-1]))
    finally:
        await pool.close()
    assert [r["data"] for r in await api.read_all("r", "o000")] == ["o000"] * 20


async def test_a_caller_that_goes_away_fails_nobody_else_in_its_batch(
    api: StreamsApi, database_url: str, db: asyncpg.Connection
) -> None:
    """Three appends queue behind a transaction held up by a row lock; one caller is cancelled while it
    waits. The others still get their sequences, and the cancelled one's record, already queued when
    its caller left, is committed with the batch rather than lost half-way."""
    for stream in ("held", "x", "y", "z"):
        assert (await api.create("r", stream)).status == 201
    alice = Principal("alice")
    pool = await create_pool(database_url, 1, 1)
    hub = WakeHub(PollOnly(), None, 3600)
    group = GroupCommit(pool, hub, Durability(pool))
    async with pool.acquire() as conn:  # the pool's one connection: the group commit's backend
        committer = conn.get_server_pid()
    try:
        async with db.transaction():
            await db.execute("SELECT 1 FROM wfs_streams WHERE stream_id = 'held' FOR UPDATE")
            first = asyncio.ensure_future(group.append(AppendRequest("r", "held", [_record("h")], alice)))
            # the held append is in flight (waiting for the lock), so the next three queue behind it
            await eventually(
                lambda: _blocked_by(db, committer), message="the held append never waited for the row lock"
            )
            waiting = {s: group.append(AppendRequest("r", s, [_record(s)], alice)) for s in "xyz"}
            await asyncio.sleep(0)  # each has queued its request
            waiting["y"].cancel()
        async with asyncio.timeout(15):  # a broken batch leaves its callers waiting: fail, not hang
            assert await first == AppendResult(1, 1, False)
            assert await waiting["x"] == AppendResult(1, 1, False)
            assert await waiting["z"] == AppendResult(1, 1, False)
            with pytest.raises(asyncio.CancelledError):
                await waiting["y"]
    finally:
        await pool.close()
    assert [r["data"] for r in await api.read_all("r", "y")] == ["y"]


async def test_after_a_batch_of_several_the_next_waits_for_more_and_a_lone_appender_never_does(
    api: StreamsApi, database_url: str, db: asyncpg.Connection
) -> None:
    """The gather window, made long here so nothing races it, then as served. Appends that reach the queue
    in different turns of the event loop share a transaction (one xmin on their records) only because the
    commit after a batch of several waited for them; an appender alone is never held by the window."""
    for stream in "abcdefghij":
        assert (await api.create("r", stream)).status == 201
    alice = Principal("alice")
    pool = await create_pool(database_url, 1, 1)
    hub = WakeHub(PollOnly(), None, 3600)

    def append(group: GroupCommit, stream: str) -> asyncio.Future[AppendResult]:
        return asyncio.ensure_future(group.append(AppendRequest("r", stream, [_record(stream)], alice)))

    async def xmins(*streams: str) -> set[str]:
        rows = await db.fetch(
            "SELECT r.xmin::text FROM wfs_records r JOIN wfs_streams s USING (stream_key)"
            " WHERE s.run_id = 'r' AND s.stream_id = ANY($1::text[])",
            list(streams),
        )
        return {row[0] for row in rows}

    try:
        lone = GroupCommit(pool, hub, Durability(pool), gather=lambda: asyncio.sleep(3600))
        async with asyncio.timeout(15):  # waiting for the window would take an hour
            await append(lone, "a")
            await append(lone, "b")

        busy = GroupCommit(pool, hub, Durability(pool), gather=lambda: asyncio.sleep(1.0))
        async with asyncio.timeout(15):
            await asyncio.gather(append(busy, "c"), append(busy, "d"))  # one turn, one batch of two
            assert len(await xmins("c", "d")) == 1
            e = append(busy, "e")
            for _ in range(5):
                await asyncio.sleep(0)  # e's transaction has started and is gathering
            f = append(busy, "f")
            await asyncio.gather(e, f)
        assert len(await xmins("e", "f")) == 1

        # as served: the window is turns of the event loop, so an append made one turn after the
        # transaction's task started still joins it
        served = GroupCommit(pool, hub, Durability(pool))
        async with asyncio.timeout(15):
            await asyncio.gather(append(served, "g"), append(served, "h"))
            i = append(served, "i")
            await asyncio.sleep(0)  # i's transaction has started and holds
            j = append(served, "j")
            await asyncio.gather(i, j)
        assert len(await xmins("i", "j")) == 1
    finally:
        await pool.close()


async def test_a_busy_commit_begins_the_next_transaction_and_a_quiet_one_leaves_nothing_open(
    api: StreamsApi, database_url: str, db: asyncpg.Connection
) -> None:
    """While requests wait, a COMMIT also begins the next transaction (one round trip fewer per batch).
    That begun connection, killed while the next batch gathers, costs the batch a retry on another
    connection, not an error; once nothing waits, no connection is left inside a transaction."""
    for stream in "abc":
        assert (await api.create("r", stream)).status == 201
    alice = Principal("alice")
    name = "wfs-test-begun"
    pool = await create_pool(database_url, 1, 2, server_settings={"application_name": name})
    group = GroupCommit(
        pool,
        WakeHub(PollOnly(), None, 3600),
        Durability(pool),
        max_batch=2,
        gather=lambda: asyncio.sleep(2.0),
        keep_seconds=3600,
    )

    async def in_transaction(idle_for: float = 0.0) -> list[int]:
        query = """SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'
                   AND clock_timestamp() - state_change >= make_interval(secs => $2)"""
        return [row[0] for row in await db.fetch(query, name, idle_for)]

    try:
        async with asyncio.timeout(15):
            # one turn of the event loop: a batch of two (a, b), and c queued behind it, so that COMMIT
            # begins c's transaction, which then gathers (after a batch of several) for two seconds
            tasks = [asyncio.ensure_future(group.append(AppendRequest("r", s, [_record(s)], alice))) for s in "abc"]
            # begun while c gathered, not merely between the statements of a running transaction
            (begun,) = await eventually(
                lambda: in_transaction(idle_for=0.3), message="no COMMIT began the next transaction"
            )
            assert await db.fetchval("SELECT pg_terminate_backend($1)", begun)
            assert await asyncio.gather(*tasks) == [AppendResult(1, 1, False)] * 3
            assert not await in_transaction()  # c's batch was alone, with nothing queued: no BEGIN
            await group.close()
            # the last batch of a burst, of several: its COMMIT begins a transaction that nothing takes,
            # which is rolled back and given back after keep_seconds
            brief = GroupCommit(pool, WakeHub(PollOnly(), None, 3600), Durability(pool), keep_seconds=0.5)
            pairs = [brief.append(AppendRequest("r", s, [_record(s)], alice)) for s in "ab"]
            assert await asyncio.gather(*pairs) == [AppendResult(2, 2, False)] * 2
            await eventually(lambda: in_transaction(idle_for=0.1), message="the burst's last COMMIT began nothing")
            await eventually(lambda: _not(in_transaction()), message="the unused transaction was never given back")
            await pool.close()  # waits for every connection: one kept back would hang it
    finally:
        pool.terminate()
    assert [r["data"] for r in await api.read_all("r", "c")] == ["c"]


async def test_requests_retried_alone_at_once_leave_no_transaction_open(
    api: StreamsApi, database_url: str, db: asyncpg.Connection
) -> None:
    """A batch Postgres refuses is retried request by request, all at once; with requests waiting, each
    retry's COMMIT begins the next transaction. Only one begun connection can be kept: the others must
    go back to the pool, not stay inside a transaction for the life of the process."""
    for stream in "abd":
        assert (await api.create("r", stream)).status == 201
    alice = Principal("alice")
    name = "wfs-test-retried"
    pool = await create_pool(database_url, 1, 3, server_settings={"application_name": name})
    group = GroupCommit(pool, WakeHub(PollOnly(), None, 3600), Durability(pool), max_batch=3, keep_seconds=3600)
    # inline bytes and an object at once: the records table's CHECK refuses it, and with it the batch
    refused = RecordIn("application/json", b'"x"', {"size": 3})
    try:
        async with asyncio.timeout(15):
            batch = [group.append(AppendRequest("r", s, [_record(s)], alice)) for s in "ab"]
            bad = group.append(AppendRequest("r", "a", [refused], alice))
            waiting = group.append(AppendRequest("r", "d", [_record("d")], alice))  # queued behind the batch
            assert await asyncio.gather(*batch) == [AppendResult(1, 1, False)] * 2
            with pytest.raises(asyncpg.CheckViolationError):
                await bad
            assert await waiting == AppendResult(1, 1, False)
            await group.close()  # gives back the begun connection it kept
            idle = await db.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'",
                name,
            )
            assert idle == [], "a retry's begun connection was dropped inside its transaction"
            await pool.close()
    finally:
        pool.terminate()


async def test_the_append_statements_never_scan_every_stream(database_url: str, db: asyncpg.Connection) -> None:
    """A generic plan is made once per backend, from the statistics of that moment, and kept. Made while
    the table held two streams, the lock statement's plan walked every stream row (a merge join over the
    whole primary key), and so did the counters' update, in every transaction as the table grew. In the
    append transactions every scan of wfs_streams is now an index lookup by the batch's keys: the plans
    the functions of migration 487 really run, as auto_explain reports them (nested statements, sent to
    the client as notices)."""
    await db.execute(
        """INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by)
           SELECT 'r', 's' || i, '{}'::jsonb, 'x', 'alice' FROM generate_series(1, 2) AS i"""
    )
    await db.execute("ANALYZE wfs_streams")

    async def plans(begin: str) -> list[str]:
        """The plans the append statements get in a transaction begun with ``begin``, on a new backend."""
        conn = await asyncpg.connect(database_url)
        notices: list[str] = []
        conn.add_log_listener(lambda _conn, message: notices.append(message.message))
        try:
            await conn.execute(
                "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
                " SET auto_explain.log_nested_statements = on; SET auto_explain.log_level = notice"
            )
            await conn.execute(begin)
            await conn.fetch(appends._LOCK, ["r"], ["s1"], [True])
            await conn.fetch(appends._WRITE, *([[]] * 21))
            await conn.fetch(streams._PINS_BY_KEY, [1])
            await conn.execute("ROLLBACK")
            return [n for n in notices if "Scan" in n]
        finally:
            await conn.close()

    def unbounded_scans(plan: str) -> list[str]:
        """Scans of wfs_streams not limited by an index condition on the batch's keys."""
        lines = [line.strip() for line in plan.splitlines()]
        return [
            line
            for line, after in zip(lines, [*lines[1:], ""], strict=True)
            if "Scan" in line and " on wfs_streams" in line and not after.startswith("Index Cond")
        ]

    # the premise: generic plans alone scan the whole table at this size (so this test can fail)
    assert any(unbounded_scans(plan) for plan in await plans("BEGIN; SET LOCAL plan_cache_mode = force_generic_plan"))
    reported = await plans(appends.BEGIN)
    assert any(" on wfs_streams" in plan for plan in reported), reported  # the lock's and the write's plans
    for plan in reported:
        assert unbounded_scans(plan) == [], plan


async def _not(value: Awaitable[Any]) -> bool:
    return not await value


async def _blocked_by(db: asyncpg.Connection, pid: int) -> bool:
    """Whether backend ``pid`` waits for a lock that ``db``'s backend holds (not any waiter in the
    cluster: another test's leftover backend must not pass for ours)."""
    return bool(await db.fetchval("SELECT pg_backend_pid() = ANY(pg_blocking_pids($1))", pid))


@pytest.mark.slow
def test_sse_and_blocked_credit_tests_pass_with_listen_disabled() -> None:
    """The SSE and credit test files again, every app in them poll-only (no LISTEN connection): lost or
    absent wakes cost latency, never a record or a stuck producer."""
    env = {**os.environ, "WFS_TEST_WAKE_SOURCE": "poll"}
    files = ["tests/test_sse.py", "tests/test_credit.py"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
