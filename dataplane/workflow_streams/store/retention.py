"""Pruning records beyond a stream's pinned retention. Legal holds stop it."""

from __future__ import annotations

import datetime as dt

import asyncpg

from .definitions import lock_stream, pins_of


async def is_held(conn: asyncpg.Connection, run_id: str, stream_id: str) -> bool:
    return bool(
        await conn.fetchval(
            """SELECT EXISTS (SELECT 1 FROM wfs_legal_holds
                              WHERE run_id = $1 AND stream_id = $2 AND released_at IS NULL)""",
            run_id,
            stream_id,
        )
    )


async def prune_stream(conn: asyncpg.Connection, run_id: str, stream_id: str) -> int:
    """Remove the prefix of records beyond retention; returns how many. Objects of pruned records
    go to the deletion outbox in the same transaction."""
    async with conn.transaction():
        row = await lock_stream(conn, run_id, stream_id)
        if await is_held(conn, run_id, stream_id):
            return 0
        retention = pins_of(row).retention
        cutoff = row["earliest_sequence"] - 1
        if retention.max_records is not None:
            cutoff = max(cutoff, row["last_sequence"] - retention.max_records)
        if retention.max_age_seconds is not None:
            # appended_at is taken under the row lock, so it ascends with the sequence
            aged = await conn.fetchval(
                """SELECT sequence FROM wfs_records
                   WHERE run_id = $1 AND stream_id = $2 AND appended_at < clock_timestamp() - $3::interval
                   ORDER BY appended_at DESC LIMIT 1""",
                run_id,
                stream_id,
                dt.timedelta(seconds=retention.max_age_seconds),
            )
            cutoff = max(cutoff, aged or 0)
        if cutoff < row["earliest_sequence"]:
            return 0
        pruned_bytes = await conn.fetchval(
            "SELECT cumulative_bytes FROM wfs_records WHERE run_id = $1 AND stream_id = $2 AND sequence = $3",
            run_id,
            stream_id,
            cutoff,
        )
        removed = await conn.fetch(
            """DELETE FROM wfs_records WHERE run_id = $1 AND stream_id = $2 AND sequence <= $3
               RETURNING kind, object""",
            run_id,
            stream_id,
            cutoff,
        )
        objects = [r["object"] for r in removed if r["kind"] == "object"]
        if objects:
            await conn.execute(
                """INSERT INTO wfs_deletion_outbox (run_id, stream_id, region, bucket, object_key, reason)
                   SELECT $1, $2, o->>'region', o->>'bucket', o->>'key', 'retention'
                   FROM unnest($3::jsonb[]) AS o""",
                run_id,
                stream_id,
                objects,
            )
        await conn.execute(
            """UPDATE wfs_streams SET earliest_sequence = $3, pruned_bytes = $4
               WHERE run_id = $1 AND stream_id = $2""",
            run_id,
            stream_id,
            cutoff + 1,
            pruned_bytes,
        )
        return len(removed)


async def streams_with_retention(conn: asyncpg.Connection, limit: int = 1000) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        """SELECT run_id, stream_id FROM wfs_streams
           WHERE pins->'retention'->>'max_records' IS NOT NULL
              OR pins->'retention'->>'max_age_seconds' IS NOT NULL
           ORDER BY run_id, stream_id LIMIT $1""",
        limit,
    )
    return [(r["run_id"], r["stream_id"]) for r in rows]
