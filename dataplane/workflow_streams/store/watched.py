"""Marking streams as watched (``wfs_streams.watched_until``, migration 485), so that appenders in other
processes know their commits must be announced (``runtime.interest``)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

# Rows are locked first, in key order, as every multi-stream locker does (store.appends.lock_streams), so
# a mark never deadlocks with a group commit; the UPDATE then finds them by their surrogate keys (an index
# condition, whatever plan is cached). Taking the row lock is the point: an append holds it from its
# decision to announce until its COMMIT, so it either committed before the mark or reads the mark.
_MARK = """
WITH locked AS MATERIALIZED (
    SELECT s.stream_key
    FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(run_id, stream_id, position)
    CROSS JOIN LATERAL (
        SELECT w.stream_key FROM wfs_streams w WHERE w.run_id = k.run_id AND w.stream_id = k.stream_id FOR UPDATE
    ) s
    ORDER BY k.position
)
UPDATE wfs_streams SET watched_until = now() + make_interval(secs => $3)
WHERE stream_key = ANY(ARRAY(SELECT stream_key FROM locked))
RETURNING run_id, stream_id
"""

# keys per statement: bounded so one mark never builds a huge statement
CHUNK = 1000


async def mark(conn: asyncpg.Connection, keys: Sequence[tuple[str, str]], seconds: float) -> set[tuple[str, str]]:
    """Mark the existing streams among ``keys`` (at most ``CHUNK``) as watched for ``seconds`` from now
    (Postgres' clock); returns the keys it marked. The caller's transaction holds the row locks until it
    commits."""
    assert len(keys) <= CHUNK
    unique = sorted(set(keys))
    rows = await conn.fetch(_MARK, [k[0] for k in unique], [k[1] for k in unique], seconds)
    return {(r["run_id"], r["stream_id"]) for r in rows}
