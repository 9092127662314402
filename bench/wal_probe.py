"""Postgres' share of an append at 8 and 128 connections: ``python -m bench.wal_probe``.

One ``serve --workers 2`` on its own Postgres, 1,000 streams, 8 s per case with a CHECKPOINT before
each. Per case: appends/s, the Postgres backends' user and system CPU seconds (exited ones included),
and per append the WAL bytes, full-page images and WAL syncs (``pg_stat_wal``). It answered why
Postgres spent far more CPU per append at 8 connections than at 128 (bench/README.md).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import asyncpg

from bench import generator
from bench.harness import PREFIX, TOKEN, Server, pins, postmaster_pid, process_tree_times, start_postgres

_WAL = "SELECT wal_records, wal_fpi, wal_bytes, wal_sync FROM pg_stat_wal"


async def main(seconds: int = 8) -> None:
    pg = await start_postgres()
    server = Server(pg.dsn, Path(tempfile.mkdtemp()) / "server.log", workers=2)
    try:
        await server.ready()
        base = server.url + PREFIX
        await generator.run("create", base, TOKEN, run="w", streams=1000, create=pins())
        conn = await asyncpg.connect(pg.dsn)
        try:
            for conns in (8, 128, 8):
                await conn.execute("CHECKPOINT")
                wal0, cpu0 = await conn.fetchrow(_WAL), process_tree_times(postmaster_pid(pg))
                report = await generator.run(
                    "append", base, TOKEN, run="w", streams=1000, conns=conns, warmup="0s", duration=f"{seconds}s"
                )
                await asyncio.sleep(0.6)  # backends report their WAL statistics when idle
                wal1, cpu1 = await conn.fetchrow(_WAL), process_tree_times(postmaster_pid(pg))
                n = report["requests_ok"]
                print(
                    f"conns {conns}: {n / seconds:,.0f} appends/s; Postgres user {cpu1[0] - cpu0[0]:.2f} s, "
                    f"system {cpu1[1] - cpu0[1]:.2f} s; per append: WAL {(wal1[2] - wal0[2]) / n:.0f} bytes, "
                    f"full-page images {(wal1[1] - wal0[1]) / n:.3f}, syncs {(wal1[3] - wal0[3]) / n:.3f}",
                    flush=True,
                )
        finally:
            await conn.close()
    finally:
        server.stop()
        pg.destroy()


if __name__ == "__main__":
    asyncio.run(main())
