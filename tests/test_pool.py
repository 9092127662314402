"""Pooled connections: a release costs no round trip, and still leaves nothing open behind it."""

from __future__ import annotations

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


async def test_session_settings_given_at_connect_stay(database_url: str) -> None:
    """Group commit's pool relies on its connect-time settings (store.appends.CONNECTION_SETTINGS)."""
    pool = await create_pool(database_url, 1, 1, server_settings={"enable_seqscan": "off"})
    try:
        for _ in range(2):
            async with pool.acquire() as conn:
                assert await conn.fetchval("SHOW enable_seqscan") == "off"
    finally:
        await pool.close()
