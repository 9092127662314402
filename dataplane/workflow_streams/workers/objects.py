"""The object janitor: expires orphaned intents and deletes queued objects from S3.

Deletions are claimed with a lease on ``next_attempt_at`` (FOR UPDATE SKIP LOCKED), so any number of
replicas share the work. Deletions of streams under a legal hold are parked until the release; S3
Object Lock refuses the delete anyway if a hold lands between the claim and the call.

Work follows what is due: a sweep reads due rows through their index, in batches, and keeps going
while batches come back full (up to ``MAX_BATCHES``), so a burst of pruned objects drains at S3's pace
rather than one batch per interval; an idle sweep is two index probes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import asyncpg
from botocore.exceptions import BotoCoreError, ClientError

from ..domain.delivery import backoff_seconds
from ..objectstore import ObjectStore
from ..store import objects
from ..store.db import DB_UNAVAILABLE

log = logging.getLogger(__name__)

_LEASE = dt.timedelta(seconds=60)


BATCH = 50
# batches per sweep: bounds one sweep's length; what is left is due at the next sweep
MAX_BATCHES = 20
# S3 deletes in flight at once
CONCURRENCY = 8


async def _delete_one(pool: asyncpg.Pool, store: ObjectStore, row: asyncpg.Record, gate: asyncio.Semaphore) -> bool:
    async with gate:
        try:
            await store.delete(row["region"], row["object_key"])
        except (ClientError, BotoCoreError) as exc:
            delay = dt.timedelta(seconds=backoff_seconds(row["attempts"], base=1.0))
            log.warning("deleting %s failed (attempt %d): %s", row["object_key"], row["attempts"], exc)
            async with pool.acquire() as conn:
                await objects.mark_deletion_failed(conn, row["id"], delay, str(exc))
            return False
        async with pool.acquire() as conn:
            await objects.mark_deleted(conn, row["id"])
        return True


async def sweep(pool: asyncpg.Pool, store: ObjectStore) -> tuple[int, int]:
    """One pass: (intents expired, objects deleted)."""
    expired = deleted = 0
    gate = asyncio.Semaphore(CONCURRENCY)
    for _ in range(MAX_BATCHES):
        async with pool.acquire() as conn:
            newly_expired = await objects.expire_orphans(conn)
            due = await objects.claim_deletions(conn, _LEASE, BATCH)
        expired += newly_expired
        results = await asyncio.gather(*(_delete_one(pool, store, row, gate) for row in due))
        deleted += sum(results)
        if len(due) < BATCH and newly_expired < 100:
            break
    return expired, deleted


async def run_janitor(pool: asyncpg.Pool, store: ObjectStore, interval_seconds: float) -> None:
    while True:
        try:
            expired, deleted = await sweep(pool, store)
            if expired or deleted:
                log.info("object janitor: %d intents expired, %d objects deleted", expired, deleted)
        except (*DB_UNAVAILABLE, asyncpg.PostgresError) as exc:
            log.warning("object janitor sweep failed, retrying next interval: %s", exc)
        await asyncio.sleep(interval_seconds)
