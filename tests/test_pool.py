"""Pooled connections: a release costs no round trip, and still leaves nothing open behind it."""

from __future__ import annotations

from workflow_streams.store import appends, db
from workflow_streams.store.db import create_pool


async def test_release_sends_nothing_but_rolls_back_an_open_transaction(database_url: str) -> None:
    pool = await create_pool(database_url, 1, 1)
    sent: list[str] = []
    try:
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda logged: sent.append(logged.query))
            assert await conn.fetchval("SELECT 1") == 1
        # asyncpg's default reset (advisory unlocks, CLOSE ALL, UNLISTEN *, RESET ALL) would show here
        assert sent == ["SELECT 1"]

        # a holder that leaves a transaction open (a cancelled caller) does not hand it to the next one
        async with pool.acquire() as conn:
            await conn.execute("BEGIN")
            await conn.execute("CREATE TEMPORARY TABLE left_behind (n int) ON COMMIT DROP")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT to_regclass('pg_temp.left_behind')") is None
            assert await conn.fetchval("SELECT current_setting('transaction_isolation')") == "read committed"
            assert not conn.is_in_transaction()
    finally:
        await pool.close()


async def test_planner_settings_hold_in_their_transaction_only(database_url: str) -> None:
    """The append statements' planner settings are SET LOCAL (store.appends.BEGIN): in force in the
    transaction that sets them, gone after it, as a transaction pooler requires (nothing outlives a
    transaction on a server connection another client gets next)."""
    pool = await create_pool(database_url, 1, 1)
    try:
        async with pool.acquire() as conn:
            async with db.transaction(conn, appends.BEGIN):
                assert await conn.fetchval("SHOW enable_seqscan") == "off"
                assert await conn.fetchval("SHOW plan_cache_mode") == "force_generic_plan"
            assert await conn.fetchval("SHOW enable_seqscan") == "on"
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
    finally:
        await pool.close()
