"""Acknowledgements only advance and stay in their scope."""

from __future__ import annotations

import asyncpg

from tests.support import BOB, EVE, StreamsApi, problem


async def test_ack_advances_and_never_regresses(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1, 2, 3)
    resp = await api.ack("r", "s", "c1", 2)
    assert resp.status == 200
    assert await resp.json() == {"consumer_id": "c1", "acked_sequence": 2}
    assert (await api.ack("r", "s", "c1", 2)).status == 200  # same position: a no-op
    body = await problem(await api.ack("r", "s", "c1", 1), 409, "ack_regression")
    assert body["acked_sequence"] == 2
    assert await db.fetchval("SELECT acked_sequence FROM wfs_consumers WHERE consumer_id = 'c1'") == 2


async def test_future_ack_is_refused(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1)
    await problem(await api.ack("r", "s", "c1", 2), 400, "future_sequence")
    assert await db.fetchval("SELECT count(*) FROM wfs_consumers") == 0


async def test_bad_ack_bodies(api: StreamsApi) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1)
    for bad in (-1, "1", 1.0, None, True, 2**63):
        await problem(await api.ack("r", "s", "c1", bad), 400, "invalid_input")


async def test_cross_scope_ack_is_forbidden(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    await api.create("r", "other")
    await api.create("r2", "s")
    for run, stream in (("r", "s"), ("r", "other"), ("r2", "s")):
        await api.append(run, stream, 1, 2)
    await api.ack("r", "s", "c1", 1)
    await problem(await api.ack("r", "other", "c1", 2), 403, "consumer_scope_mismatch")
    await problem(await api.ack("r2", "s", "c1", 2), 403, "consumer_scope_mismatch")
    row = await db.fetchrow("SELECT run_id, stream_id, acked_sequence FROM wfs_consumers WHERE consumer_id = 'c1'")
    assert tuple(row) == ("r", "s", 1)


async def test_ack_needs_the_ack_right(api: StreamsApi) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1)
    await problem(await api.as_(EVE).ack("r", "s", "c1", 1), 403, "forbidden")
    assert (await api.as_(BOB).ack("r", "s", "c1", 1)).status == 200  # via group:readers
