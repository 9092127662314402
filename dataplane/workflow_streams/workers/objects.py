"""The object janitor: expires orphaned intents and deletes queued objects from S3.

Deletions are claimed with a lease on ``next_attempt_at`` (FOR UPDATE SKIP LOCKED), so any number of
replicas share the work. Streams under a legal hold are skipped; S3 Object Lock refuses the delete
anyway if a hold lands between the claim and the call.
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


async def sweep(pool: asyncpg.Pool, store: ObjectStore) -> tuple[int, int]:
    """One pass: (intents expired, objects deleted)."""
    async with pool.acquire() as conn:
        expired = await objects.expire_orphans(conn)
        due = await objects.claim_deletions(conn, _LEASE)
    deleted = 0
    for row in due:
        try:
            await store.delete(row["region"], row["object_key"])
        except (ClientError, BotoCoreError) as exc:
            delay = dt.timedelta(seconds=backoff_seconds(row["attempts"], base=1.0))
            log.warning("deleting %s failed (attempt %d): %s", row["object_key"], row["attempts"], exc)
            async with pool.acquire() as conn:
                await objects.mark_deletion_failed(conn, row["id"], delay, str(exc))
            continue
        async with pool.acquire() as conn:
            await objects.mark_deleted(conn, row["id"])
        deleted += 1
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
