"""The metrics sampler at scale (issue 14): a rolling pass of bounded slices, a bounded top-N label set."""

from __future__ import annotations

import asyncpg
from prometheus_client import REGISTRY

from tests.test_retention_scale import _append, _create_streams
from workflow_streams.store.db import create_pool
from workflow_streams.workers.metrics_sampler import TOP_N, BacklogPass, sample_backlog


def _top_series() -> dict[str, float]:
    return {
        s.labels["stream_id"]: s.value
        for m in REGISTRY.collect()
        if m.name == "wfs_backlog_top_unread_items"
        for s in m.samples
    }


async def test_backlog_is_summed_by_slices_and_only_the_top_streams_are_labelled(
    database_url: str, db: asyncpg.Connection
) -> None:
    await _create_streams(db, "r", 25, {})
    pool = await create_pool(database_url, 1, 2)
    try:
        for i in range(1, 26):  # stream i holds i records
            await _append(pool, "r", [f"s{i:05d}"], i)
        await db.execute(
            """INSERT INTO wfs_consumers (consumer_id, run_id, stream_id, acked_sequence, updated_by)
               VALUES ('c1', 'r', 's00025', 20, 'alice')"""
        )
        state = BacklogPass()
        async with pool.acquire() as conn:
            await sample_backlog(conn, state, slice_size=10)
            await sample_backlog(conn, state, slice_size=10)
            assert state.complete is None, "two slices of 10 do not cover 25 streams"
            await sample_backlog(conn, state, slice_size=10)
    finally:
        await pool.close()
    total, streams, _top = state.complete or (0, 0, [])
    expected = sum(range(1, 25)) + 5  # s00025 is read through 20
    assert (total, streams) == (expected, 25)
    assert REGISTRY.get_sample_value("wfs_backlog_unread_items") == expected
    series = _top_series()
    assert len(series) == TOP_N
    assert series == {f"s{i:05d}": float(i) for i in range(15, 25)}
