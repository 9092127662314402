"""The retention pruner: sweeps streams with a retention pin and prunes each."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from ..store import retention

log = logging.getLogger(__name__)


async def sweep(pool: asyncpg.Pool) -> int:
    """One pass over every stream with retention; returns how many records were pruned."""
    async with pool.acquire() as conn:
        keys = await retention.streams_with_retention(conn)
    pruned = 0
    for run_id, stream_id in keys:
        async with pool.acquire() as conn:
            pruned += await retention.prune_stream(conn, run_id, stream_id)
    return pruned


async def run_pruner(pool: asyncpg.Pool, interval_seconds: float) -> None:
    while True:
        try:
            pruned = await sweep(pool)
            if pruned:
                log.info("pruned %d records beyond retention", pruned)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("pruner sweep failed, retrying next interval: %s", exc)
        await asyncio.sleep(interval_seconds)
