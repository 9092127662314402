"""The measurements: Postgres ceilings from pgbench, then appends, live delivery, small reads, batched
appends (beside Redis) and the Durable Streams surface's appends (beside our API's and the protocol's
reference server), driven by the compiled generator (``bench/loadgen``), each with the generator's, the
server's and Postgres' CPU."""

from __future__ import annotations

import asyncio
import json
import re
import resource
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench import generator, redis
from bench.harness import (
    AUTH,
    PREFIX,
    TOKEN,
    Meter,
    Server,
    appends_per_transaction,
    group_commits,
    listen_overflows,
    pg_tool,
    pins,
    postmaster_pid,
    process_tree_cpu,
)
from workflow_streams.local.npm import npm_ci
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.local.process import Process

PGBENCH_SCRIPTS = Path(__file__).resolve().parent / "pgbench"
DS_PREFIX = "/api/durable-streams"  # the Durable Streams protocol surface, on the same server
REFERENCE = Path(__file__).resolve().parent / "catchup"  # the npm project holding the reference server


@dataclass(frozen=True)
class Timing:
    """How long each measurement runs: ``--quick`` or full."""

    pgbench_seconds: int
    around_seconds: int  # pgbench -N before each append case and after the last (``appends``)
    around_settle: float  # ... each after this pause: right after a case it reads ~5 % low
    append_warmup: float
    append_seconds: float
    sse_seconds: float
    catch_up_records: int
    read_warmup: float  # small reads (``small_reads``)
    read_seconds: float
    batch_seconds: float  # batched and durable appends (their warm-up is append_warmup)
    redis_seconds: float  # each Redis XADD ceiling, about (its -n is sized from a first, shorter run)


QUICK = Timing(
    pgbench_seconds=5,
    around_seconds=3,
    around_settle=3.0,
    append_warmup=1.0,
    append_seconds=4.0,
    sse_seconds=5.0,
    catch_up_records=200_000,
    read_warmup=1.0,
    read_seconds=4.0,
    batch_seconds=4.0,
    redis_seconds=4.0,
)
FULL = Timing(
    pgbench_seconds=20,
    around_seconds=10,
    around_settle=10.0,
    append_warmup=3.0,
    append_seconds=20.0,
    sse_seconds=30.0,
    catch_up_records=200_000,  # as the quick run and bench.catchup: the figures compare across them
    read_warmup=3.0,
    read_seconds=20.0,
    batch_seconds=20.0,
    redis_seconds=10.0,
)

# (streams, connections)
APPEND_CASES = [(1, 8), (1, 32), (1, 128), (1000, 8), (1000, 32), (1000, 128)]
# (subscribers, streams, appends/s in total)
# subscribers, streams, appends a second, records already in each stream when they connect (a burst of
# subscribers reconnecting behind after an outage: they read the backlog from the start, then follow)
SSE_CASES = [(1, 1, 50.0, 0), (100, 1, 50.0, 0), (1000, 1, 20.0, 0), (10_000, 1000, 100.0, 0), (1000, 100, 100.0, 2000)]
# small reads: streams, connections, records each stream holds, the ?limit= of each read (issue 47)
READ_SHAPE = (1000, 32, 20)
READ_LIMITS = [1, 10]
# batched appends: streams, connections; records per request, each beside Redis XADD pipelined as deep
BATCH_SHAPE = (1000, 32)
BATCHES = [10, 100]
# the Durable Streams surface's appends: streams, connections (beside our API's in the same shape)
DURABLE_SHAPE = (1000, 32)


def _ratio(ours: float, base: float) -> float:
    return round(ours / base, 3) if base else float("nan")


# --- ceilings -----------------------------------------------------------------------------------


def _pgbench(pg: LocalPostgres, *args: str) -> float:
    return _pgbench_cpu(pg, *args)["tps"]


def _pgbench_cpu(pg: LocalPostgres, *args: str) -> dict[str, float]:
    """pgbench's tps, and the CPU per transaction of pgbench itself and of Postgres (all backends): the
    ceiling's own cost, to set beside the CPU per append of the server's cases."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    postgres = process_tree_cpu(postmaster_pid(pg))
    began = time.perf_counter()
    result = pg_tool(pg, "pgbench", *args)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = re.search(r"tps = ([\d.]+)", result.stdout)
    if not match:
        raise RuntimeError(f"pgbench {' '.join(args)} printed no tps:\n{result.stdout}\n{result.stderr}")
    tps = float(match[1])
    client = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    server = process_tree_cpu(postmaster_pid(pg)) - postgres
    transactions = tps * wall  # the run's wall time includes connecting: a little generous to pgbench
    return {
        "tps": tps,
        "client_cores": round(client / wall, 3),
        "postgres_cores": round(server / wall, 3),
        "cpu_us_per_txn": round((client + server) / transactions * 1e6) if transactions else float("nan"),
    }


def _clients(clients: int, seconds: int) -> list[str]:
    return ["-n", "-c", str(clients), "-j", "2", "-T", str(seconds)]


def init_pgbench(pg: LocalPostgres) -> None:
    """pgbench's tables, made anew (scale 1) in the database ``pgbench``, created when missing."""
    pg_tool(pg, "createdb", "pgbench", check=False)  # exists already on a second call
    pg_tool(pg, "pgbench", "-i", "-s", "1", "-q", "pgbench")


def simple_update(pg: LocalPostgres, seconds: int, clients: int = 32) -> dict[str, float]:
    """pgbench ``-N`` on the database ``init_pgbench`` made: first there, then around each append case."""
    return _pgbench_cpu(pg, "-N", *_clients(clients, seconds), "pgbench")


def pgbench_ceilings(pg: LocalPostgres, seconds: int, clients: int = 32, streams: int = 1000) -> dict[str, Any]:
    """The commit rate Postgres itself reaches on this machine, with 32 clients: pgbench's simple
    update (``-N``), and exactly our append transaction on 1,000 streams, without and with the
    in-transaction ``pg_notify`` the server sends today; and the rate it answers one-row reads, pgbench's
    select-only (``-S``), the small reads' ceiling."""
    run = _clients(clients, seconds)
    init_pgbench(pg)
    simple_run = simple_update(pg, seconds, clients)
    simple = simple_run["tps"]
    print(
        f"  pgbench -N, {clients} clients: {simple:,.0f} tps; CPU cores: pgbench {simple_run['client_cores']}, "
        f"postgres {simple_run['postgres_cores']} ({simple_run['cpu_us_per_txn']} us per transaction)",
        flush=True,
    )
    select_run = _pgbench_cpu(pg, "-S", *run, "pgbench")
    print(
        f"  pgbench -S, {clients} clients: {select_run['tps']:,.0f} tps; CPU cores: pgbench "
        f"{select_run['client_cores']}, postgres {select_run['postgres_cores']} "
        f"({select_run['cpu_us_per_txn']} us per transaction)",
        flush=True,
    )
    pg_tool(
        pg,
        "psql",
        "-qX",
        "-v",
        "ON_ERROR_STOP=1",
        "-v",
        f"streams={streams}",
        "-f",
        str(PGBENCH_SCRIPTS / "streams.sql"),
        "postgres",
    )
    out = {
        "clients": clients,
        "streams": streams,
        "seconds": seconds,
        "simple_update_tps": round(simple),
        "simple_update_cpu": simple_run,
        "select_only_tps": round(select_run["tps"]),
        "select_only_cpu": select_run,
    }
    for name, script in (("append_tps", "append.sql"), ("append_notify_tps", "append_notify.sql")):
        tps = _pgbench(pg, "-f", str(PGBENCH_SCRIPTS / script), "-D", f"streams={streams}", *run, "postgres")
        out[name] = round(tps)
        print(f"  pgbench {script}, {streams:,} streams, {clients} clients: {tps:,.0f} tps", flush=True)
    pg_tool(
        pg,
        "psql",
        "-qX",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        # records hold no foreign key to their stream (migration 484): they go first, by their stream
        "DELETE FROM wfs_records WHERE stream_key IN (SELECT stream_key FROM wfs_streams WHERE run_id = 'pgbench')",
        "-c",
        "DELETE FROM wfs_streams WHERE run_id = 'pgbench'",
        "-c",
        "CHECKPOINT",
        "postgres",
    )
    return out


# --- appends ------------------------------------------------------------------------------------


async def appends(server: Server, pg: LocalPostgres, timing: Timing, ceilings: dict[str, Any]) -> list[dict[str, Any]]:
    """One-record appends of 100 B over keep-alive connections to random streams among 1 or 1,000."""
    base = server.url + PREFIX
    runs: dict[int, str] = {}
    out = []
    # The machine's speed drifts by tens of percent within minutes (a VM sharing its host), and the run's
    # first ceiling is minutes older than the last case: pgbench -N also runs before each case and after
    # the last, and each case is set beside the mean of the two around it as well.
    around = [await _around(pg, timing)]
    for streams, conns in APPEND_CASES:
        if streams not in runs:
            runs[streams] = f"a{streams}-{uuid.uuid4().hex[:8]}"
            await generator.run("create", base, TOKEN, run=runs[streams], streams=streams, create=pins())
        meter = Meter(server, postmaster_pid(pg))
        vacuums = await autovacuums(pg.dsn)
        commits = await group_commits(server.url)
        report = await generator.run(
            "append",
            base,
            TOKEN,
            on_phase=meter.mark,
            run=runs[streams],
            streams=streams,
            conns=conns,
            warmup=f"{timing.append_warmup}s",
            duration=f"{timing.append_seconds}s",
        )
        rate = report["appends_per_s"]
        measured = meter.between("measuring", "measured")
        vacuums_after = await autovacuums(pg.dsn)
        around.append(await _around(pg, timing))
        before, after = around[-2], around[-1]
        row = {
            "case": f"{streams:,} stream{'s' if streams > 1 else ''} x {conns} connections",
            "streams": streams,
            "connections": conns,
            "appends_per_s": round(rate),
            "x_pgbench_simple": _ratio(rate, ceilings["simple_update_tps"]),
            # pgbench -N right before and right after the case (autovacuum runs during each beside it)
            "pgbench_around": [before, after],
            "x_pgbench_around": _ratio(rate, (before["tps"] + after["tps"]) / 2),
            "x_pgbench_append": _ratio(rate, ceilings["append_tps"]),
            "x_pgbench_append_notify": _ratio(rate, ceilings["append_notify_tps"]),
            "latency_ms": report["latency_ms"],
            "errors": report["errors"],
            "generator_cores": report["cpu_share"],
            **measured,
            # Postgres' own background work in the case (warm-up included): part of its CPU column
            "autovacuums": vacuums_after - vacuums,
            "appends_per_transaction": appends_per_transaction(commits, await group_commits(server.url)),
            "generator": report,
        }
        out.append(row)
        print(
            f"  append {row['case']}: {rate:,.0f}/s (x{row['x_pgbench_simple']} pgbench -N, "
            f"x{row['x_pgbench_around']} the {before['tps']:,} and {after['tps']:,} tps around it), "
            f"p50 {report['latency_ms']['p50']:.1f} ms p99 {report['latency_ms']['p99']:.1f} ms, "
            f"errors {report['errors'] or 0}; CPU cores: generator {report['cpu_share']}, "
            f"server {row['server_cores']}, postgres {row['postgres_cores']} "
            f"(autovacuum/analyze runs {row['autovacuums']}); {row['appends_per_transaction']} appends per "
            "group-commit transaction",
            flush=True,
        )
    return out


async def _around(pg: LocalPostgres, timing: Timing) -> dict[str, int]:
    """pgbench -N between two append cases, with the autovacuum runs that finished meanwhile. After a
    pause: right after 10 s of appends at 1,000 x 32, pgbench -N read 5,922 and 6,046 tps where it had
    read 6,249-6,326 before them and 6,173-6,332 after 10 s of quiet (the case's dirty buffers, WAL and
    vacuum still being written), which would have flattered the case beside it."""
    await settle(timing.around_settle)
    vacuums = await autovacuums(pg.dsn)
    run = await asyncio.to_thread(simple_update, pg, timing.around_seconds)
    return {"tps": round(run["tps"]), "autovacuums": await autovacuums(pg.dsn) - vacuums}


async def autovacuums(dsn: str) -> int:
    """Autovacuum and autoanalyze runs finished so far on the database's tables (they show in Postgres'
    CPU: a case that follows heavy writes may pay for the cleanup of the one before)."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_user_tables"
            )
        )
    finally:
        await conn.close()


# --- live delivery ------------------------------------------------------------------------------


async def deliveries(server: Server, pg: LocalPostgres, timing: Timing) -> list[dict[str, Any]]:
    """Subscribers over SSE on fresh streams while an appender posts at a fixed rate; every
    subscriber's sequences are checked against what the appender got back."""
    base = server.url + PREFIX
    out = []
    for subscribers, streams, rate, backlog in SSE_CASES:
        run = f"l{subscribers}-{uuid.uuid4().hex[:8]}"
        await generator.run("create", base, TOKEN, run=run, streams=streams, create=pins())
        meter = Meter(server, postmaster_pid(pg))
        overflows = listen_overflows()
        try:
            report = await generator.run(
                "sse",
                base,
                TOKEN,
                on_phase=meter.mark,
                run=run,
                streams=streams,
                subscribers=subscribers,
                rate=rate,
                duration=f"{timing.sse_seconds}s",
                backlog=backlog,
            )
        except RuntimeError as exc:  # a failed case is a finding, not the end of the run
            print(f"  sse {subscribers:,} subscribers: FAILED {exc}", flush=True)
            out.append({"case": f"{subscribers:,} subscribers", "subscribers": subscribers, "failed": str(exc)})
            continue
        row = {
            "case": f"{subscribers:,} subscriber{'s' if subscribers > 1 else ''}, "
            f"{streams:,} stream{'s' if streams > 1 else ''}, {rate:g} appends/s"
            + (f", {backlog:,} records behind" if backlog else ""),
            "subscribers": subscribers,
            "backlog": backlog,
            "caught_up_s": report["caught_up_seconds"],
            "streams": streams,
            "rate": rate,
            "connect_s": report["connect_seconds"],
            "listen_overflows": listen_overflows() - overflows,
            "connected": report["connected"],
            "delivered": report["delivered"],
            "expected": report["expected"],
            "duplicates": report["duplicates"],
            "gaps": report["gaps"],
            "missing": report["missing"],
            "latency_ms": report["latency_ms"],
            "generator_cores": report["cpu_share"],
            "connect": meter.between("connecting", "appending"),
            **meter.between("appending", "done"),
            "server_kib_per_subscriber": round(
                (meter.rss("appending") - meter.rss("connecting")) / subscribers / 1024, 1
            ),
            "generator": report,
        }
        out.append(row)
        lat = report["latency_ms"]
        print(
            f"  sse {row['case']}: connected {report['connected']:,} in {report['connect_seconds']:.2f} s "
            + (f"(backlogs read in {report['caught_up_seconds']:.2f} s) " if backlog else "")
            + f"(listen overflows {row['listen_overflows']:,}), "
            f"delivered {report['delivered']:,}/{report['expected']:,} (duplicates {report['duplicates']}, "
            f"gaps {report['gaps']}, missing {report['missing']}), p50 {lat['p50']:.1f} ms p99 {lat['p99']:.1f} ms; "
            f"CPU cores: generator {report['cpu_share']}, server {row['server_cores']}, "
            f"postgres {row['postgres_cores']}",
            flush=True,
        )
    return out


async def settle(seconds: float = 1.0) -> None:
    """A pause between cases, so one case's tail (closing sockets, checkpoints) is not the next one's."""
    await asyncio.sleep(seconds)


# --- small reads, batched appends, the Durable Streams surface's appends (issue 47) --------------


def _loop_row(report: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """What every closed-loop case reports beside its rate: latency, errors, and everyone's CPU over
    the measured window."""
    return {
        "latency_ms": report["latency_ms"],
        "errors": report["errors"],
        "generator_cores": report["cpu_share"],
        **meter.between("measuring", "measured"),
        "generator": report,
    }


def _summary(row: dict[str, Any]) -> str:
    """The end of a case's printed line: p50, p99, errors and the CPU columns."""
    lat = row["latency_ms"]
    return (
        f"p50 {lat['p50']:.1f} ms p99 {lat['p99']:.1f} ms, errors {row['errors'] or 0}; CPU cores: generator "
        f"{row['generator_cores']}, server {row['server_cores']}, postgres {row['postgres_cores']}"
    )


async def _measured(
    server: Server, pg: LocalPostgres, mode: str, base: str, *, warmup: float, seconds: float, **flags: Any
) -> tuple[dict[str, Any], Meter]:
    """One closed-loop case of the generator, with everyone's CPU sampled over its measured window."""
    meter = Meter(server, postmaster_pid(pg))
    report = await generator.run(
        mode, base, TOKEN, on_phase=meter.mark, warmup=f"{warmup}s", duration=f"{seconds}s", **flags
    )
    return report, meter


async def preload(url: str, run: str, streams: int, records: int, prefix: str = "bench-") -> None:
    """``records`` records of 100 B into each of the streams {prefix}0..{streams-1}, one batch append a
    stream, 16 in flight: the small reads' data, loaded before and not timed."""
    body = json.dumps({"records": [{"data": "x" * 98}] * records}).encode()  # 100 bytes of JSON each
    headers = {**AUTH, "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as http:

        async def load(i: int) -> None:
            async with http.post(f"{url}{PREFIX}/runs/{run}/streams/{prefix}{i}/records", data=body) as resp:
                if resp.status != 201:
                    raise RuntimeError(f"loading {prefix}{i}: {resp.status} {await resp.text()}")

        for start in range(0, streams, 16):
            await asyncio.gather(*(load(i) for i in range(start, min(start + 16, streams))))


async def small_reads(
    server: Server, pg: LocalPostgres, timing: Timing, ceilings: dict[str, Any]
) -> list[dict[str, Any]]:
    """Reads of 1 and of 10 records from the start (``?after=0&limit=N``) of random streams among 1,000
    that hold 20 each, over 32 connections: what every polling consumer and every get-then-read pays,
    beside pgbench's select-only transaction (one indexed row a read) on the same Postgres."""
    streams, conns, records = READ_SHAPE
    base = server.url + PREFIX
    run = f"r{streams}-{uuid.uuid4().hex[:8]}"
    await generator.run("create", base, TOKEN, run=run, streams=streams, create=pins())
    await preload(server.url, run, streams, records)
    out = []
    for limit in READ_LIMITS:
        await settle()
        report, meter = await _measured(
            server,
            pg,
            "read",
            base,
            warmup=timing.read_warmup,
            seconds=timing.read_seconds,
            run=run,
            streams=streams,
            conns=conns,
            after=0,
            limit=limit,
        )
        rate = report["reads_per_s"]
        row = {
            "case": f"{streams:,} streams x {conns} connections, after=0 limit={limit}",
            "streams": streams,
            "connections": conns,
            "records_per_stream": records,
            "limit": limit,
            "reads_per_s": round(rate),
            "x_pgbench_select": _ratio(rate, ceilings["select_only_tps"]),
            # a check that a read held what it asked for: ~limit records of ~130 bytes of JSON each
            "bytes_per_read": round(report["bytes_per_s"] / rate) if rate else None,
            **_loop_row(report, meter),
        }
        out.append(row)
        print(
            f"  read {row['case']}: {rate:,.0f}/s (x{row['x_pgbench_select']} pgbench -S at "
            f"{ceilings['select_only_tps']:,} tps; {row['bytes_per_read']} bytes a read), {_summary(row)}",
            flush=True,
        )
    return out


def _redis_ceiling(peer: redis.Redis, pipeline: int, seconds: float) -> dict[str, Any]:
    """Redis XADD pipelined ``pipeline`` deep for about ``seconds``: redis-benchmark counts requests,
    not time, so a first short run (also its warm-up) sizes the measured one."""
    probe = peer.xadd(pipeline, 50_000)
    ceiling = peer.xadd(pipeline, max(50_000, round(probe["records_per_s"] * seconds)))
    ceiling["probe_records_per_s"] = probe["records_per_s"]
    return ceiling


async def batched_appends(server: Server, pg: LocalPostgres, timing: Timing) -> list[dict[str, Any]]:
    """Appends of 10 and of 100 records of 100 B a request to random streams among 1,000 over 32
    connections, each beside Redis XADD pipelined as deep (``bench.redis``), measured just before it
    while the server and Postgres are idle. Without redis-server here the cases run without a ceiling."""
    streams, conns = BATCH_SHAPE
    base = server.url + PREFIX
    run = f"b{streams}-{uuid.uuid4().hex[:8]}"
    await generator.run("create", base, TOKEN, run=run, streams=streams, create=pins())
    peer = redis.Redis() if redis.available() else None
    if peer is None:
        print("  redis-server or redis-benchmark missing (scripts/bootstrap installs them): no Redis ceiling")
    out = []
    try:
        if peer is not None:
            await asyncio.to_thread(peer.ready)
        for batch in BATCHES:
            ceiling = None
            if peer is not None:
                ceiling = await asyncio.to_thread(_redis_ceiling, peer, batch, timing.redis_seconds)
                print(
                    f"  redis XADD -P {batch}, {ceiling['clients']} clients, {ceiling['streams']:,} streams, "
                    f"appendfsync always: {ceiling['records_per_s']:,} records/s, p50 "
                    f"{ceiling['latency_ms']['p50']:.1f} ms p99 {ceiling['latency_ms']['p99']:.1f} ms; CPU cores: "
                    f"redis-benchmark {ceiling['generator_cores']}, redis-server {ceiling['redis_cores']}",
                    flush=True,
                )
            await settle()
            commits = await group_commits(server.url)
            report, meter = await _measured(
                server,
                pg,
                "append",
                base,
                warmup=timing.append_warmup,
                seconds=timing.batch_seconds,
                run=run,
                streams=streams,
                conns=conns,
                batch=batch,
            )
            rate = report["records_per_s"]
            row = {
                "case": f"batches of {batch}, {streams:,} streams x {conns} connections",
                "streams": streams,
                "connections": conns,
                "batch": batch,
                "appends_per_s": round(report["appends_per_s"]),
                "records_per_s": round(rate),
                "redis": ceiling,
                "x_redis": _ratio(rate, ceiling["records_per_s"]) if ceiling else None,
                **_loop_row(report, meter),
                "appends_per_transaction": appends_per_transaction(commits, await group_commits(server.url)),
            }
            out.append(row)
            beside = (
                f"x{row['x_redis']} Redis XADD -P {batch} at {ceiling['records_per_s']:,}/s" if ceiling else "no Redis"
            )
            print(
                f"  append {row['case']}: {report['appends_per_s']:,.0f} requests/s = {rate:,.0f} records/s "
                f"({beside}), {_summary(row)}",
                flush=True,
            )
    finally:
        if peer is not None:
            peer.stop()
    return out


async def durable_appends(server: Server, pg: LocalPostgres, timing: Timing) -> dict[str, Any]:
    """Appends of 100 B to random text/plain streams among 1,000 over 32 connections on the Durable
    Streams surface (``POST /v1/stream/<run>/<stream>``, the raw body, 204), created with the protocol's
    PUT; beside our API's appends in the same shape measured just before, and beside the protocol's
    reference server with its file store (``reference_appends``) when Node is here."""
    streams, conns = DURABLE_SHAPE
    out: dict[str, Any] = {}
    for surface in ("api", "durable"):
        await settle()
        run = f"{surface[0]}{streams}-{uuid.uuid4().hex[:8]}"
        base = server.url + (DS_PREFIX if surface == "durable" else PREFIX)
        create: dict[str, Any] | str = "put" if surface == "durable" else pins()
        await generator.run("create", base, TOKEN, run=run, streams=streams, surface=surface, create=create)
        report, meter = await _measured(
            server,
            pg,
            "append",
            base,
            warmup=timing.append_warmup,
            seconds=timing.batch_seconds,
            run=run,
            streams=streams,
            conns=conns,
            surface=surface,
        )
        out[surface] = {
            "case": f"{'Durable Streams, text/plain' if surface == 'durable' else 'our API'}, "
            f"{streams:,} streams x {conns} connections",
            "surface": surface,
            "streams": streams,
            "connections": conns,
            "appends_per_s": round(report["appends_per_s"]),
            **_loop_row(report, meter),
        }
    await settle()
    out["reference_file"] = await reference_appends(timing, streams, conns)
    ours, api, reference = out["durable"], out["api"], out["reference_file"]
    ours["x_api"] = _ratio(ours["appends_per_s"], api["appends_per_s"])
    ours["x_reference_file"] = _ratio(ours["appends_per_s"], reference["appends_per_s"]) if reference else None
    print(f"  append {api['case']}: {api['appends_per_s']:,}/s, {_summary(api)}", flush=True)
    if reference is not None:
        print(
            f"  append {reference['case']}: {reference['appends_per_s']:,}/s, p50 {reference['latency_ms']['p50']:.1f}"
            f" ms p99 {reference['latency_ms']['p99']:.1f} ms, errors {reference['errors'] or 0}; CPU cores: "
            f"generator {reference['generator_cores']}, reference server {reference['server_cores']}",
            flush=True,
        )
    beside = f", x{ours['x_reference_file']} the reference server's file store" if reference else ""
    print(
        f"  append {ours['case']}: {ours['appends_per_s']:,}/s (x{ours['x_api']} our API's beside it{beside}), "
        f"{_summary(ours)}",
        flush=True,
    )
    return out


async def reference_appends(timing: Timing, streams: int, conns: int) -> dict[str, Any] | None:
    """The same appends against the protocol's reference server (``@durable-streams/server``, from
    bench/catchup's npm project, started by bench/catchup/serve.mjs) with its file store in a temporary
    directory: each append written and fdatasync'ed before its 204, as ours are committed. None when
    Node.js is not here."""
    if shutil.which("node") is None or not (REFERENCE / "package.json").exists():
        print("  Node.js missing: no reference server beside the Durable Streams appends", flush=True)
        return None
    await asyncio.to_thread(npm_ci, REFERENCE, "the reference server beside the Durable Streams appends")
    data = Path(tempfile.mkdtemp(prefix="wfs-ds-reference-"))
    process = Process(
        ["node", "serve.mjs", str(data / "store")], log=data / "reference.log", cwd=REFERENCE, name="reference server"
    )
    try:
        found = await asyncio.to_thread(process.wait_for_output, r'\{"url":"(http://[^"]+)"', seconds=30)
        url = found[1]
        run = f"f{streams}-{uuid.uuid4().hex[:8]}"
        await generator.run("create", url, TOKEN, run=run, streams=streams, surface="durable", create="put")
        marks: dict[str, float] = {}
        report = await generator.run(
            "append",
            url,
            TOKEN,
            on_phase=lambda phase: marks.__setitem__(phase, process_tree_cpu(process.pid)),
            run=run,
            streams=streams,
            conns=conns,
            surface="durable",
            warmup=f"{timing.append_warmup}s",
            duration=f"{timing.batch_seconds}s",
        )
        return {
            "case": f"the reference server {_reference_version()}, file store, "
            f"{streams:,} streams x {conns} connections",
            "store": "file",
            "appends_per_s": round(report["appends_per_s"]),
            "latency_ms": report["latency_ms"],
            "errors": report["errors"],
            "generator_cores": report["cpu_share"],
            "server_cores": round((marks["measured"] - marks["measuring"]) / timing.batch_seconds, 3),
            "generator": report,
        }
    finally:
        process.stop(grace=10)
        shutil.rmtree(data, ignore_errors=True)


def _reference_version() -> str:
    package = REFERENCE / "node_modules" / "@durable-streams" / "server" / "package.json"
    try:
        return str(json.loads(package.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return "(version unknown)"
