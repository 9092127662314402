"""Worker claims: leases in Postgres, so a dead replica's work passes to another.

A claim row exists while a unit of work (one stream, for most workers) is held. A holder renews its
lease while working and deletes the row when done. A replica that dies stops renewing; once the lease
expires another replica takes the row over. Takeover uses FOR UPDATE SKIP LOCKED, so replicas
racing for the same expired claims never wait on each other.
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


def stream_key(run_id: str, stream_id: str) -> str:
    return f"{run_id}/{stream_id}"


def split_stream_key(key: str) -> tuple[str, str]:
    run_id, stream_id = key.split("/", 1)
    return run_id, stream_id
