"""The Python CPU of one group-commit transaction, by batch size: ``python -m bench.txn_cpu``.

No HTTP and no load generator: this process drives ``runtime.group_commit.GroupCommit`` directly against
its own Postgres (1,000 streams, the append pool's settings), one batch at a time, and reads its own CPU
from ``getrusage``. What a transaction costs whatever it carries (the intercept) and what each append in
it adds (the slope) is what decides how much a larger batch saves. Figures depend on how busy the
machine is: on an idle one each wait for Postgres ends in a cold wake-up, which costs more CPU.

It first prints what one bare round trip to Postgres costs this process (a prepared ``SELECT $1``, and the
``BEGIN``/``COMMIT`` pair every transaction sends): the part of the intercept that only fewer round trips
per transaction would save.

    python -m bench.txn_cpu --batches 1,8,32 --transactions 1500
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import resource
import time
from collections.abc import Awaitable, Callable

from bench.harness import pins, start_postgres
from workflow_streams.domain.authz import Principal
from workflow_streams.domain.pins import parse_pins
from workflow_streams.domain.records import RecordIn
from workflow_streams.runtime.group_commit import GroupCommit
from workflow_streams.runtime.wakes import PollOnly, WakeHub
from workflow_streams.store.appends import CONNECTION_SETTINGS, AppendRequest
from workflow_streams.store.db import create_pool
from workflow_streams.store.definitions import create_definition

STREAMS = 1000


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


async def _per_call(call: Callable[[], Awaitable[object]], n: int) -> tuple[float, float, float]:
    """User and system CPU seconds and wall seconds per call of ``call``, over ``n`` calls after n/10
    unmeasured ones (prepared statements, caches)."""
    for _ in range(n // 10):
        await call()
    (user0, sys0), wall0 = _cpu(), time.perf_counter()
    for _ in range(n):
        await call()
    (user1, sys1), wall1 = _cpu(), time.perf_counter()
    return (user1 - user0) / n, (sys1 - sys0) / n, (wall1 - wall0) / n


async def main(args: argparse.Namespace) -> None:
    pg = await start_postgres()
    try:
        pool = await create_pool(pg.dsn, min_size=1, max_size=2)
        append_pool = await create_pool(
            pg.dsn,
            1,
            GroupCommit.MAX_INFLIGHT,
            server_settings={"application_name": "wfs-appends", **CONNECTION_SETTINGS},
        )
        hub = WakeHub(PollOnly(), pool, 1.0)
        await hub.start()
        who = Principal("bench")
        stream_pins = parse_pins(pins())
        async with pool.acquire() as conn:
            for i in range(STREAMS):
                await create_definition(conn, "txn", f"s{i}", stream_pins, who)
        group = GroupCommit(append_pool, hub)
        payload = json.dumps({"text": "x" * 88}).encode()  # 100 bytes, as the benchmark's appends

        async def transaction(size: int) -> None:
            requests = [
                AppendRequest("txn", f"s{random.randrange(STREAMS)}", [RecordIn("application/json", payload)], who)
                for _ in range(size)
            ]
            await asyncio.gather(*(group.append(r) for r in requests))  # queued in one turn: one batch

        async with append_pool.acquire() as conn:

            async def begin_commit() -> None:
                async with conn.transaction():
                    pass

            for label, call in (
                ("round trip (prepared SELECT $1)", lambda: conn.fetchval("SELECT $1::int", 1)),
                ("BEGIN + COMMIT (two round trips)", begin_commit),
            ):
                user, system, _ = await _per_call(call, args.transactions)
                print(f"{label}: {(user + system) * 1e6:.1f} us CPU", flush=True)

        for size in args.batches:
            user, system, wall = await _per_call(functools.partial(transaction, size), args.transactions)
            cpu = (user + system) * 1e6
            print(
                f"batch {size:4d}: {cpu:7.1f} us CPU per transaction ({user * 1e6:.0f} user, "
                f"{system * 1e6:.0f} system), {cpu / size:6.1f} us per append; "
                f"wall {wall * 1e3:.2f} ms per transaction",
                flush=True,
            )
        await hub.stop()
        await group.close()
        await append_pool.close()
        await pool.close()
    finally:
        pg.destroy()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,32", type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--transactions", type=int, default=1500, help="measured per batch size")
    asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
