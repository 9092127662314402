"""Worker claims: leases in Postgres, so a dead replica's work passes to another.

A claim row exists while a unit of work (one stream, for most workers) is held. A holder renews its
lease while working and deletes the row when done. A replica that dies stops renewing; once the lease
expires another replica takes the row over. Takeover uses FOR UPDATE SKIP LOCKED, so replicas
racing for the same expired claims never wait on each other.

Workers whose work is a due time on the stream row (the pruner: ``wfs_streams.next_prune_at``) claim a
batch of due streams in one statement (``claim_due_streams``). Why claim rows here rather than lock
the due stream rows with FOR UPDATE SKIP LOCKED: appends hold a stream's row lock most of the time when
the stream is hot, and hot streams at their retention limit are exactly the ones that must be pruned;
SKIP LOCKED on that row would skip them sweep after sweep. A claim row conflicts only with another
claim of the same stream, for the length of one short statement, and it is an observable lease (who
holds what until when) that outlives a crashed holder by at most the lease.
"""

from __future__ import annotations

import datetime as dt

import asyncpg

_TAKE_OVER = """
UPDATE wfs_worker_claims
SET holder = $2, lease_expires_at = now() + $3::interval, claimed_at = now(), renewed_at = now()
WHERE (worker_kind, claim_key) IN (
    SELECT worker_kind, claim_key FROM wfs_worker_claims
    WHERE worker_kind = $1 AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED)
RETURNING claim_key
"""

_CLAIM_NEW = """
INSERT INTO wfs_worker_claims (worker_kind, claim_key, holder, lease_expires_at)
SELECT $1, key, $2, now() + $3::interval FROM unnest($4::text[]) AS key
ON CONFLICT (worker_kind, claim_key) DO NOTHING
RETURNING claim_key
"""


async def take_over_expired(
    conn: asyncpg.Connection, kind: str, holder: str, lease: dt.timedelta, limit: int
) -> list[str]:
    rows = await conn.fetch(_TAKE_OVER, kind, holder, lease, limit)
    return [r["claim_key"] for r in rows]


async def claim(conn: asyncpg.Connection, kind: str, holder: str, lease: dt.timedelta, keys: list[str]) -> list[str]:
    """Claim whichever of ``keys`` nobody holds."""
    if not keys:
        return []
    rows = await conn.fetch(_CLAIM_NEW, kind, holder, lease, keys)
    return [r["claim_key"] for r in rows]


async def renew(conn: asyncpg.Connection, kind: str, key: str, holder: str, lease: dt.timedelta) -> bool:
    """Extend our lease; False if it expired and was taken over (stop working on it then)."""
    row = await conn.fetchval(
        """UPDATE wfs_worker_claims SET lease_expires_at = now() + $4::interval, renewed_at = now()
           WHERE worker_kind = $1 AND claim_key = $2 AND holder = $3 AND lease_expires_at > now()
           RETURNING 1""",
        kind,
        key,
        holder,
        lease,
    )
    return row is not None


async def release(conn: asyncpg.Connection, kind: str, key: str, holder: str) -> None:
    await conn.execute(
        "DELETE FROM wfs_worker_claims WHERE worker_kind = $1 AND claim_key = $2 AND holder = $3", kind, key, holder
    )


# Due streams not held by a live lease, oldest due first; the insert takes over expired leases and
# leaves live ones alone. Keys are inserted in key order so two claimers never deadlock on each other.
_CLAIM_DUE = """
WITH due AS (
    SELECT s.run_id || '/' || s.stream_id AS key FROM wfs_streams s
    WHERE s.next_prune_at <= $4
      AND NOT EXISTS (SELECT 1 FROM wfs_worker_claims c
                      WHERE c.worker_kind = $1 AND c.claim_key = s.run_id || '/' || s.stream_id
                        AND c.lease_expires_at >= now())
    ORDER BY s.next_prune_at
    LIMIT $5
)
INSERT INTO wfs_worker_claims AS c (worker_kind, claim_key, holder, lease_expires_at)
SELECT $1, key, $2, now() + $3::interval FROM due ORDER BY key
ON CONFLICT (worker_kind, claim_key) DO UPDATE
SET holder = excluded.holder, lease_expires_at = excluded.lease_expires_at, claimed_at = now(), renewed_at = now()
WHERE c.lease_expires_at < now()
RETURNING claim_key
"""


async def claim_due_streams(
    conn: asyncpg.Connection, kind: str, holder: str, lease: dt.timedelta, due_by: dt.datetime, limit: int
) -> list[str]:
    """Claim up to ``limit`` streams whose ``next_prune_at`` is at or before ``due_by`` and that no live
    lease holds (an expired lease is taken over). Returns the stream keys now held by ``holder``."""
    rows = await conn.fetch(_CLAIM_DUE, kind, holder, lease, due_by, limit)
    return [r["claim_key"] for r in rows]


async def renew_many(
    conn: asyncpg.Connection, kind: str, keys: list[str], holder: str, lease: dt.timedelta
) -> set[str]:
    """Extend our leases on ``keys``; returns the keys still ours (a lost one must not be worked on)."""
    rows = await conn.fetch(
        """UPDATE wfs_worker_claims SET lease_expires_at = now() + $4::interval, renewed_at = now()
           WHERE worker_kind = $1 AND claim_key = ANY($2::text[]) AND holder = $3 AND lease_expires_at > now()
           RETURNING claim_key""",
        kind,
        keys,
        holder,
        lease,
    )
    return {r["claim_key"] for r in rows}


async def release_many(conn: asyncpg.Connection, kind: str, keys: list[str], holder: str) -> None:
    await conn.execute(
        "DELETE FROM wfs_worker_claims WHERE worker_kind = $1 AND claim_key = ANY($2::text[]) AND holder = $3",
        kind,
        keys,
        holder,
    )


async def drop_expired(conn: asyncpg.Connection, kind: str, limit: int = 1000) -> int:
    """Forget up to ``limit`` expired claims of ``kind``: a dead holder's claims on streams that are no
    longer due would otherwise stay forever (only due streams are taken over). Uses the expiry index."""
    result = await conn.execute(
        """DELETE FROM wfs_worker_claims WHERE (worker_kind, claim_key) IN (
               SELECT worker_kind, claim_key FROM wfs_worker_claims
               WHERE worker_kind = $1 AND lease_expires_at < now()
               ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)""",
        kind,
        limit,
    )
    return int(result.split()[-1])


def stream_key(run_id: str, stream_id: str) -> str:
    return f"{run_id}/{stream_id}"


def split_stream_key(key: str) -> tuple[str, str]:
    run_id, stream_id = key.split("/", 1)
    return run_id, stream_id
