"""Samples gauges that live in Postgres: unread backlog and the delivery outbox."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from .. import metrics
from ..store.db import DB_UNAVAILABLE

log = logging.getLogger(__name__)

# one pass over streams: fine for periodic sampling, not for a hot path
_SAMPLE = """
SELECT
  (SELECT coalesce(sum(s.last_sequence - greatest(coalesce(c.min_ack, 0), s.earliest_sequence - 1)), 0)
     FROM wfs_streams s
     LEFT JOIN (SELECT run_id, stream_id, min(acked_sequence) AS min_ack FROM wfs_consumers
                GROUP BY run_id, stream_id) c USING (run_id, stream_id)) AS backlog,
  (SELECT count(*) FROM wfs_input_deliveries WHERE state = 'pending') AS pending,
  (SELECT count(*) FROM wfs_input_deliveries WHERE state = 'failed') AS failed,
  (SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM wfs_input_deliveries
    WHERE state = 'pending') AS lag
"""


async def sample(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(_SAMPLE)
    metrics.BACKLOG_ITEMS.set(row["backlog"])
    metrics.OUTBOX_PENDING.set(row["pending"])
    metrics.DELIVERIES_FAILED.set(row["failed"])
    metrics.OUTBOX_LAG.set(float(row["lag"]))


async def run_sampler(pool: asyncpg.Pool, interval_seconds: float) -> None:
    while True:
        try:
            await sample(pool)
        except (*DB_UNAVAILABLE, asyncpg.PostgresError) as exc:
            log.debug("metrics sample failed: %s", exc)
        await asyncio.sleep(interval_seconds)
