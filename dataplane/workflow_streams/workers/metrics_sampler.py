"""Samples gauges that live in Postgres: unread backlog, retention due, and the delivery outbox.

No sample scans all streams. The backlog is summed by a rolling pass: each sample reads the next
``SLICE`` streams in key order (keyset pagination on the primary key), and the gauge shows the total
of the last complete pass, so one sample costs the same at a thousand streams or a million (a pass
over 1,000,000 streams takes 20 samples). The top offenders are a bounded label set (``TOP_N``
series), never one series per stream. The outbox gauges read partial indexes of undelivered rows.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from dataclasses import dataclass, field

import asyncpg

from ..adapters import metrics
from ..store import db, usage

log = logging.getLogger(__name__)

SLICE = 50_000
TOP_N = 10

# unread per stream of one slice, by the one SQL writing of the unread rule (store/usage.py, held to
# domain.credit by tests/test_unread_rule.py): after the slowest ack, or after what was pruned
_SLICE_SQL = f"""
SELECT s.run_id, s.stream_id, {usage.unread_items("s", "m.min_ack")} AS unread
FROM wfs_streams s
{usage.MIN_ACK}
WHERE (s.run_id, s.stream_id) > ($1, $2)
ORDER BY s.run_id, s.stream_id
LIMIT $3
"""

_OUTBOX = """
SELECT
  (SELECT count(*) FROM wfs_input_deliveries WHERE state = 'pending') AS pending,
  (SELECT count(*) FROM wfs_input_deliveries WHERE state = 'failed') AS failed,
  (SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM wfs_input_deliveries
    WHERE state = 'pending') AS lag,
  (SELECT count(*) FROM wfs_streams WHERE next_prune_at <= now()) AS due
"""


@dataclass
class BacklogPass:
    """The rolling pass in progress and the last complete one."""

    after: tuple[str, str] = ("", "")
    total: int = 0
    streams: int = 0
    top: list[tuple[int, str, str]] = field(default_factory=list)
    complete: tuple[int, int, list[tuple[int, str, str]]] | None = None

    def add(self, rows: list[asyncpg.Record]) -> None:
        for r in rows:
            unread = int(r["unread"])
            self.total += unread
            self.streams += 1
            item = (unread, r["run_id"], r["stream_id"])
            if len(self.top) < TOP_N:
                heapq.heappush(self.top, item)
            elif item > self.top[0]:
                heapq.heapreplace(self.top, item)
        if rows:
            self.after = (rows[-1]["run_id"], rows[-1]["stream_id"])

    def finish(self) -> None:
        self.complete = (self.total, self.streams, sorted(self.top, reverse=True))
        self.after, self.total, self.streams, self.top = ("", ""), 0, 0, []


async def sample_backlog(conn: asyncpg.Connection, state: BacklogPass, slice_size: int = SLICE) -> None:
    """Advance the rolling pass by one slice; publish the gauges when a pass completes."""
    rows = list(await conn.fetch(_SLICE_SQL, *state.after, slice_size))
    state.add(rows)
    if len(rows) < slice_size:
        state.finish()
    if state.complete is not None:
        total, streams, top = state.complete
        metrics.BACKLOG_ITEMS.set(total)
        metrics.BACKLOG_STREAMS.set(streams)
        metrics.BACKLOG_TOP.set(top)


async def sample(pool: db.Pool, state: BacklogPass) -> None:
    async with pool.acquire() as conn:
        await sample_backlog(conn, state)
        row = await conn.fetchrow(_OUTBOX)
    metrics.OUTBOX_PENDING.set(row["pending"])
    metrics.DELIVERIES_FAILED.set(row["failed"])
    metrics.OUTBOX_LAG.set(float(row["lag"]))
    metrics.RETENTION_DUE.set(row["due"])


async def run_sampler(pool: db.Pool, interval_seconds: float) -> None:
    """Sample every ``interval_seconds``; a sample that fails raises, for the supervisor to restart."""
    state = BacklogPass()
    while True:
        await sample(pool, state)
        await asyncio.sleep(interval_seconds)
