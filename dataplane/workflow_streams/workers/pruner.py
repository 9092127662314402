"""The retention pruner: each sweep claims the streams that are due and prunes them in bounded batches.

Work follows what is due: a sweep reads the due index (``wfs_streams.next_prune_at``), never the list
of streams. Replicas share it through claim rows with leases (``store.claims.claim_due_streams``); a
long sweep renews its leases as it goes, and a replica that dies mid-sweep leaves its claims to expire
and be taken over. A sweep takes only what was due when it started, so it ends under any append rate.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass, field

import asyncpg

from ..store import claims, db, retention
from ..store.appends import StreamKey
from .dispatcher import holder_id

log = logging.getLogger(__name__)

KIND = "prune"
LEASE = dt.timedelta(seconds=60)
# streams claimed per claim statement
CLAIM_BATCH = 500
# the first pass over a claimed batch removes at most this many records per stream, many streams per
# transaction (most due streams are a few records past their limit); streams with more continue alone
FIRST_PASS_RECORDS = 50


@dataclass
class SweepResult:
    # every stream key this sweep claimed, in claim order (two sweeps never claim the same due stream)
    claimed: list[str] = field(default_factory=list)
    records: int = 0
    held: int = 0
    transactions: int = 0


async def _prune_claimed(
    conn: asyncpg.Connection,
    holder: str,
    keys: list[str],
    lease: dt.timedelta,
    records_per_stream: int,
    records_per_transaction: int,
    result: SweepResult,
) -> None:
    loop = asyncio.get_running_loop()
    renewed = loop.time()
    mine = set(keys)
    pending: list[StreamKey] = [claims.split_stream_key(k) for k in keys]
    limit = min(FIRST_PASS_RECORDS, records_per_stream)
    while pending:
        group = max(1, records_per_transaction // limit)
        more: list[StreamKey] = []
        for start in range(0, len(pending), group):
            if loop.time() - renewed > lease.total_seconds() / 3:
                # a long sweep keeps its leases; a stream whose lease was lost is another's now
                mine = await claims.renew_many(conn, KIND, sorted(mine), holder, lease)
                renewed = loop.time()
            chunk = [k for k in pending[start : start + group] if claims.stream_key(*k) in mine]
            if not chunk:
                continue
            for pruned in await retention.prune_batch(conn, chunk, limit):
                result.records += pruned.removed
                result.held += pruned.held
                if pruned.more:
                    more.append(pruned.key)
            result.transactions += 1
        pending = more
        limit = records_per_stream
    await claims.release_many(conn, KIND, keys, holder)


async def sweep(
    pool: db.Pool,
    holder: str,
    *,
    lease: dt.timedelta = LEASE,
    claim_batch: int = CLAIM_BATCH,
    records_per_stream: int = retention.RECORDS_PER_STREAM,
    records_per_transaction: int = retention.RECORDS_PER_TRANSACTION,
) -> SweepResult:
    """One pass over the streams due when it starts; other replicas' live claims are left to them."""
    result = SweepResult()
    # a sweep is long (it renews its leases as it goes): its connection's deadline is the lease's
    async with pool.acquire(until=asyncio.get_running_loop().time() + lease.total_seconds()) as conn:
        due_by = await retention.due_now(conn)
        await claims.drop_expired(conn, KIND)
        while True:
            keys = await claims.claim_due_streams(conn, KIND, holder, lease, due_by, claim_batch)
            if not keys:
                return result
            result.claimed += keys
            await _prune_claimed(conn, holder, keys, lease, records_per_stream, records_per_transaction, result)


async def run_pruner(pool: db.Pool, interval_seconds: float) -> None:
    """Sweep every ``interval_seconds``; a sweep that fails raises, for the supervisor to restart."""
    holder = holder_id()
    while True:
        result = await sweep(pool, holder)
        if result.records:
            log.info("pruned %d records of %d streams beyond retention", result.records, len(result.claimed))
        await asyncio.sleep(interval_seconds)
