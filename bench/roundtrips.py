"""Round trips per append transaction: ``python -m bench.roundtrips [--seconds S] [--batch B]``.

The question it answers: would two round trips per group-commit transaction instead of four pay? With
asyncpg a batch costs BEGIN, the lock statement, the write and COMMIT, each awaited in turn; asyncpg
cannot send one before the previous answer. psycopg 3's pipeline mode can: BEGIN with the lock
statement, the write with COMMIT. Both drivers run the same simplified batch (lock B of 1,000 stream
rows in key order, insert B records, bump the counters) on one throwaway Postgres, in alternating
rounds, on 1 and 2 connections; it prints transactions/s and the CPU per transaction of this process
(the driver and the batch's own Python, the same for both) and of Postgres.

Session 15 (bench history, item 27): Postgres' CPU per transaction about the same either way, this
process's 230-310 us more with psycopg, and its rates equal or lower: the two round trips saved cost
Postgres little CPU, and psycopg's Python per statement costs more than they save.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import time
from collections.abc import Awaitable, Callable

import asyncpg
import psycopg
import uvloop

from bench.harness import postmaster_pid, process_tree_cpu, start_postgres

_SETUP = """
CREATE TABLE rt_streams (k bigint PRIMARY KEY, last bigint NOT NULL DEFAULT 0);
CREATE TABLE rt_records (k bigint, seq bigint, payload bytea, PRIMARY KEY (k, seq));
INSERT INTO rt_streams SELECT g FROM generate_series(1, 1000) g;
"""
# the shapes of store.appends' lock and write statements, without credit, receipts or deliveries
_LOCK = """SELECT s.k, s.last FROM unnest($1::bigint[]) WITH ORDINALITY u(k, p)
CROSS JOIN LATERAL (SELECT * FROM rt_streams w WHERE w.k = u.k FOR UPDATE) s ORDER BY u.p"""
_WRITE = """WITH r AS (INSERT INTO rt_records SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bytea[]))
UPDATE rt_streams s SET last = c.last FROM unnest($4::bigint[], $5::bigint[]) c(k, last)
WHERE s.k = c.k AND s.k = ANY($6::bigint[])"""
_PAYLOAD = b"x" * 100

Args = tuple[list[int], list[int], list[bytes], list[int], list[int], list[int]]


def _psycopg_sql(sql: str) -> str:
    for n in range(6, 0, -1):
        sql = sql.replace(f"${n}", "%s")
    return sql


def _write_args(keys: list[int], rows: list[tuple[int, int]]) -> Args:
    last = dict(rows)
    sequences = []
    for k in keys:
        last[k] += 1
        sequences.append(last[k])
    return keys, sequences, [_PAYLOAD] * len(keys), list(last), list(last.values()), list(last)


async def _asyncpg_loop(dsn: str, batch: int, until: float) -> int:
    done = 0
    conn = await asyncpg.connect(dsn)
    while time.monotonic() < until:
        keys = sorted(random.sample(range(1, 1001), batch))
        async with conn.transaction():
            rows = await conn.fetch(_LOCK, keys)
            await conn.execute(_WRITE, *_write_args(keys, [(r[0], r[1]) for r in rows]))
        done += 1
    await conn.close()
    return done


async def _psycopg_loop(dsn: str, batch: int, until: float) -> int:
    done = 0
    lock, write = _psycopg_sql(_LOCK), _psycopg_sql(_WRITE)
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    while time.monotonic() < until:
        keys = sorted(random.sample(range(1, 1001), batch))
        async with conn.pipeline() as pipeline:
            cursor = conn.cursor()
            await cursor.execute("BEGIN")
            await cursor.execute(lock, (keys,))
            await pipeline.sync()
            await cursor.execute(write, _write_args(keys, await cursor.fetchall()))
            await cursor.execute("COMMIT")
        done += 1
    await conn.close()
    return done


async def main(args: argparse.Namespace) -> None:
    pg = await start_postgres()
    try:
        conn = await asyncpg.connect(pg.dsn)
        await conn.execute(_SETUP)
        await conn.close()
        postmaster = postmaster_pid(pg)
        drivers: list[tuple[str, Callable[[str, int, float], Awaitable[int]]]] = [
            ("asyncpg", _asyncpg_loop),
            ("psycopg pipeline", _psycopg_loop),
        ]
        for _round in range(args.rounds):
            for name, loop in drivers:
                for connections in (1, 2):
                    before = resource.getrusage(resource.RUSAGE_SELF)
                    pg_before = process_tree_cpu(postmaster)
                    started = time.monotonic()
                    until = started + args.seconds
                    done = sum(await asyncio.gather(*(loop(pg.dsn, args.batch, until) for _ in range(connections))))
                    wall = time.monotonic() - started
                    after = resource.getrusage(resource.RUSAGE_SELF)
                    pg_cpu = process_tree_cpu(postmaster) - pg_before
                    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                    print(
                        f"{name:16s} batch {args.batch} x {connections} connection(s): {done / wall:6.0f} txn/s;"
                        f" CPU per transaction: this process {cpu / done * 1e6:4.0f} us,"
                        f" Postgres {pg_cpu / done * 1e6:4.0f} us",
                        flush=True,
                    )
    finally:
        pg.destroy()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each measurement (default 8)")
    parser.add_argument("--batch", type=int, default=12, help="streams per transaction (default 12, as at 1,000 x 32)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both drivers (default 2)")
    uvloop.run(main(parser.parse_args()))
