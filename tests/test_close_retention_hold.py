"""Close, retention pruning with 410 resync, and legal holds that stop pruning."""

from __future__ import annotations

import asyncpg

from tests.support import EVE, StreamsApi, problem
from tests.waiting import eventually
from workflow_streams.store.db import create_pool
from workflow_streams.workers import pruner


async def test_close_rejects_appends_and_keeps_reads(api: StreamsApi) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1, 2, key="before-close")
    await problem(await api.as_(EVE).close("r", "s"), 403, "forbidden")
    resp = await api.close("r", "s")
    assert resp.status == 200
    state = await resp.json()
    assert state["closed"] is True and state["closed_by"] == "alice"
    await problem(await api.append("r", "s", 3), 409, "stream_closed")
    # a retry of an append that succeeded before the close still gets its receipt
    replay = await api.append("r", "s", 1, 2, key="before-close")
    assert replay.status == 200 and (await replay.json())["sequences"] == [1, 2]
    page = await (await api.read("r", "s")).json()
    assert [r["sequence"] for r in page["records"]] == [1, 2] and page["closed"] is True
    assert (await api.close("r", "s")).status == 200  # idempotent


async def _sweep(database_url: str) -> pruner.SweepResult:
    """One pruner sweep, as a replica's background worker runs it (tests drive sweeps directly)."""
    pool = await create_pool(database_url, 1, 1)
    try:
        return await pruner.sweep(pool, "test-replica")
    finally:
        await pool.close()


async def test_pruned_cursor_gets_410_with_bounds(api: StreamsApi, database_url: str, db: asyncpg.Connection) -> None:
    await api.create("r", "s", retention={"max_records": 3})
    await api.append("r", "s", *range(10))
    assert (await _sweep(database_url)).records == 7
    assert await db.fetchval("SELECT earliest_sequence FROM wfs_streams") == 8
    body = await problem(await api.read("r", "s", after=2), 410, "cursor_expired")
    assert body["requested"] == 3 and body["earliest"] == 8 and body["latest"] == 10
    assert body["reason"] == "retention_pruned"
    # the boundary: after=7 asks for 8, which still exists
    page = await (await api.read("r", "s", after=7)).json()
    assert [r["sequence"] for r in page["records"]] == [8, 9, 10]
    await problem(await api.read("r", "s", after=6), 410, "cursor_expired")
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 3


async def test_max_age_retention(api: StreamsApi, database_url: str, db: asyncpg.Connection) -> None:
    await api.create("r", "s", retention={"max_age_seconds": 1})
    await api.append("r", "s", 1, 2)

    async def all_pruned() -> bool:
        await _sweep(database_url)
        return await db.fetchval("SELECT earliest_sequence FROM wfs_streams") == 3

    await eventually(all_pruned)
    page = await (await api.read("r", "s", after=2)).json()
    assert page["records"] == [] and page["earliest"] == 3 and page["latest"] == 2
    await problem(await api.read("r", "s", after=0), 410, "cursor_expired")


async def test_legal_hold_blocks_pruning_until_released(
    api: StreamsApi, database_url: str, db: asyncpg.Connection
) -> None:
    await api.create("r", "s", retention={"max_records": 2})
    resp = await api.hold("r", "s", True, "matter 42", hold_id="matter-42")
    assert resp.status == 200
    state = await resp.json()
    assert state["legal_hold"] is True
    (hold,) = state["legal_holds"]
    assert hold["hold_id"] == "matter-42" and hold["held_by"] == "alice" and hold["reason"] == "matter 42"
    assert hold["held_at"]
    await api.hold("r", "s", True, "second matter", hold_id="matter-43")

    await api.append("r", "s", *range(6))
    swept = await _sweep(database_url)
    assert swept.claimed == ["r/s"] and swept.held == 1 and swept.records == 0
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 6
    assert (await (await api.read("r", "s", after=0)).json())["records"][0]["sequence"] == 1

    await api.hold("r", "s", False, hold_id="matter-42")
    swept = await _sweep(database_url)
    assert swept.claimed == ["r/s"] and swept.held == 1, "the release made it due; the other hold still stops it"
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 6, "holds stack: one remains"

    await api.hold("r", "s", False, hold_id="matter-43")
    assert (await _sweep(database_url)).records == 4
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 2
    released = await db.fetch("SELECT released_by, released_at FROM wfs_legal_holds ORDER BY hold_id")
    assert all(r["released_by"] == "alice" and r["released_at"] for r in released)


async def test_legal_hold_input_validation(api: StreamsApi) -> None:
    await api.create("r", "s")
    await problem(await api.hold("r", "s", True, ""), 400, "invalid_input")
    await problem(await api.hold("r", "s", "yes"), 400, "invalid_input")  # type: ignore[arg-type]
    await problem(await api.hold("r", "s", True, "x", hold_id="../x"), 400, "invalid_input")
    await problem(await api.as_(EVE).hold("r", "s", True), 403, "forbidden")
