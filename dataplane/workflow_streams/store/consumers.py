"""Consumer acknowledgements: they only advance, and they free producer credit."""

from __future__ import annotations

from typing import Any

import asyncpg

from ..domain.authz import Access, Principal
from ..domain.errors import AckRegression, ConsumerScopeMismatch, FutureAck
from ..domain.wakes import Changed, acked
from . import db, streams


async def ack(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    consumer_id: str,
    sequence: int,
    principal: Principal,
) -> Changed[dict[str, Any]]:
    """Advance ``consumer_id``'s ack to ``sequence`` (registering it on its first ack); acks only advance.
    Blocked appenders are woken once it commits (also when a new consumer registers: the credit rule
    counts from the slowest consumer)."""
    async with db.transaction(conn):
        stream = await streams.load(conn, run_id, stream_id, access=Access(principal, "ack"))
        if sequence > stream.last_sequence:
            raise FutureAck(
                f"sequence {sequence} is past the latest sequence {stream.last_sequence}",
                latest=stream.last_sequence,
            )
        await conn.execute(
            """INSERT INTO wfs_consumers (consumer_id, run_id, stream_id, acked_sequence, updated_by)
               VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer_id) DO NOTHING""",
            consumer_id,
            run_id,
            stream_id,
            sequence,
            principal.name,
        )
        consumer = await conn.fetchrow(
            "SELECT run_id, stream_id, acked_sequence FROM wfs_consumers WHERE consumer_id = $1 FOR UPDATE",
            consumer_id,
        )
        if (consumer["run_id"], consumer["stream_id"]) != (run_id, stream_id):
            raise ConsumerScopeMismatch("this consumer belongs to another stream")
        current = consumer["acked_sequence"]
        if sequence < current:
            raise AckRegression(f"consumer already acknowledged {current}; acks only advance", acked_sequence=current)
        if sequence > current:
            await conn.execute(
                """UPDATE wfs_consumers SET acked_sequence = $2, updated_at = now(), updated_by = $3
                   WHERE consumer_id = $1""",
                consumer_id,
                sequence,
                principal.name,
            )
        answer = {"consumer_id": consumer_id, "acked_sequence": sequence}
        return Changed(answer, (acked(run_id, stream_id, sequence),))
