"""The measurements: Postgres ceilings from pgbench, then appends and live delivery driven by the
compiled generator (``bench/loadgen``), each with the generator's, the server's and Postgres' CPU."""

from __future__ import annotations

import asyncio
import re
import resource
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench import generator
from bench.harness import (
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
from workflow_streams.local.postgres import LocalPostgres

PGBENCH_SCRIPTS = Path(__file__).resolve().parent / "pgbench"


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


QUICK = Timing(
    pgbench_seconds=5,
    around_seconds=3,
    around_settle=3.0,
    append_warmup=1.0,
    append_seconds=4.0,
    sse_seconds=5.0,
    catch_up_records=200_000,
)
FULL = Timing(
    pgbench_seconds=20,
    around_seconds=10,
    around_settle=10.0,
    append_warmup=3.0,
    append_seconds=20.0,
    sse_seconds=30.0,
    catch_up_records=200_000,  # as the quick run and bench.catchup: the figures compare across them
)

# (streams, connections)
APPEND_CASES = [(1, 8), (1, 32), (1, 128), (1000, 8), (1000, 32), (1000, 128)]
# (subscribers, streams, appends/s in total)
# subscribers, streams, appends a second, records already in each stream when they connect (a burst of
# subscribers reconnecting behind after an outage: they read the backlog from the start, then follow)
SSE_CASES = [(1, 1, 50.0, 0), (100, 1, 50.0, 0), (1000, 1, 20.0, 0), (10_000, 1000, 100.0, 0), (1000, 100, 100.0, 2000)]


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
    in-transaction ``pg_notify`` the server sends today."""
    run = _clients(clients, seconds)
    init_pgbench(pg)
    simple_run = simple_update(pg, seconds, clients)
    simple = simple_run["tps"]
    print(
        f"  pgbench -N, {clients} clients: {simple:,.0f} tps; CPU cores: pgbench {simple_run['client_cores']}, "
        f"postgres {simple_run['postgres_cores']} ({simple_run['cpu_us_per_txn']} us per transaction)",
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
