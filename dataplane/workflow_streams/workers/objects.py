"""The object janitor: expires orphaned intents and deletes queued objects from S3.

Deletions are claimed with a lease on ``next_attempt_at`` (FOR UPDATE SKIP LOCKED), so any number of
replicas share the work. Deletions of streams under a legal hold are parked until the release; S3
Object Lock refuses the delete anyway if a hold lands between the claim and the call.

Work follows what is due: a sweep reads due rows through their index, in batches, and keeps going
while batches come back full (up to ``MAX_BATCHES``), so a burst of pruned objects drains at S3's pace
rather than one batch per interval; an idle sweep is three index probes.

Finished rows are kept for a retention period (``WFS_DELETION_OUTBOX_RETENTION_SECONDS``) and then
purged by the same sweep, oldest first, in batches of ``PURGE_BATCH`` (at most ``MAX_PURGE_BATCHES``
a sweep: more than a sweep can finish, so the table stays at about one retention period of deletions).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass

import asyncpg
from botocore.exceptions import BotoCoreError, ClientError

from ..adapters.objectstore import ObjectStore
from ..domain.delivery import backoff_seconds
from ..store import db, objects

log = logging.getLogger(__name__)

_LEASE = dt.timedelta(seconds=60)


BATCH = 50
# batches per sweep: bounds one sweep's length; what is left is due at the next sweep
MAX_BATCHES = 20
# S3 deletes in flight at once
CONCURRENCY = 8
# finished rows removed per statement, and statements per sweep: short transactions, a bounded sweep
PURGE_BATCH = 1000
MAX_PURGE_BATCHES = 10
DEFAULT_RETENTION = dt.timedelta(days=7)


@dataclass(frozen=True)
class Swept:
    """What one sweep did."""

    expired: int  # intents past their expiry, their objects queued for deletion
    deleted: int  # objects deleted from S3
    purged: int  # finished outbox rows removed after the retention period


async def _delete_one(pool: db.Pool, object_store: ObjectStore, row: asyncpg.Record, gate: asyncio.Semaphore) -> bool:
    async with gate:
        try:
            await object_store.delete(row["region"], row["object_key"])
        except (ClientError, BotoCoreError) as exc:
            delay = dt.timedelta(seconds=backoff_seconds(row["attempts"], base=1.0))
            log.warning("deleting %s failed (attempt %d): %s", row["object_key"], row["attempts"], exc)
            async with pool.acquire() as conn:
                await objects.mark_deletion_failed(conn, row["id"], delay, str(exc))
            return False
        async with pool.acquire() as conn:
            await objects.mark_deleted(conn, row["id"])
        return True


async def purge(
    pool: db.Pool, retention: dt.timedelta, batch: int = PURGE_BATCH, max_batches: int = MAX_PURGE_BATCHES
) -> int:
    """Remove outbox rows finished more than ``retention`` ago, ``batch`` per transaction, while batches
    come back full (at most ``max_batches``); how many went. What is left goes at the next sweep."""
    purged = 0
    for _ in range(max_batches):
        async with pool.acquire() as conn:
            removed = await objects.purge_finished_deletions(conn, retention, batch)
        purged += removed
        if removed < batch:
            break
    return purged


async def sweep(pool: db.Pool, object_store: ObjectStore, retention: dt.timedelta = DEFAULT_RETENTION) -> Swept:
    """One pass: expire orphaned intents, delete what is due from S3, purge what finished long ago."""
    expired = deleted = 0
    gate = asyncio.Semaphore(CONCURRENCY)
    for _ in range(MAX_BATCHES):
        async with pool.acquire() as conn:
            newly_expired = await objects.expire_orphans(conn)
            due = await objects.claim_deletions(conn, _LEASE, BATCH)
        expired += newly_expired
        results = await asyncio.gather(*(_delete_one(pool, object_store, row, gate) for row in due))
        deleted += sum(results)
        if len(due) < BATCH and newly_expired < 100:
            break
    return Swept(expired, deleted, await purge(pool, retention))


async def run_janitor(
    pool: db.Pool,
    object_store: ObjectStore,
    interval_seconds: float,
    retention_seconds: float = DEFAULT_RETENTION.total_seconds(),
) -> None:
    """Sweep every ``interval_seconds``; a sweep that fails raises, for the supervisor to restart."""
    retention = dt.timedelta(seconds=retention_seconds)
    while True:
        swept = await sweep(pool, object_store, retention)
        if swept.expired or swept.deleted or swept.purged:
            log.info(
                "object janitor: %d intents expired, %d objects deleted, %d finished outbox rows purged",
                swept.expired,
                swept.deleted,
                swept.purged,
            )
        await asyncio.sleep(interval_seconds)
