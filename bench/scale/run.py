"""Background work at a million streams (issue 14): ``python -m bench.scale [--quick] [--out DIR]``.

Starts its own PostgreSQL (fsync on) with two databases loaded in bulk with SQL (setup, not a figure):

- *large*: 1,000,000 streams (``--quick``: 20,000) pinned to ``retention.max_records = 10``, each
  holding 10 records of 100 bytes: 10,000,000 records, every stream exactly at its limit;
- *small*: 1,000 streams, the same pins and records.

Then measures, each as a ratio to its goal or to the small database measured in the same run:

1. bytes on disk per 100-byte record, heap + TOAST + indexes (``pg_total_relation_size``): after the
   bulk load (best case: pages full, in key order) and in steady state (``steady_disk``: a database
   whose every record has been appended and pruned several times over, with autovacuum);
2. a pruner sweep with nothing due, and with 1,000 streams made due by real appends;
3. the page read in Postgres alone (pgbench running ``store.reads._PAGE``) on both databases, with
   the share of page reads that missed shared buffers and a plan with its buffers; then append and
   read latency (``wfs-loadgen append`` and ``wfs-loadgen read``, over HTTP to ``workflow-streams
   serve``, in interleaved rounds, the generator's and other processes' CPU beside each figure) on the
   large database against the small one;
4. the pruner keeping up with 2,000 appends/s into streams at their limit (appends through the real
   append statement, the pruner sweeping every second): records beyond the limit after each sweep;
5. the longest append stall while one stream with a million prunable records (``--quick``: 100,000)
   is pruned, against the same appends with no prune.

Writes results.json into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import random
import re
import statistics
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench import generator
from bench.harness import (
    PREFIX,
    TOKEN,
    Meter,
    Server,
    machine,
    pg_tool,
    pins,
    postmaster_pid,
    raise_open_files_limit,
    start_postgres,
)
from workflow_streams.domain.authz import Principal
from workflow_streams.domain.pins import StreamPins
from workflow_streams.domain.records import RecordIn
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.store import reads as reads_store
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
    """``streams`` streams {prefix}{i}, each with ``per_stream`` records, in bulk; returns seconds.
    Records go in in primary-key order (stream_key, sequence), a chunk of streams at a time, as a freshly
    built index would lay them out: the figure after the load is the best case, and the steady state
    after appends and prunes is measured separately (``steady_disk``)."""
    started = time.perf_counter()
    p = stream_pins()
    conn = await asyncpg.connect(dsn)
    try:
        # foreign-key triggers off during the bulk load only: every record's stream exists by construction
        await conn.execute("SET session_replication_role = replica")
        low, high = await conn.fetchrow(
            """WITH made AS (
                   INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by, last_sequence,
                                            appended_bytes, next_prune_at)
                   SELECT $1, $2 || i, $3::jsonb, $4, 'bench', $5::bigint, $5::bigint * 100,
                          CASE WHEN $5::bigint > $6::bigint THEN now() END
                   FROM generate_series(0, $7::int - 1) AS i
                   RETURNING stream_key)
               SELECT min(stream_key), max(stream_key) FROM made""",
            run,
            prefix,
            json.dumps(p.stored()),
            p.digest(),
            per_stream,
            LIMIT,
            streams,
        )
        chunk = 50_000
        for first in range(low, high + 1, chunk):
            await conn.execute(
                """INSERT INTO wfs_records (stream_key, sequence, cumulative_bytes, appended_at, content_type,
                                            appended_by, payload)
                   SELECT k, q, q * 100, now(), NULL, NULL, $1  -- defaults as the server stores them (483)
                   FROM generate_series($2::bigint, $3::bigint) AS k, generate_series(1, $4::int) AS q
                   ORDER BY k, q""",
                PAYLOAD,
                first,
                min(high, first + chunk - 1),
                per_stream,
            )
            if streams > chunk:
                print(f"  loaded {min(streams, first - low + chunk):,} / {streams:,} streams", flush=True)
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


async def steady_disk(pg: LocalPostgres, seconds: float, streams: int = 5000) -> dict[str, Any]:
    """Bytes per record in steady state: a fresh database of 1,000 streams at their limit (10 records of
    100 B), then 2,000 appends/s into them with the pruner sweeping every second (``sustained``) for
    ``seconds``, several times over every record, and autovacuum at its default thresholds but
    checking every second (its default minute is longer than the whole run, where in service dead rows
    pass its 20 % threshold far more slowly than they are checked for). Measured as the run left it:
    live and dead rows, split pages and the free space vacuum made, all as in service. The bulk load's
    figure is the best case (every page full, in key order); this one is what a table in use holds."""
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute("CREATE DATABASE steady")
        await admin.execute("ALTER SYSTEM SET autovacuum_naptime = '1s'")
        await admin.execute("SELECT pg_reload_conf()")
        dsn = pg.dsn_for("steady")
        await apply_migrations(dsn)
        await load(dsn, streams, LIMIT)
        churn = await sustained(dsn, seconds, streams=streams)
        conn = await asyncpg.connect(dsn)
        try:
            out = await disk(conn)
            vacuum = await conn.fetchrow(
                """SELECT n_live_tup, n_dead_tup, autovacuum_count, n_tup_ins, n_tup_del
                   FROM pg_stat_user_tables WHERE relname = 'wfs_records'"""
            )
        finally:
            await conn.close()
    finally:
        await admin.execute("ALTER SYSTEM RESET autovacuum_naptime")
        await admin.execute("SELECT pg_reload_conf()")
        await admin.close()
    out["churn"] = {k: churn[k] for k in ("appends_per_s", "sweeps", "excess_records_after_sweep")}
    out["turnovers"] = round(churn["appends_per_s"] * seconds / (streams * LIMIT), 1)
    out["streams"] = streams
    out["vacuum"] = dict(vacuum)
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


async def measured(
    mode: str, server: Server, postgres_pid: int, streams: int, seconds: float, **flags: Any
) -> dict[str, Any]:
    """One ``wfs-loadgen`` run (8 connections, 2 s warm-up) with the CPU of its measured window."""
    meter = Meter(server, postgres_pid)
    report = await generator.run(
        mode,
        server.url + PREFIX,
        TOKEN,
        on_phase=meter.mark,
        run="bench",
        prefix="bench-",
        streams=streams,
        conns=8,
        warmup="2s",
        duration=f"{seconds}s",
        **flags,
    )
    report["cores"] = meter.cores("measuring", "measured", report["cpu_seconds"])
    return report


CASES = ("small_1000", "large_1000", "large_all")


async def latency(
    servers: dict[str, Server], postgres_pid: int, large_streams: int, seconds: float, rounds: int
) -> dict[str, Any]:
    """Appends (``wfs-loadgen append``) then reads (``wfs-loadgen read``: the page after cursor 5, always
    retained, 5 records) of each case, in ``rounds`` interleaved rounds: small db, large db on 1,000 of
    its streams, large db on all. The machine is shared with other work that comes and goes; measured
    one case after the other, a burst of it lands on one case only, and a ratio of two such windows
    measured the burst (the first full run read x1.35-1.42 with its Python client). Each figure is the
    median over rounds of the case's p50; each window's CPU is kept, others' share included."""
    streams = {"small_1000": 1000, "large_1000": 1000, "large_all": large_streams}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {"append": [], "read": []} for c in CASES}
    for round_ in range(rounds):
        for case in CASES:
            server = servers[case.split("_")[0]]
            runs[case]["append"].append(await measured("append", server, postgres_pid, streams[case], seconds))
            runs[case]["read"].append(await measured("read", server, postgres_pid, streams[case], seconds, after=5))
            print(
                f"  round {round_ + 1} {case}: append p50 {runs[case]['append'][-1]['latency_ms']['p50']} ms, "
                f"read p50 {runs[case]['read'][-1]['latency_ms']['p50']} ms "
                f"(cores: {runs[case]['read'][-1]['cores']})",
                flush=True,
            )
    out: dict[str, Any] = {"rounds": rounds, "seconds": seconds, "runs": runs}
    for case in CASES:
        out[case] = {
            what: {
                "p50_ms": statistics.median(r["latency_ms"]["p50"] for r in runs[case][what]),
                "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in runs[case][what]),
                "per_s": statistics.median(
                    r["appends_per_s" if what == "append" else "reads_per_s"] for r in runs[case][what]
                ),
                "generator_cores": max(r["cores"]["generator"] for r in runs[case][what]),
                "others_cores": statistics.median(r["cores"]["others"] for r in runs[case][what]),
                "errors": sum(sum(r["errors"].values()) for r in runs[case][what]),
            }
            for what in ("append", "read")
        }
    for case in ("large_1000", "large_all"):
        out[f"{case}_over_small"] = {
            f"{what}_p50": out[case][what]["p50_ms"] / out["small_1000"][what]["p50_ms"] for what in ("append", "read")
        }
        # the same ratio within each round: its spread says how far one ratio can be trusted
        out[f"{case}_over_small"]["read_p50_by_round"] = [
            round(r["latency_ms"]["p50"] / s["latency_ms"]["p50"], 3)
            for r, s in zip(runs[case]["read"], runs["small_1000"]["read"], strict=True)
        ]
    return out


def page_read_script(directory: Path) -> Path:
    """Exactly the server's page read (``store.reads._PAGE``, the stream's row and the records after
    cursor 5, at most the API's default 100) as a pgbench script, a random stream per transaction."""
    sql = (
        reads_store._PAGE.replace("$1", "'bench'")
        .replace("$2", "('bench-' || :s)")
        .replace("$3", "5")
        .replace("$4", "100")
    )
    path = directory / "page_read.sql"
    path.write_text("\\set s random(0, :streams - 1)\n" + " ".join(sql.split()) + ";\n")
    return path


async def page_read_ceiling(
    pg: LocalPostgres, database: str, streams: int, seconds: float, script: Path
) -> dict[str, Any]:
    """The page read with no server in front: pgbench (compiled, prepared statements, 8 clients) on
    ``streams`` random streams of ``database``, with the share of page reads that missed Postgres'
    shared buffers (pg_stat_database) and one plan with its buffers, of a stream not read before."""
    conn = await asyncpg.connect(pg.dsn_for(database))
    try:
        blocks = "SELECT blks_hit, blks_read FROM pg_stat_database WHERE datname = current_database()"
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        hit0, read0 = await conn.fetchrow(blocks)
        args = ["-n", "-M", "prepared", "-c", "8", "-j", "2", "-T", str(int(seconds)), "-D", f"streams={streams}"]
        text = (await asyncio.to_thread(pg_tool, pg, "pgbench", *args, "-f", str(script), database)).stdout
        # pgbench's backends flushed their counters as they exited; a fresh snapshot sees them
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        hit1, read1 = await conn.fetchrow(blocks)
        stream = f"bench-{random.randrange(streams)}"
        plan = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + reads_store._PAGE, "bench", stream, 5, 100)
    finally:
        await conn.close()
    tps = float(re.search(r"tps = ([\d.]+)", text)[1])  # type: ignore[index]
    avg = float(re.search(r"latency average = ([\d.]+) ms", text)[1])  # type: ignore[index]
    return {
        "streams": streams,
        "reads_per_s": round(tps),
        "latency_avg_ms": avg,
        "shared_buffer_misses": round((read1 - read0) / max(1, hit1 - hit0 + read1 - read0), 4),
        "plan": [r[0] for r in plan],
    }


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
    rounds = 2 if args.quick else 3
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
        print("page read without the server (pgbench): small, then large", flush=True)
        script = page_read_script(out)
        results["page_read_ceiling"] = ceilings = {"small_1000": [], "large_all": []}
        for _round, (case, database, streams) in itertools.product(
            range(rounds), (("small_1000", "small", 1000), ("large_all", "large", large_streams))
        ):
            ceiling = await page_read_ceiling(pg, database, streams, seconds, script)
            ceilings[case].append(ceiling)
            print(
                f"  {case}: {ceiling['reads_per_s']:,} reads/s, avg {ceiling['latency_avg_ms']} ms, "
                f"{ceiling['shared_buffer_misses'] * 100:.1f}% of page reads missed shared buffers",
                flush=True,
            )
        print(f"append/read latency: {rounds} interleaved rounds of small, large (1,000), large (all)", flush=True)
        servers = {name: Server(dsn, out / f"server-{name}.log") for name, dsn in (("small", small), ("large", large))}
        try:
            for server in servers.values():
                await server.ready()
            lat = await latency(servers, postmaster_pid(pg), large_streams, seconds, rounds)
        finally:
            for server in servers.values():
                server.stop()
        results["latency"] = lat
        print("disk in steady state: 5,000 streams, 2,000 appends/s with the pruner, autovacuum", flush=True)
        results["disk_steady"] = steady = await steady_disk(pg, 75.0)  # three turnovers of 50,000 records
        print(
            f"  {steady['bytes_per_record']} bytes per record after {steady['turnovers']} turnovers "
            f"(heap {steady['heap_per_record']}, indexes {steady['indexes_per_record']}; {steady['vacuum']})",
            flush=True,
        )
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
    return results


def main() -> None:
    raise_open_files_limit()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20,000 streams instead of 1,000,000 (a few minutes)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/scale/latest"))
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
