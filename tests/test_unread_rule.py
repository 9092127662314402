"""The unread rule is written once in the domain and once in SQL (store/usage.py): they must agree."""

from __future__ import annotations

import asyncpg

from tests.support import pins
from workflow_streams.domain import credit
from workflow_streams.domain.authz import Trusted
from workflow_streams.domain.pins import parse_pins
from workflow_streams.store import definitions, usage
from workflow_streams.store.db import create_pool


async def test_the_sql_base_sequence_is_the_domains(db: asyncpg.Connection) -> None:
    cases = [(min_ack, earliest) for min_ack in (None, 0, 1, 5, 9) for earliest in (1, 2, 6, 10)]
    sql = f"SELECT {usage.base_sequence('$1::bigint', '$2::bigint')}"
    for min_ack, earliest in cases:
        assert await db.fetchval(sql, min_ack, earliest) == credit.base_sequence(min_ack, earliest), (min_ack, earliest)


async def test_unread_items_of_real_streams(database_url: str, db: asyncpg.Connection) -> None:
    """Streams with no consumer, a slow consumer, and a consumer behind what pruning removed."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            for stream in ("none", "slow", "pruned"):
                await definitions.create_definition(conn, "r", stream, parse_pins(pins()), Trusted("test"))
    finally:
        await pool.close()
    await db.execute("UPDATE wfs_streams SET last_sequence = 10")
    await db.execute("UPDATE wfs_streams SET earliest_sequence = 8 WHERE stream_id = 'pruned'")
    await db.execute(
        """INSERT INTO wfs_consumers (consumer_id, run_id, stream_id, acked_sequence, updated_by)
           VALUES ('a', 'r', 'slow', 3, 't'), ('b', 'r', 'slow', 7, 't'), ('c', 'r', 'pruned', 2, 't')"""
    )
    rows = await db.fetch(
        f"SELECT s.stream_id, {usage.unread_items()} AS unread, m.min_ack, s.earliest_sequence, s.last_sequence"
        f" FROM wfs_streams s {usage.MIN_ACK} ORDER BY s.stream_id"
    )
    unread = {r["stream_id"]: r["unread"] for r in rows}
    assert unread == {"none": 10, "slow": 7, "pruned": 3}
    for r in rows:
        usage_value = credit.Usage(r["last_sequence"], 0, credit.base_sequence(r["min_ack"], r["earliest_sequence"]), 0)
        assert usage_value.unread_items == r["unread"]
