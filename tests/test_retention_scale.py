"""Retention by due time (issue 14): every due stream is reached, however many exist; due-ness is durable;
holds stop pruning; replicas never prune the same stream at once; big prunes go in bounded batches.

Sweeps are driven by calling ``workers.pruner.sweep`` directly; nothing waits on a timer."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support import pins
from tests.waiting import eventually
from workflow_streams.domain.authz import Principal, Trusted
from workflow_streams.domain.pins import StreamPins
from workflow_streams.domain.records import RecordIn
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.local.process import Process
from workflow_streams.store import claims, definitions
from workflow_streams.store.appends import AppendRequest, append_batch
from workflow_streams.store.db import create_pool
from workflow_streams.store.migrate import apply_migrations
from workflow_streams.store.reads import RECORD_COLUMNS
from workflow_streams.workers import pruner

REPO = Path(__file__).resolve().parents[1]
ALICE = Principal("alice")


def _record(i: int) -> RecordIn:
    return RecordIn("application/json", str(i).encode(), None)


async def _create_streams(conn: asyncpg.Connection, run: str, count: int, retention: dict[str, Any]) -> None:
    """``count`` streams r/s0000.. with the given retention, in one statement."""
    stream_pins = StreamPins.model_validate(pins(retention=retention))
    await conn.execute(
        """INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by)
           SELECT $1, 's' || lpad(i::text, 5, '0'), $2::jsonb, $3, 'alice' FROM generate_series(1, $4) AS i""",
        run,
        json.dumps(stream_pins.stored()),
        stream_pins.digest(),
        count,
    )


async def _append(pool: asyncpg.Pool, run: str, streams: list[str], per_stream: int) -> None:
    """Real appends (the append statement keeps due-ness), one transaction for all streams."""
    requests = [AppendRequest(run, s, [_record(i) for i in range(per_stream)], ALICE) for s in streams]
    async with pool.acquire() as conn, conn.transaction():
        batch = await append_batch(conn, requests)
    assert not [o for o in batch.outcomes if isinstance(o, Exception)]


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(database_url, 1, 4)
    yield p
    await p.close()


async def _retained(db: asyncpg.Connection) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT s.stream_id, count(*) AS n FROM wfs_records r JOIN wfs_streams s USING (stream_key) GROUP BY 1"
    )
    return {r["stream_id"]: r["n"] for r in rows}


async def test_more_due_streams_than_one_claim_batch_are_all_pruned(pool: asyncpg.Pool, db: asyncpg.Connection) -> None:
    await _create_streams(db, "r", 1500, {"max_records": 1})
    streams = [f"s{i:05d}" for i in range(1, 1501)]
    await _append(pool, "r", streams, 2)
    assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE next_prune_at <= now()") == 1500

    result = await pruner.sweep(pool, "replica-a", claim_batch=500)

    assert sorted(result.claimed) == sorted(f"r/{s}" for s in streams)
    assert result.records == 1500
    assert await _retained(db) == dict.fromkeys(streams, 1)
    assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE earliest_sequence = 2") == 1500
    # nothing is due any more, and no claim is left behind
    assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE next_prune_at IS NOT NULL") == 0
    assert await db.fetchval("SELECT count(*) FROM wfs_worker_claims") == 0
    assert (await pruner.sweep(pool, "replica-a")).claimed == []


async def test_streams_not_due_are_not_visited(pool: asyncpg.Pool, db: asyncpg.Connection) -> None:
    await _create_streams(db, "r", 50, {"max_records": 5})
    await _append(pool, "r", [f"s{i:05d}" for i in range(1, 51)], 5)  # at the limit, not past it
    await _create_streams(db, "q", 3, {"max_records": 5})
    await _append(pool, "q", ["s00001", "s00002"], 6)
    result = await pruner.sweep(pool, "replica-a")
    assert sorted(result.claimed) == ["q/s00001", "q/s00002"] and result.records == 2


async def test_max_age_due_time_follows_the_oldest_record(pool: asyncpg.Pool, db: asyncpg.Connection) -> None:
    await _create_streams(db, "r", 1, {"max_age_seconds": 3600})
    await _append(pool, "r", ["s00001"], 3)
    row = await db.fetchrow(
        """SELECT s.next_prune_at, min(r.appended_at) AS oldest FROM wfs_streams s
           JOIN wfs_records r USING (stream_key) GROUP BY s.next_prune_at"""
    )
    # due no later than the oldest record ages out (early is harmless, late is not), and not now
    assert row["next_prune_at"] <= row["oldest"] + dt.timedelta(seconds=3600)
    assert await db.fetchval("SELECT next_prune_at > now() + interval '59 minutes' FROM wfs_streams")
    assert (await pruner.sweep(pool, "replica-a")).claimed == []


async def test_max_age_prunes_once_aged(pool: asyncpg.Pool, db: asyncpg.Connection) -> None:
    await _create_streams(db, "r", 1, {"max_age_seconds": 1})
    await _append(pool, "r", ["s00001"], 2)

    async def swept() -> bool:
        await pruner.sweep(pool, "replica-a")
        return await db.fetchval("SELECT earliest_sequence FROM wfs_streams") == 3

    await eventually(swept)
    assert await db.fetchval("SELECT next_prune_at FROM wfs_streams") is None
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 0


async def test_big_prune_goes_in_bounded_transactions(pool: asyncpg.Pool, db: asyncpg.Connection) -> None:
    await _create_streams(db, "r", 1, {"max_records": 10})
    await _append(pool, "r", ["s00001"], 5000)
    result = await pruner.sweep(pool, "replica-a", records_per_stream=400)
    assert result.records == 4990
    # the first pass takes 50, then 400 at a time: each its own transaction
    assert result.transactions == 1 + -(-4940 // 400)
    bounds = await db.fetchrow("SELECT earliest_sequence, last_sequence, pruned_bytes, appended_bytes FROM wfs_streams")
    assert (bounds["earliest_sequence"], bounds["last_sequence"]) == (4991, 5000)
    kept = await db.fetchval(f"SELECT sum(size_bytes) FROM (SELECT {RECORD_COLUMNS} FROM wfs_records r) t")
    assert bounds["appended_bytes"] - bounds["pruned_bytes"] == kept


async def test_holds_block_pruning_and_release_makes_the_stream_due(pool: asyncpg.Pool, db: asyncpg.Connection) -> None:
    await _create_streams(db, "r", 2, {"max_records": 2})
    for hold in ("matter-1", "matter-2"):
        await definitions.set_legal_hold(db, "r", "s00001", hold, True, "matter", Trusted("alice"))
    await _append(pool, "r", ["s00001", "s00002"], 6)

    result = await pruner.sweep(pool, "replica-a")
    assert sorted(result.claimed) == ["r/s00001", "r/s00002"] and result.held == 1
    assert await _retained(db) == {"s00001": 6, "s00002": 2}
    # the held stream is parked, not rescanned by every sweep
    assert await db.fetchval("SELECT next_prune_at > now() FROM wfs_streams WHERE stream_id = 's00001'")
    assert (await pruner.sweep(pool, "replica-a")).claimed == []

    await definitions.set_legal_hold(db, "r", "s00001", "matter-1", False, "", Trusted("alice"))
    result = await pruner.sweep(pool, "replica-a")
    assert result.claimed == ["r/s00001"] and result.held == 1 and result.records == 0, "holds stack"

    await definitions.set_legal_hold(db, "r", "s00001", "matter-2", False, "", Trusted("alice"))
    assert await db.fetchval("SELECT next_prune_at <= now() FROM wfs_streams WHERE stream_id = 's00001'")
    result = await pruner.sweep(pool, "replica-a")
    assert result.claimed == ["r/s00001"] and result.records == 4
    assert await _retained(db) == {"s00001": 2, "s00002": 2}


async def test_two_replicas_never_claim_the_same_stream(database_url: str, db: asyncpg.Connection) -> None:
    await _create_streams(db, "r", 1200, {"max_records": 1})
    streams = [f"s{i:05d}" for i in range(1, 1201)]
    pool_a = await create_pool(database_url, 1, 2)
    pool_b = await create_pool(database_url, 1, 2)
    try:
        await _append(pool_a, "r", streams, 3)
        a, b = await asyncio.gather(
            pruner.sweep(pool_a, "replica-a", claim_batch=50), pruner.sweep(pool_b, "replica-b", claim_batch=50)
        )
    finally:
        await pool_a.close()
        await pool_b.close()
    # every stream was claimed by exactly one of them, and pruned exactly once
    assert not set(a.claimed) & set(b.claimed)
    assert sorted(a.claimed + b.claimed) == sorted(f"r/{s}" for s in streams)
    assert a.records + b.records == 2400
    assert await _retained(db) == dict.fromkeys(streams, 1)


async def test_a_live_claim_is_left_alone_and_an_expired_one_taken_over(
    pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    await _create_streams(db, "r", 3, {"max_records": 1})
    await _append(pool, "r", ["s00001", "s00002", "s00003"], 2)
    # replica-a claims one stream and dies before pruning it
    due_by = await db.fetchval("SELECT now()")
    held = await claims.claim_due_streams(db, pruner.KIND, "replica-a", pruner.LEASE, due_by, 1)
    assert len(held) == 1
    result = await pruner.sweep(pool, "replica-b")
    assert sorted(result.claimed) == sorted({"r/s00001", "r/s00002", "r/s00003"} - set(held))
    assert await db.fetchval("SELECT holder FROM wfs_worker_claims") == "replica-a"
    await db.execute("UPDATE wfs_worker_claims SET lease_expires_at = now() - interval '1 second'")
    assert (await pruner.sweep(pool, "replica-b")).claimed == held
    assert await _retained(db) == {"s00001": 1, "s00002": 1, "s00003": 1}


_SWEEPER = """
import asyncio, datetime, sys
from workflow_streams.store.db import create_pool
from workflow_streams.workers import pruner

async def main():
    pool = await create_pool(sys.argv[1], 1, 1)
    await pruner.sweep(pool, "doomed-replica", lease=datetime.timedelta(seconds=2), records_per_stream=10)
    print("finished", flush=True)

asyncio.run(main())
"""


@pytest.mark.slow  # its own Postgres cluster, a child process killed mid-sweep, a crash restart
async def test_due_ness_survives_a_crash_mid_sweep_and_a_database_restart(
    own_pg: LocalPostgres, tmp_path: Path
) -> None:
    await apply_migrations(own_pg.dsn)
    conn = await asyncpg.connect(own_pg.dsn)
    pool = await create_pool(own_pg.dsn, 1, 2)
    try:
        await _create_streams(conn, "r", 2, {"max_records": 10})
        await _append(pool, "r", ["s00001"], 30_000)
        await _append(pool, "r", ["s00002"], 20)
        # a replica starts the sweep and is killed in the middle of the big stream
        proc = Process(
            [sys.executable, "-c", _SWEEPER, own_pg.dsn],
            log=tmp_path / "sweeper.log",
            env={**os.environ, "PYTHONPATH": str(REPO / "dataplane")},
            name="sweeper",
        )
        try:
            await eventually(
                lambda: conn.fetchval("SELECT earliest_sequence > 100 FROM wfs_streams WHERE stream_id = 's00001'"),
                within=60,
            )
        finally:
            proc.kill()
            proc.stop()
        assert "finished" not in proc.output()
        earliest = await conn.fetchval("SELECT earliest_sequence FROM wfs_streams WHERE stream_id = 's00001'")
        assert earliest < 29_991, "the sweep was killed before it finished"
        # the big stream is still due; its claim is the dead replica's until the lease runs out
        assert await conn.fetchval("SELECT next_prune_at <= now() FROM wfs_streams WHERE stream_id = 's00001'")
        assert await conn.fetchval("SELECT holder FROM wfs_worker_claims WHERE claim_key = 'r/s00001'") == (
            "doomed-replica"
        )
        await pool.close()
        await conn.close()

        own_pg.restart("immediate")  # a crash of the database too: WAL recovery

        pool = await create_pool(own_pg.dsn, 1, 2)
        conn = await asyncpg.connect(own_pg.dsn)
        assert await conn.fetchval("SELECT next_prune_at <= now() FROM wfs_streams WHERE stream_id = 's00001'")

        async def pruned() -> bool:
            await pruner.sweep(pool, "survivor")
            return await _retained(conn) == {"s00001": 10, "s00002": 10}

        await eventually(pruned, within=30)
        assert await conn.fetchval("SELECT count(*) FROM wfs_worker_claims") == 0
    finally:
        await pool.close()
        await conn.close()
