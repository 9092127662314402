"""The input-delivery outbox: rows written with their records, delivered in sequence per stream."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..domain.records import StoredRecord
from .reads import RECORD_COLUMNS, stored_record
from .wal import TIMELINE

# A stream is due when its head (lowest undelivered row) is pending and its time has come.
# A failed head blocks the rows behind it: per-stream order is never given up silently.
# The heads are found by a skip scan of the partial index wfs_input_deliveries_head: one index probe per
# stream with undelivered rows, instead of reading and sorting every undelivered row on every poll
# (figures: bench/README.md, constants).
_DUE_STREAMS = """
WITH RECURSIVE heads AS (
    (SELECT d.run_id, d.stream_id, d.state, d.next_attempt_at FROM wfs_input_deliveries d
     WHERE d.state IN ('pending', 'failed')
     ORDER BY d.run_id, d.stream_id, d.sequence LIMIT 1)
    UNION ALL
    SELECT n.run_id, n.stream_id, n.state, n.next_attempt_at FROM heads h
    CROSS JOIN LATERAL (
        SELECT d.run_id, d.stream_id, d.state, d.next_attempt_at FROM wfs_input_deliveries d
        WHERE d.state IN ('pending', 'failed') AND (d.run_id, d.stream_id) > (h.run_id, h.stream_id)
        ORDER BY d.run_id, d.stream_id, d.sequence LIMIT 1) n
)
SELECT run_id || '/' || stream_id AS key FROM heads
WHERE state = 'pending' AND next_attempt_at <= now()
  AND NOT EXISTS (SELECT 1 FROM wfs_worker_claims c
                  WHERE c.worker_kind = $1 AND c.claim_key = heads.run_id || '/' || heads.stream_id)
LIMIT $2
"""

# the record's columns first (``stored_record`` reads them by position); records are keyed by the
# stream's surrogate key (migration 482), deliveries by its names
_HEAD = f"""
SELECT {RECORD_COLUMNS}, d.event_id, d.attempts, d.next_attempt_at <= now() AS due, d.state,
       {TIMELINE} AS timeline
FROM wfs_streams s
JOIN wfs_input_deliveries d ON d.run_id = s.run_id AND d.stream_id = s.stream_id
JOIN wfs_records r ON r.stream_key = s.stream_key AND r.sequence = d.sequence
WHERE s.run_id = $1 AND s.stream_id = $2 AND d.state IN ('pending', 'failed')
ORDER BY d.sequence
LIMIT $3
"""


@dataclass(frozen=True, slots=True)
class Undelivered:
    """An outbox row not yet delivered, with its record."""

    record: StoredRecord
    event_id: str
    attempts: int
    # its next attempt's time has come
    due: bool
    state: str  # "pending" or "failed"
    # the WAL timeline it was read on (store.wal)
    timeline: str


async def due_streams(conn: asyncpg.Connection, kind: str, limit: int) -> list[str]:
    return [r["key"] for r in await conn.fetch(_DUE_STREAMS, kind, limit)]


async def head(conn: asyncpg.Connection, run_id: str, stream_id: str, limit: int) -> list[Undelivered]:
    return [
        Undelivered(stored_record(r), r["event_id"], r["attempts"], r["due"], r["state"], r["timeline"])
        for r in await conn.fetch(_HEAD, run_id, stream_id, limit)
    ]


async def mark_delivered(conn: asyncpg.Connection, run_id: str, stream_id: str, sequence: int) -> None:
    await conn.execute(
        """UPDATE wfs_input_deliveries
           SET state = 'delivered', delivered_at = now(), attempts = attempts + 1, last_error = NULL
           WHERE run_id = $1 AND stream_id = $2 AND sequence = $3""",
        run_id,
        stream_id,
        sequence,
    )


async def mark_retry(
    conn: asyncpg.Connection, run_id: str, stream_id: str, sequence: int, delay: dt.timedelta, error: str
) -> None:
    await conn.execute(
        """UPDATE wfs_input_deliveries
           SET attempts = attempts + 1, next_attempt_at = now() + $4::interval, last_error = $5
           WHERE run_id = $1 AND stream_id = $2 AND sequence = $3""",
        run_id,
        stream_id,
        sequence,
        delay,
        error[:2000],
    )


async def mark_failed(conn: asyncpg.Connection, run_id: str, stream_id: str, sequence: int, error: str) -> None:
    await conn.execute(
        """UPDATE wfs_input_deliveries SET state = 'failed', attempts = attempts + 1, last_error = $4
           WHERE run_id = $1 AND stream_id = $2 AND sequence = $3""",
        run_id,
        stream_id,
        sequence,
        error[:2000],
    )


async def requeue_failed(conn: asyncpg.Connection, run_id: str, stream_id: str) -> int:
    """After the wait service is fixed: failed rows become pending again, in order."""
    result = await conn.execute(
        """UPDATE wfs_input_deliveries SET state = 'pending', next_attempt_at = now()
           WHERE run_id = $1 AND stream_id = $2 AND state = 'failed'""",
        run_id,
        stream_id,
    )
    return int(result.split()[-1])


async def summary(conn: asyncpg.Connection, run_id: str, stream_id: str) -> dict[str, Any]:
    counts = await conn.fetch(
        """SELECT state, count(*) AS n FROM wfs_input_deliveries
           WHERE run_id = $1 AND stream_id = $2 GROUP BY state""",
        run_id,
        stream_id,
    )
    failed = await conn.fetch(
        """SELECT sequence, event_id, attempts, last_error FROM wfs_input_deliveries
           WHERE run_id = $1 AND stream_id = $2 AND state = 'failed' ORDER BY sequence LIMIT 100""",
        run_id,
        stream_id,
    )
    pending_head = await conn.fetchrow(
        """SELECT sequence, attempts, next_attempt_at, last_error FROM wfs_input_deliveries
           WHERE run_id = $1 AND stream_id = $2 AND state = 'pending' ORDER BY sequence LIMIT 1""",
        run_id,
        stream_id,
    )
    by_state = {"pending": 0, "delivered": 0, "failed": 0} | {r["state"]: r["n"] for r in counts}
    return {
        "counts": by_state,
        "failed": [dict(r) for r in failed],
        "next": None
        if pending_head is None
        else {**dict(pending_head), "next_attempt_at": pending_head["next_attempt_at"].isoformat()},
    }
