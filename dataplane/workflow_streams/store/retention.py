"""Pruning records beyond a stream's pinned retention. Legal holds stop it.

Each stream says when it is next due (``wfs_streams.next_prune_at``, migration 479): the append
statement sets it (now, once past ``max_records``; else when the oldest record ages out), a prune sets
it exactly from the oldest record left, a hold's release makes the stream due again. A sweep reads
only the due streams, through a partial index, so its cost follows what is due, not what exists.

Deletes are bounded: one transaction removes at most ``records`` records of a stream, so the stream's
row lock (which appends need) is held for one short statement however much is prunable. A stream left
with more to prune stays due and is continued in the next transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from . import db
from .appends import StreamKey

# how far ahead a held stream is parked: a hold's release makes it due at once (the trigger of
# migration 479); the park only bounds how long a missed release could leave it unvisited
HELD_PARK = dt.timedelta(hours=1)
# records one transaction removes from one stream: bounds how long an append can wait on the prune
RECORDS_PER_STREAM = 1000
# records one transaction removes over all its streams
RECORDS_PER_TRANSACTION = 5000


async def is_held(conn: asyncpg.Connection, run_id: str, stream_id: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM wfs_active_holds WHERE run_id = $1 AND stream_id = $2)",
            run_id,
            stream_id,
        )
    )


# Lock first, in its own statement: the prune statement then takes its snapshot with every row held,
# so no append can commit records it would not see (a cutoff past what it sees would orphan them).
_LOCK = """
SELECT 1 FROM wfs_streams s
JOIN unnest($1::text[], $2::text[]) AS k(run_id, stream_id) USING (run_id, stream_id)
ORDER BY s.run_id, s.stream_id
FOR UPDATE OF s
"""

# One statement prunes a set of locked streams: a prefix of each, at most $3 records of each.
# appended_at is taken under the row lock, so it ascends with the sequence: the aged records are a
# prefix, found on the primary key within the batch window (no index on appended_at is needed).
# Records are keyed by the stream's surrogate key (migration 482); the outbox keeps the stream's names.
_PRUNE = """
WITH plan AS (
    SELECT s.run_id, s.stream_id, s.stream_key, s.last_sequence, s.earliest_sequence,
           s.retention_max_records AS max_records, s.retention_max_age_seconds AS max_age,
           EXISTS (SELECT 1 FROM wfs_active_holds h
                   WHERE h.run_id = s.run_id AND h.stream_id = s.stream_id) AS held,
           least(s.earliest_sequence - 1 + $3,
                 greatest(s.earliest_sequence - 1, s.last_sequence - s.retention_max_records, aged.sequence))
               AS cutoff
    FROM wfs_streams s
    JOIN unnest($1::text[], $2::text[]) AS k(run_id, stream_id) USING (run_id, stream_id)
    LEFT JOIN LATERAL (
        SELECT max(r.sequence) AS sequence FROM wfs_records r
        WHERE s.retention_max_age_seconds IS NOT NULL
          AND r.stream_key = s.stream_key
          AND r.sequence BETWEEN s.earliest_sequence AND s.earliest_sequence - 1 + $3
          AND r.appended_at < now() - make_interval(secs => s.retention_max_age_seconds)
    ) aged ON true
), doomed AS (
    DELETE FROM wfs_records r USING plan p
    WHERE NOT p.held AND r.stream_key = p.stream_key
      AND r.sequence BETWEEN p.earliest_sequence AND p.cutoff
    RETURNING r.stream_key, r.sequence, r.cumulative_bytes, r.object
), outbox AS (
    INSERT INTO wfs_deletion_outbox (run_id, stream_id, region, bucket, object_key, reason)
    SELECT p.run_id, p.stream_id, d.object->>'region', d.object->>'bucket', d.object->>'key', 'retention'
    FROM doomed d JOIN plan p USING (stream_key) WHERE d.object IS NOT NULL
), last_doomed AS (
    SELECT DISTINCT ON (stream_key) stream_key, sequence, cumulative_bytes
    FROM doomed ORDER BY stream_key, sequence DESC
), after AS (
    SELECT p.*, coalesce(d.sequence + 1, p.earliest_sequence) AS new_earliest, d.cumulative_bytes
    FROM plan p LEFT JOIN last_doomed d USING (stream_key)
)
UPDATE wfs_streams s
SET earliest_sequence = a.new_earliest,
    pruned_bytes = coalesce(a.cumulative_bytes, s.pruned_bytes),
    next_prune_at = CASE
        WHEN a.held THEN now() + $4::interval
        WHEN a.last_sequence - a.new_earliest >= a.max_records THEN now()
        WHEN a.max_age IS NOT NULL AND a.last_sequence >= a.new_earliest THEN
            (SELECT r.appended_at FROM wfs_records r
             WHERE r.stream_key = a.stream_key AND r.sequence = a.new_earliest)
            + make_interval(secs => a.max_age)
    END
FROM after a
WHERE s.run_id = a.run_id AND s.stream_id = a.stream_id
RETURNING s.run_id, s.stream_id, a.held, a.new_earliest - a.earliest_sequence AS removed,
          s.next_prune_at <= now() AS more
"""


@dataclass(frozen=True)
class Pruned:
    """What one bounded prune did to one stream."""

    key: StreamKey
    removed: int
    held: bool
    # still due right away: the batch bound stopped it, not the retention
    more: bool


async def prune_batch(
    conn: asyncpg.Connection, keys: Sequence[StreamKey], records_per_stream: int = RECORDS_PER_STREAM
) -> list[Pruned]:
    """One short transaction: remove at most ``records_per_stream`` prunable records from each of
    ``keys``, queue the objects of removed records for deletion, and set each stream's next due time.
    Held streams are left alone and parked. Streams that do not exist are skipped."""
    unique = sorted(set(keys))
    runs, streams = [k[0] for k in unique], [k[1] for k in unique]
    async with db.transaction(conn):
        await conn.execute(_LOCK, runs, streams)
        rows = await conn.fetch(_PRUNE, runs, streams, records_per_stream, HELD_PARK)
    return [Pruned((r["run_id"], r["stream_id"]), r["removed"], r["held"], bool(r["more"])) for r in rows]


async def prune_stream(
    conn: asyncpg.Connection, run_id: str, stream_id: str, records_per_stream: int = RECORDS_PER_STREAM
) -> int:
    """Remove everything of one stream that is beyond retention, in bounded transactions; returns how
    many records. Objects of pruned records go to the deletion outbox with them."""
    removed = 0
    while True:
        results = await prune_batch(conn, [(run_id, stream_id)], records_per_stream)
        removed += sum(r.removed for r in results)
        if not any(r.more for r in results):
            return removed


async def due_now(conn: asyncpg.Connection) -> dt.datetime:
    """The database's clock: a sweep takes only streams due by its start, so streams that appends make
    due again while it runs wait for the next sweep and a sweep always ends."""
    value: dt.datetime = await conn.fetchval("SELECT now()")
    return value
