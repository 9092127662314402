"""The production topologies (workflow_streams.local.topologies) behave as the real shapes do: stock
PgBouncer in transaction pooling refuses startup settings and breaks asyncpg's statement cache; a commit a
synchronous standby never received is visible on a crash-restarted primary and gone after failover; a
partition hangs connects to Postgres until healed. Raw asyncpg only: these are facts about the shapes, not
about the data plane."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import asyncpg
import pytest

from tests.waiting import eventually
from workflow_streams.local.postgres import free_port
from workflow_streams.local.process import http_ok
from workflow_streams.local.topologies import ConfiguredPostgres, Partition, PgBouncer, Replication, tcp_connect_from

# The data plane's way of numbering a stream's records: the next sequence is one past the highest stored.
NEXT_RECORD = "INSERT INTO records SELECT coalesce(max(seq), 0) + 1, $1 FROM records RETURNING seq"


async def test_stock_pgbouncer_refuses_startup_settings_and_serves_a_connection_without_them(
    pgbouncer: PgBouncer,
) -> None:
    dsn = pgbouncer.dsn_for("postgres")
    with pytest.raises(asyncpg.PostgresError, match="unsupported startup parameter: plan_cache_mode"):
        await asyncpg.connect(dsn, server_settings={"plan_cache_mode": "force_generic_plan"})
    conn = await asyncpg.connect(dsn, statement_cache_size=0)
    try:
        assert await conn.fetchval("SELECT $1::int + 1", 41) == 42
        assert await conn.fetchval("SELECT current_setting('plan_cache_mode')") == "auto"
    finally:
        await conn.close()


async def test_a_cached_statement_breaks_on_another_server_connection_and_no_cache_does_not(
    pgbouncer: PgBouncer,
) -> None:
    dsn = pgbouncer.dsn_for("postgres")
    cached = await asyncpg.connect(dsn)  # asyncpg's default: named statements, prepared once per connection
    uncached = await asyncpg.connect(dsn, statement_cache_size=0)
    holder = await asyncpg.connect(dsn, statement_cache_size=0)
    try:
        assert await cached.fetchval("SELECT $1::int", 1) == 1  # prepared on the one server connection
        assert await uncached.fetchval("SELECT $1::int", 1) == 1
        # A transaction holds a server connection until it ends: PgBouncer hands it the idle one (the one
        # that holds the prepared statement) and gives the next client another.
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("SELECT 1")
        with pytest.raises(asyncpg.InvalidSQLStatementNameError, match="does not exist"):
            await cached.fetchval("SELECT $1::int", 2)
        assert await uncached.fetchval("SELECT $1::int", 2) == 2
        await transaction.rollback()
    finally:
        for conn in (cached, uncached, holder):
            await conn.close()


async def test_pgbouncer_killed_breaks_its_connections_and_restarted_on_its_port_serves_again(
    pgbouncer: PgBouncer,
) -> None:
    dsn = pgbouncer.dsn_for("postgres")
    before = await asyncpg.connect(dsn, statement_cache_size=0)
    port = pgbouncer.port
    try:
        assert await before.fetchval("SELECT 1") == 1
        pgbouncer.kill()
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):
            await before.fetchval("SELECT 1")
        with pytest.raises(OSError):  # nothing listens: refused at once
            await asyncpg.connect(dsn, statement_cache_size=0, timeout=5)
        await asyncio.to_thread(pgbouncer.restart)
        assert pgbouncer.port == port
        after = await asyncpg.connect(dsn, statement_cache_size=0)
        try:
            assert await after.fetchval("SELECT 2") == 2
        finally:
            await after.close()
    finally:
        await before.close()


@pytest.mark.slow  # two clusters, a base backup, a crash recovery and a promotion
async def test_a_commit_seen_on_a_crash_restarted_primary_is_gone_after_failover_to_the_sync_standby(
    sync_replication: Replication,
) -> None:
    primary, standby = sync_replication.primary, sync_replication.standby
    conn = await asyncpg.connect(sync_replication.dsn_for("postgres"))
    assert await conn.fetchval("SELECT inet_server_port()") == primary.port  # the one that accepts writes
    await conn.execute("CREATE TABLE records (seq bigint PRIMARY KEY, body text NOT NULL)")
    assert await conn.fetchval(NEXT_RECORD, "acknowledged") == 1  # returned once the standby had flushed it
    await eventually(lambda: standby.query("SELECT body FROM records") == "acknowledged")

    await asyncio.to_thread(standby.pause_replication)
    pending = asyncio.create_task(conn.fetchval(NEXT_RECORD, "never replicated"))
    observer = await asyncpg.connect(primary.dsn)
    try:
        await eventually(
            lambda: observer.fetchval("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"),
            message="the commit never waited for the standby",
        )
    finally:
        await observer.close()
    assert not pending.done()

    await asyncio.to_thread(primary.crash_restart)
    with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
        await pending  # its client never got an acknowledgement
    after_recovery = await asyncpg.connect(primary.dsn)
    try:
        # Recovery replayed the local commit: readers are served a record the standby never received.
        rows = await after_recovery.fetch("SELECT seq, body FROM records ORDER BY seq")
        assert [tuple(row) for row in rows] == [(1, "acknowledged"), (2, "never replicated")]
    finally:
        await after_recovery.close()
    assert standby.query("SELECT string_agg(body, ',') FROM records") == "acknowledged"

    await asyncio.to_thread(primary.kill)
    await asyncio.to_thread(standby.promote)
    promoted = await asyncpg.connect(sync_replication.dsn_for("postgres"))
    try:
        assert await promoted.fetchval("SELECT inet_server_port()") == standby.port
        rows = await promoted.fetch("SELECT seq, body FROM records ORDER BY seq")
        assert [tuple(row) for row in rows] == [(1, "acknowledged")]
        # The sequence a reader was served "never replicated" under now numbers another record.
        assert await promoted.fetchval(NEXT_RECORD, "stored in its place") == 2
    finally:
        await promoted.close()
        await conn.close()


@pytest.mark.slow  # two clusters, a base backup and a promotion
async def test_an_acknowledged_commit_is_lost_when_failing_over_to_an_async_standby(
    async_replication: Replication,
) -> None:
    primary, standby = async_replication.primary, async_replication.standby
    conn = await asyncpg.connect(primary.dsn)
    try:
        await conn.execute("CREATE TABLE records (seq bigint PRIMARY KEY, body text NOT NULL)")
        await eventually(lambda: standby.query("SELECT to_regclass('records') IS NOT NULL") == "t")
        await asyncio.to_thread(standby.pause_replication)
        # No standby to wait for: acknowledged at once.
        assert await asyncio.wait_for(conn.fetchval(NEXT_RECORD, "acknowledged"), 10) == 1
    finally:
        await conn.close()
    await asyncio.to_thread(primary.kill)
    await asyncio.to_thread(standby.promote)
    assert standby.query("SELECT count(*) FROM records") == "0"


async def test_a_cut_partition_hangs_connects_to_postgres_until_healed(
    partition: Partition, partitioned_pg: ConfiguredPostgres, tmp_path: Path
) -> None:
    host, port = partition.host_address, partition.port

    async def connect_from_namespace() -> str:
        return await asyncio.to_thread(tcp_connect_from, partition, host, port, timeout=1.5)

    assert await connect_from_namespace() == "connected"
    # Postgres listens on the host end and admits the namespace's address.
    client_address = "SELECT host(inet_client_addr())"
    psql = partition.run(
        [
            str(partitioned_pg.bindir / "psql"),
            "-X",
            "-A",
            "-t",
            "-d",
            partition.dsn_for("postgres"),
            "-c",
            client_address,
        ]
    )
    assert psql.stdout.strip() == partition.ns_address, psql.stderr
    web_port = free_port()
    serve_files = ["-m", "http.server", "--bind", partition.ns_address, "--directory", str(tmp_path), str(web_port)]
    web = partition.popen(
        [sys.executable, *serve_files],
        log=tmp_path / "http.log",
        name="http.server",
    )
    await asyncio.to_thread(web.wait_ready, partition.url(web_port, "/"), seconds=30)

    partition.cut()
    assert await connect_from_namespace() == "timeout"  # dropped, not refused: a partition, not a closed port
    assert http_ok(partition.url(web_port, "/"))  # only the Postgres port is cut: the host still reaches in
    partition.heal()
    # A condition on the loop's thread: it blocks the loop for one probe, and nothing else runs on it here.
    await eventually(
        lambda: tcp_connect_from(partition, host, port) == "connected", message="no connect after the heal"
    )


def test_a_partition_is_removed_whatever_happened_inside_it() -> None:
    ok, reason = Partition.available()
    if not ok:
        pytest.skip(f"no network namespaces: {reason}")
    made = Partition(port=free_port())
    with pytest.raises(RuntimeError, match="a test failed"), made:
        made.cut()
        assert made.exists()
        raise RuntimeError("a test failed with the link cut")
    assert not made.exists()
