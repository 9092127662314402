"""The retention pruner: sweeps streams with a retention pin and prunes each it can claim."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import asyncpg

from ..store import claims, retention
from ..store.db import DB_UNAVAILABLE
from .dispatcher import holder_id

log = logging.getLogger(__name__)

KIND = "prune"
_LEASE = dt.timedelta(seconds=60)


async def sweep(pool: asyncpg.Pool, holder: str) -> int:
    """One pass over the streams with retention; returns how many records were pruned."""
    async with pool.acquire() as conn:
        keys = [claims.stream_key(*k) for k in await retention.streams_with_retention(conn)]
        keys = await claims.take_over_expired(conn, KIND, holder, _LEASE, 100) + await claims.claim(
            conn, KIND, holder, _LEASE, keys
        )
    pruned = 0
    for key in keys:
        async with pool.acquire() as conn:
            try:
                pruned += await retention.prune_stream(conn, *claims.split_stream_key(key))
            finally:
                await claims.release(conn, KIND, key, holder)
    return pruned


async def run_pruner(pool: asyncpg.Pool, interval_seconds: float) -> None:
    holder = holder_id()
    while True:
        try:
            pruned = await sweep(pool, holder)
            if pruned:
                log.info("pruned %d records beyond retention", pruned)
        except (*DB_UNAVAILABLE, asyncpg.PostgresError) as exc:
            log.warning("pruner sweep failed, retrying next interval: %s", exc)
        await asyncio.sleep(interval_seconds)
