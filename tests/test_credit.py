"""Producer credit from durable unread state, over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from tests.support import StreamsApi, credit, metric, problem
from tests.waiting import eventually
from workflow_streams.shells.compose import create_app


async def test_reject_policy_returns_429_until_acked(api: StreamsApi) -> None:
    await api.create("r", "s", credit={"max_unread_items": 3, "max_unread_bytes": 10_000, "policy": "reject"})
    assert (await api.append("r", "s", 1, 2, 3)).status == 201
    resp = await api.append("r", "s", 4)
    body = await problem(resp, 429, "backpressure")
    assert resp.headers["Retry-After"] == "1"
    assert body["unread_items"] == 3

    assert (await api.ack("r", "s", "c1", 2)).status == 200
    assert (await api.append("r", "s", 4)).status == 201, "two acked records free two items of credit"
    assert (await api.append("r", "s", 5)).status == 201
    await problem(await api.append("r", "s", 6), 429, "backpressure")


async def test_credit_follows_the_slowest_consumer(api: StreamsApi) -> None:
    await api.create("r", "s", credit={"max_unread_items": 2, "max_unread_bytes": 10_000})
    await api.append("r", "s", 1, 2)
    await api.ack("r", "s", "fast", 2)
    await api.ack("r", "s", "slow", 0)
    await problem(await api.append("r", "s", 3), 429, "backpressure")
    await api.ack("r", "s", "slow", 1)
    assert (await api.append("r", "s", 3)).status == 201


async def test_unread_bytes_ceiling(api: StreamsApi) -> None:
    # each record {"data": "xxxxxxxx"} is 10 bytes of JSON
    await api.create("r", "s", credit={"max_unread_items": 100, "max_unread_bytes": 25})
    assert (await api.append("r", "s", "x" * 8, "x" * 8)).status == 201
    await problem(await api.append("r", "s", "x" * 8), 429, "backpressure")
    await api.ack("r", "s", "c", 1)
    assert (await api.append("r", "s", "x" * 8)).status == 201


async def test_batch_larger_than_the_ceiling_is_refused_outright(api: StreamsApi) -> None:
    await api.create("r", "s", credit={"max_unread_items": 2, "max_unread_bytes": 10_000, "policy": "block"})
    await problem(await api.append("r", "s", 1, 2, 3), 422, "batch_exceeds_credit")


async def test_block_policy_waits_for_an_ack(api: StreamsApi) -> None:
    await api.create("r", "s", credit=credit(1, "block", block_timeout_ms=10_000))
    await api.append("r", "s", 1)
    waits = metric("wfs_credit_waits_total")
    blocked = asyncio.create_task(api.append("r", "s", 2))
    # the server counts an append as it starts waiting for credit: it was refused and is now waiting
    await eventually(lambda: metric("wfs_credit_waits_total") > waits, message="the append never waited")
    assert not blocked.done(), "the append must wait while the unread ceiling is reached"
    await api.ack("r", "s", "c", 1)
    resp = await asyncio.wait_for(blocked, timeout=5)
    assert resp.status == 201
    assert (await resp.json())["sequences"] == [2]


async def test_block_policy_times_out_with_429(api: StreamsApi) -> None:
    await api.create("r", "s", credit=credit(1, "block", block_timeout_ms=300))
    await api.append("r", "s", 1)
    waits = metric("wfs_credit_waits_total")
    resp = await api.append("r", "s", 2)
    await problem(resp, 429, "backpressure")
    assert metric("wfs_credit_waits_total") > waits, "it waited for credit before answering 429"
    assert "Retry-After" in resp.headers


async def test_total_quota_exhausted_leaves_stream_unchanged(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s", credit={"max_unread_items": 100, "max_unread_bytes": 10_000, "max_total_items": 3})
    await api.append("r", "s", 1, 2)
    before = await db.fetchrow("SELECT last_sequence, appended_bytes FROM wfs_streams")
    await problem(await api.append("r", "s", 3, 4), 409, "quota_exhausted")
    await api.ack("r", "s", "c", 2)
    await problem(await api.append("r", "s", 3, 4), 409, "quota_exhausted")
    after = await db.fetchrow("SELECT last_sequence, appended_bytes FROM wfs_streams")
    assert before == after
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 2
    assert (await api.append("r", "s", 3)).status == 201


async def test_total_bytes_quota(api: StreamsApi) -> None:
    await api.create("r", "s", credit={"max_unread_items": 100, "max_unread_bytes": 10_000, "max_total_bytes": 5})
    assert (await api.append("r", "s", "abc")).status == 201  # 5 bytes of JSON
    await problem(await api.append("r", "s", 1), 409, "quota_exhausted")


async def test_credit_is_shared_across_replicas(
    api: StreamsApi, aiohttp_client: Any, database_url: str, settings_for: Any
) -> None:
    """A second data-plane app on the same database sees the same credit: nothing is in process memory."""
    other = StreamsApi(await aiohttp_client(create_app(settings_for(database_url))))
    await api.create(
        "r",
        "s",
        credit={
            "max_unread_items": 2,
            "max_unread_bytes": 10_000,
            "policy": "block",
            "block_timeout_ms": 10_000,
        },
    )
    await api.append("r", "s", 1)
    await other.append("r", "s", 2)
    waits = metric("wfs_credit_waits_total")
    blocked = asyncio.create_task(api.append("r", "s", 3))
    await eventually(lambda: metric("wfs_credit_waits_total") > waits, message="the append never waited")
    assert not blocked.done()
    # the ack arrives at the other replica; the blocked replica is woken through Postgres
    await other.ack("r", "s", "c", 2)
    resp = await asyncio.wait_for(blocked, timeout=5)
    assert resp.status == 201
