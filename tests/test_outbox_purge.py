"""The deletion outbox forgets finished rows after the retention period, and only those (migration 480)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import asyncpg
import pytest

from workflow_streams.adapters.objectstore import ObjectStore, RegionConfig
from workflow_streams.store.db import create_pool
from workflow_streams.workers import objects as janitor

WEEK = dt.timedelta(days=7)


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 1, 2)
    yield pool
    await pool.close()


async def _queue(
    db: asyncpg.Connection,
    key: str,
    *,
    deleted: str | None,
    created: str = "30 days",
    next_attempt: str = "-1 day",
    last_error: str | None = None,
) -> None:
    """An outbox row created ``created`` ago, its object deleted ``deleted`` ago (None: not yet)."""
    await db.execute(
        """INSERT INTO wfs_deletion_outbox
               (run_id, stream_id, region, bucket, object_key, reason, attempts, last_error,
                created_at, next_attempt_at, deleted_at)
           VALUES ('r', 's', 'eu-west-1', 'b', $1, 'pruned', 1, $2,
                   now() - $3::text::interval, now() + $4::text::interval, now() - $5::text::interval)""",
        key,
        last_error,
        created,
        next_attempt,
        deleted,
    )


async def _keys(db: asyncpg.Connection) -> set[str]:
    return {r["object_key"] for r in await db.fetch("SELECT object_key FROM wfs_deletion_outbox")}


async def _keep(db: asyncpg.Connection) -> set[str]:
    """Rows no purge may take: finished within the week, or not finished at all, however old."""
    await _queue(db, "recent-1h", deleted="1 hour")
    await _queue(db, "recent-6d23h", deleted="6 days 23 hours")
    await _queue(db, "failing-since-30d", deleted=None, next_attempt="10 minutes", last_error="AccessDenied")
    await _queue(db, "parked-held", deleted=None, next_attempt="1 hour")
    return {"recent-1h", "recent-6d23h", "failing-since-30d", "parked-held"}


async def test_purge_takes_old_finished_rows_in_bounded_batches(pool: asyncpg.Pool, db: asyncpg.Connection) -> None:
    keep = await _keep(db)
    old = {f"old-{i:02d}" for i in range(25)}
    for key in sorted(old):
        await _queue(db, key, deleted="7 days 1 minute" if key == "old-00" else "40 days")

    # two batches of 10 at most: a sweep is bounded, and the rest waits for the next one
    assert await janitor.purge(pool, WEEK, batch=10, max_batches=2) == 20
    left = await _keys(db)
    assert keep <= left and len(left - keep) == 5
    assert await janitor.purge(pool, WEEK, batch=10, max_batches=2) == 5
    assert await _keys(db) == keep
    assert await janitor.purge(pool, WEEK, batch=10, max_batches=2) == 0
    assert await _keys(db) == keep


async def test_a_shorter_retention_takes_newer_finished_rows(pool: asyncpg.Pool, db: asyncpg.Connection) -> None:
    keep = await _keep(db)
    # two hours: the row finished 6 days 23 hours ago goes, the one finished an hour ago stays
    assert await janitor.purge(pool, dt.timedelta(hours=2)) == 1
    assert await _keys(db) == keep - {"recent-6d23h"}


@pytest.mark.slow  # MinIO
async def test_the_janitor_sweep_purges_after_it_deletes(
    pool: asyncpg.Pool, db: asyncpg.Connection, s3_regions: dict[str, RegionConfig]
) -> None:
    """One sweep with a real object store: the due row is deleted and finished (and kept: it finished just
    now), the week-old finished row is purged, the rows still to do are left alone."""
    keep = await _keep(db)
    await _queue(db, "old", deleted="8 days")
    await _queue(db, "due-now", deleted=None, next_attempt="-1 second")
    store = ObjectStore({"eu-west-1": s3_regions["eu-west-1"]})
    await store.open()
    try:
        swept = await janitor.sweep(pool, store, WEEK)
    finally:
        await store.close()
    assert swept == janitor.Swept(expired=0, deleted=1, purged=1)
    assert await _keys(db) == keep | {"due-now"}
    assert await db.fetchval("SELECT deleted_at IS NOT NULL FROM wfs_deletion_outbox WHERE object_key = 'due-now'")
