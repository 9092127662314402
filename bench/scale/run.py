"""Background work at a million streams (issue 14): ``python -m bench.scale [--quick] [--out DIR]``.

Starts its own PostgreSQL (fsync on) with two databases loaded in bulk with SQL (setup, not a figure):

- *large*: 1,000,000 streams (``--quick``: 20,000) pinned to ``retention.max_records = 10``, each
  holding 10 records of 100 bytes: 10,000,000 records, every stream exactly at its limit;
- *small*: 1,000 streams, the same pins and records.

Then measures, each as a ratio to its goal or to the small database measured in the same run:

1. bytes on disk per 100-byte record, heap + TOAST + indexes (``pg_total_relation_size``);
2. a pruner sweep with nothing due, and with 1,000 streams made due by real appends;
3. append and read latency (``wfs-loadgen append`` and ``wfs-loadgen read``, over HTTP to
   ``workflow-streams serve``, the generator's own CPU beside each figure) on the large database against
   the small one;
4. the pruner keeping up with 2,000 appends/s into streams at their limit (appends through the real
   append statement, the pruner sweeping every second): records beyond the limit after each sweep;
5. the longest append stall while one stream with a million prunable records (``--quick``: 100,000)
   is pruned, against the same appends with no prune.

Writes results.json and results.md into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench import generator
from bench.harness import PREFIX, TOKEN, Server, machine, pins, raise_open_files_limit, start_postgres
from workflow_streams.domain.authz import Principal
from workflow_streams.domain.pins import StreamPins
from workflow_streams.domain.records import RecordIn
from workflow_streams.store.appends import AppendRequest, append_batch
from workflow_streams.store.db import create_pool
from workflow_streams.store.migrate import apply_migrations
from workflow_streams.workers import pruner

LIMIT = 10  # retention.max_records of every stream; each starts with exactly this many records
PAYLOAD = b'"' + b"x" * 98 + b'"'  # a 100-byte JSON record, as wfs-loadgen sends
BENCH = Principal("bench")

GOALS = {
    "sweep_1000_due_s": 2.0,
    "sweep_none_due_s": 0.1,
    "p50_ratio": 1.2,
    "appends_per_s": 2000,
    "bytes_per_record": 250,
}


def stream_pins() -> StreamPins:
    return StreamPins.model_validate({**pins(), "retention": {"max_records": LIMIT}})


async def load(dsn: str, streams: int, per_stream: int, run: str = "bench", prefix: str = "bench-") -> float:
    """``streams`` streams {prefix}{i}, each with ``per_stream`` records, in bulk; returns seconds."""
    started = time.perf_counter()
    p = stream_pins()
    conn = await asyncpg.connect(dsn)
    try:
        # foreign-key triggers off during the bulk load only: every record's stream exists by construction
        await conn.execute("SET session_replication_role = replica")
        await conn.execute(
            """INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by, last_sequence,
                                        appended_bytes, next_prune_at)
               SELECT $1, $2 || i, $3::jsonb, $4, 'bench', $5::bigint, $5::bigint * 100,
                      CASE WHEN $5::bigint > $6::bigint THEN now() END
               FROM generate_series(0, $7::int - 1) AS i""",
            run,
            prefix,
            json.dumps(p.stored()),
            p.digest(),
            per_stream,
            LIMIT,
            streams,
        )
        chunk = 50_000
        for low in range(0, streams, chunk):
            await conn.execute(
                """INSERT INTO wfs_records (run_id, stream_id, sequence, kind, content_type, payload, size_bytes,
                                            cumulative_bytes, appended_by, appended_at)
                   SELECT $1, $2 || i, q, 'inline', 'application/json', $3, 100, q * 100, 'bench', now()
                   FROM generate_series($4::int, $5::int) AS i, generate_series(1, $6::int) AS q
                   ORDER BY $2 || i, q""",  # in key order, as a freshly built index would be
                run,
                prefix,
                PAYLOAD,
                low,
                min(streams, low + chunk) - 1,
                per_stream,
            )
            if streams > chunk:
                print(f"  loaded {min(streams, low + chunk):,} / {streams:,} streams", flush=True)
        await conn.execute("VACUUM ANALYZE wfs_streams")
        await conn.execute("VACUUM ANALYZE wfs_records")
    finally:
        await conn.close()
    return time.perf_counter() - started


async def disk(conn: asyncpg.Connection) -> dict[str, Any]:
    row = await conn.fetchrow(
        """SELECT pg_relation_size('wfs_records') AS heap,
                  pg_total_relation_size('wfs_records') - pg_relation_size('wfs_records')
                    - pg_indexes_size('wfs_records') AS toast,
                  pg_indexes_size('wfs_records') AS indexes,
                  pg_total_relation_size('wfs_records') AS total,
                  (SELECT count(*) FROM wfs_records) AS records,
                  pg_total_relation_size('wfs_streams') AS streams_total,
                  (SELECT count(*) FROM wfs_streams) AS streams"""
    )
    indexes = await conn.fetch(
        """SELECT indexrelid::regclass::text AS name, pg_relation_size(indexrelid) AS bytes
           FROM pg_index WHERE indrelid = 'wfs_records'::regclass ORDER BY 1"""
    )
    out = dict(row)
    out["bytes_per_record"] = round(row["total"] / row["records"], 1)
    out["heap_per_record"] = round(row["heap"] / row["records"], 1)
    out["indexes_per_record"] = {i["name"]: round(i["bytes"] / row["records"], 1) for i in indexes}
    out["bytes_per_stream_row"] = round(row["streams_total"] / row["streams"], 1)
    out["goal"] = GOALS["bytes_per_record"]
    return out


async def make_due(pool: asyncpg.Pool, streams: list[int], prefix: str = "bench-") -> None:
    """One real append (the append statement keeps due-ness) to each of ``streams``, in one transaction."""
    requests = [
        AppendRequest("bench", f"{prefix}{i}", [RecordIn("application/json", PAYLOAD, None)], BENCH) for i in streams
    ]
    async with pool.acquire() as conn, conn.transaction():
        batch = await append_batch(conn, requests)
    refused = [o for o in batch.outcomes if isinstance(o, Exception)]
    assert not refused, refused[:3]


async def sweeps(dsn: str, streams: int) -> dict[str, Any]:
    pool = await create_pool(dsn, 1, 2)
    try:
        none_due = []
        for _ in range(7):
            started = time.perf_counter()
            result = await pruner.sweep(pool, "bench")
            none_due.append(time.perf_counter() - started)
            assert not result.claimed
        due_1000 = []
        for _ in range(3):
            await make_due(pool, random.sample(range(streams), 1000))
            started = time.perf_counter()
            result = await pruner.sweep(pool, "bench")
            due_1000.append(time.perf_counter() - started)
            assert len(result.claimed) == 1000 and result.records == 1000, (len(result.claimed), result.records)
        async with pool.acquire() as conn:
            plan = await conn.fetch(
                """EXPLAIN (ANALYZE, BUFFERS) SELECT run_id, stream_id FROM wfs_streams
                   WHERE next_prune_at <= now() ORDER BY next_prune_at LIMIT 500"""
            )
    finally:
        await pool.close()
    return {
        "none_due_s": {"median": statistics.median(none_due), "max": max(none_due), "runs": none_due},
        "due_1000_s": {"median": statistics.median(due_1000), "max": max(due_1000), "runs": due_1000},
        "due_index_plan": [r[0] for r in plan],
        "goals": {"due_1000_s": GOALS["sweep_1000_due_s"], "none_due_s": GOALS["sweep_none_due_s"]},
    }


async def reads(base: str, streams: int, seconds: float, conns: int = 8) -> dict[str, Any]:
    """``wfs-loadgen read``: GETs of the page after the cursor of random streams among ``streams``, ``conns``
    at a time (the same connections as the appends), every answer checked for 200. Compiled, with its
    own CPU in the report: a Python client on these two cores saturated before the server did, and
    its own scheduling delays were part of every figure."""
    # after=5: always retained (every stream keeps its last 10 records), so every read returns 5 records
    return await generator.run(
        "read",
        base,
        TOKEN,
        run="bench",
        prefix="bench-",
        streams=streams,
        conns=conns,
        after=5,
        warmup="2s",
        duration=f"{seconds}s",
    )


async def latency(server: Server, streams: int, seconds: float) -> dict[str, Any]:
    base = server.url + PREFIX
    append = await generator.run(
        "append",
        base,
        TOKEN,
        run="bench",
        prefix="bench-",
        streams=streams,
        conns=8,
        warmup="2s",
        duration=f"{seconds}s",
    )
    return {"append": append, "read": await reads(base, streams, seconds)}


async def sustained(dsn: str, seconds: float, rate: int = 2000, streams: int = 1000) -> dict[str, Any]:
    """``rate`` appends/s (batches every 100 ms, one record each) into ``streams`` streams at their limit,
    while the pruner sweeps every second; how far beyond the limit they are after each sweep."""
    writer = await create_pool(dsn, 1, 2)
    sweeper = await create_pool(dsn, 1, 2)
    check = await asyncpg.connect(dsn)
    excess_sql = """SELECT coalesce(sum(greatest(last_sequence - earliest_sequence + 1 - $1, 0)), 0)
                    FROM wfs_streams WHERE run_id = 'bench' AND stream_id = ANY($2::text[])"""
    names = [f"bench-{i}" for i in range(streams)]
    appended = 0
    stop = asyncio.Event()

    async def write() -> None:
        nonlocal appended
        tick = 0.1
        per_tick = rate // 10
        next_at = time.perf_counter()
        while not stop.is_set():
            await make_due(writer, [random.randrange(streams) for _ in range(per_tick)])
            appended += per_tick
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    sweep_seconds: list[float] = []
    excess_after: list[int] = []

    async def sweep_loop() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            await pruner.sweep(sweeper, "bench-sustained")
            sweep_seconds.append(time.perf_counter() - began)
            excess_after.append(int(await check.fetchval(excess_sql, LIMIT, names)))
            await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - began)))

    started = time.perf_counter()
    tasks = [asyncio.create_task(write()), asyncio.create_task(sweep_loop())]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    half = len(excess_after) // 2
    for pool in (writer, sweeper):
        await pool.close()
    await check.close()
    return {
        "target_appends_per_s": rate,
        "appends_per_s": appended / elapsed,
        "streams": streams,
        "sweeps": len(sweep_seconds),
        "sweep_s": {"median": statistics.median(sweep_seconds), "max": max(sweep_seconds)},
        "pruner_duty": sum(sweep_seconds) / elapsed,
        "excess_records_after_sweep": {"first": excess_after[0], "max": max(excess_after), "last": excess_after[-1]},
        # bounded: the backlog left after a sweep does not grow from the first half of the run to the second
        "kept_up": sum(sweep_seconds) / elapsed < 1.0 and max(excess_after[half:]) <= max([*excess_after[:half], rate]),
    }


async def big_prune_stall(dsn: str, server: Server, records: int, seconds: float) -> dict[str, Any]:
    """Appends to one stream while a million of its records are pruned, against the same without."""
    base = server.url + PREFIX

    async def appends() -> dict[str, Any]:
        return await generator.run(
            "append", base, TOKEN, run="bench", prefix="big-", streams=1, conns=4, warmup="1s", duration=f"{seconds}s"
        )

    baseline = await appends()  # the big stream is loaded but nothing prunes it yet
    pool = await create_pool(dsn, 1, 2)
    try:
        load_task = asyncio.create_task(appends())
        await asyncio.sleep(1.5)  # past the generator's warm-up: the prune runs inside its measured window
        began = time.perf_counter()
        result = await pruner.sweep(pool, "bench-big")
        prune_s = time.perf_counter() - began
        during = await load_task
    finally:
        await pool.close()
    return {
        "prunable_records": records - LIMIT,
        "pruned": result.records,
        "prune_s": prune_s,
        "pruned_per_s": result.records / prune_s,
        "transactions": result.transactions,
        "append_without_prune_ms": baseline["latency_ms"],
        "append_during_prune_ms": during["latency_ms"],
        "prune_within_window": prune_s < seconds - 0.5,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    large_streams = 20_000 if args.quick else 1_000_000
    big = 100_000 if args.quick else 1_000_000
    seconds = 5.0 if args.quick else 10.0
    await asyncio.to_thread(generator.binary)
    pg = await start_postgres()
    results: dict[str, Any] = {
        "machine": machine(),
        "started": dt.datetime.now(dt.UTC).isoformat(),
        "mode": "quick" if args.quick else "full",
        "large_streams": large_streams,
        "records_per_stream": LIMIT,
        "goals": GOALS,
    }
    try:
        admin = await asyncpg.connect(pg.dsn)
        for name in ("small", "large"):
            await admin.execute(f"CREATE DATABASE {name}")
        await admin.close()
        small, large = pg.dsn_for("small"), pg.dsn_for("large")
        for dsn in (small, large):
            await apply_migrations(dsn)
        print(f"setup: {large_streams:,} streams x {LIMIT} records (bulk SQL)", flush=True)
        results["setup_s"] = {"large": await load(large, large_streams, LIMIT), "small": await load(small, 1000, LIMIT)}
        conn = await asyncpg.connect(large)
        results["disk"] = await disk(conn)
        await conn.close()
        print(f"disk: {results['disk']['bytes_per_record']} bytes per record", flush=True)
        print("sweeps", flush=True)
        results["sweeps"] = await sweeps(large, large_streams)
        print(
            f"  none due {results['sweeps']['none_due_s']['median'] * 1000:.1f} ms, "
            f"1,000 due {results['sweeps']['due_1000_s']['median']:.2f} s",
            flush=True,
        )
        print("append/read latency: small, then large", flush=True)
        lat: dict[str, Any] = {}
        for name, dsn, streams in (
            ("small_1000", small, 1000),
            ("large_1000", large, 1000),
            ("large_all", large, large_streams),
        ):
            server = Server(dsn, out / f"server-{name}.log")
            try:
                await server.ready()
                lat[name] = await latency(server, streams, seconds)
            finally:
                server.stop()
            print(
                f"  {name}: append p50 {lat[name]['append']['latency_ms']['p50']} ms, "
                f"read p50 {lat[name]['read']['latency_ms']['p50']:.2f} ms "
                f"(generator CPU append {lat[name]['append']['cpu_share']:.2f}, "
                f"read {lat[name]['read']['cpu_share']:.2f})",
                flush=True,
            )
        for name in ("large_1000", "large_all"):
            lat[f"{name}_over_small"] = {
                "append_p50": lat[name]["append"]["latency_ms"]["p50"]
                / lat["small_1000"]["append"]["latency_ms"]["p50"],
                "read_p50": lat[name]["read"]["latency_ms"]["p50"] / lat["small_1000"]["read"]["latency_ms"]["p50"],
            }
        results["latency"] = lat
        print("sustained appends with the pruner", flush=True)
        results["sustained"] = await sustained(large, 3 * seconds)
        print(
            f"  {results['sustained']['appends_per_s']:.0f} appends/s, duty {results['sustained']['pruner_duty']:.2f}",
            flush=True,
        )
        print("append stall during a big prune", flush=True)
        await load(small, 1, big, prefix="big-")
        server = Server(small, out / "server-big.log")
        try:
            await server.ready()
            results["big_prune"] = await big_prune_stall(small, server, big, max(seconds, 20.0))
        finally:
            server.stop()
        print(
            f"  max append {results['big_prune']['append_during_prune_ms']['max']} ms during the prune "
            f"(without: {results['big_prune']['append_without_prune_ms']['max']} ms)",
            flush=True,
        )
    finally:
        await asyncio.to_thread(pg.destroy)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "results.md").write_text(report(results))
    print(f"wrote {out / 'results.md'}", flush=True)
    return results


def report(r: dict[str, Any]) -> str:
    d, s, lat, su, bp = r["disk"], r["sweeps"], r["latency"], r["sustained"], r["big_prune"]
    a = lambda name, q: lat[name]["append"]["latency_ms"][q]  # noqa: E731
    rd = lambda name, q: lat[name]["read"]["latency_ms"][q]  # noqa: E731

    def gen(name: str, what: str) -> str:
        """The generator's rate and its own CPU beside a latency figure: a saturated generator shows here."""
        g = lat[name][what]
        rate = g["appends_per_s"] if what == "append" else g["reads_per_s"]
        return f"{rate:,.0f}/s, generator CPU {g['cpu_share'] * 100:.0f}% of a core"

    lines = [
        f"# Scale benchmark ({r['mode']}): {r['large_streams']:,} streams x {r['records_per_stream']} records",
        "",
        f"Machine: {r['machine']['cpu']}, {r['machine']['cores']} cores, {r['machine']['postgres']}. "
        "Server, Postgres and the generator share the cores.",
        "",
        "| figure | measured | goal |",
        "| --- | ---: | ---: |",
        f"| sweep, 1,000 due (median of 3) | {s['due_1000_s']['median']:.3f} s | < 2 s |",
        f"| sweep, none due (median of 7) | {s['none_due_s']['median'] * 1000:.1f} ms | < 100 ms |",
        f"| append p50 / p99, 1,000-stream db | {a('small_1000', 'p50')} / {a('small_1000', 'p99')} ms "
        f"({gen('small_1000', 'append')}) | |",
        f"| append p50 / p99, large db, 1,000 of its streams | {a('large_1000', 'p50')} / {a('large_1000', 'p99')} ms "
        f"(x{lat['large_1000_over_small']['append_p50']:.2f}; {gen('large_1000', 'append')}) | <= x1.2 |",
        f"| append p50 / p99, large db, all its streams | {a('large_all', 'p50')} / {a('large_all', 'p99')} ms "
        f"(x{lat['large_all_over_small']['append_p50']:.2f}; {gen('large_all', 'append')}) | <= x1.2 |",
        f"| read p50 / p99, 1,000-stream db | {rd('small_1000', 'p50'):.2f} / {rd('small_1000', 'p99'):.2f} ms "
        f"({gen('small_1000', 'read')}) | |",
        f"| read p50 / p99, large db, 1,000 of its streams | {rd('large_1000', 'p50'):.2f} / "
        f"{rd('large_1000', 'p99'):.2f} ms (x{lat['large_1000_over_small']['read_p50']:.2f}; "
        f"{gen('large_1000', 'read')}) | <= x1.2 |",
        f"| read p50 / p99, large db, all its streams | {rd('large_all', 'p50'):.2f} / {rd('large_all', 'p99'):.2f} ms "
        f"(x{lat['large_all_over_small']['read_p50']:.2f}; {gen('large_all', 'read')}) | <= x1.2 |",
        f"| sustained appends into streams at their limit | {su['appends_per_s']:.0f}/s, pruner busy "
        f"{su['pruner_duty'] * 100:.0f}% of the time, excess after sweeps first/max/last "
        f"{su['excess_records_after_sweep']['first']}/{su['excess_records_after_sweep']['max']}/"
        f"{su['excess_records_after_sweep']['last']} | 2,000/s kept up |",
        f"| big prune: {bp['pruned']:,} records | {bp['prune_s']:.1f} s ({bp['pruned_per_s']:,.0f}/s, "
        f"{bp['transactions']} transactions) | |",
        f"| append max / p99 during it (without) | {bp['append_during_prune_ms']['max']} / "
        f"{bp['append_during_prune_ms']['p99']} ms ({bp['append_without_prune_ms']['max']} / "
        f"{bp['append_without_prune_ms']['p99']} ms) | |",
        f"| bytes on disk per 100-byte record, indexes included | {d['bytes_per_record']} "
        f"(heap {d['heap_per_record']}, indexes {d['indexes_per_record']}) | <= 250 |",
        f"| bytes per stream row (wfs_streams with its indexes) | {d['bytes_per_stream_row']} | |",
        "",
        "Due-index plan (sweep's claim scan):",
        "",
        "```",
        *s["due_index_plan"],
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    raise_open_files_limit()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20,000 streams instead of 1,000,000 (a few minutes)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/scale/latest"))
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
