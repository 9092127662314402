"""The data plane in the shapes production runs it in, with faults: ``python -m bench.shapes CASE``.

    restarts    PgBouncer (transaction pooling, stock settings) killed and started again twice while
                wfs-loadgen appends at 1,000 streams x 32 connections: the share of appends answered 5xx,
                and how long after each kill appends were acknowledged again (a prober beside the load)
    partition   one data plane in a network namespace cut from Postgres (iptables DROP) for --cut
                seconds under producers and subscribers: the slowest answer, how long after the heal
                appends were acknowledged again, and the self-check (root; network namespaces)
    failover    a primary with a synchronous standby (--asynchronous: an asynchronous one) under two data
                planes with a multi-host DSN: the primary killed, the standby promoted; how long after the
                kill appends were acknowledged again, and the self-check (acknowledged appends lost,
                stored twice, records served that are not stored there)
    chaos       --minutes of faults under producers and subscribers (data plane kills, Postgres crash
                restarts and pauses, failovers with the standby made anew): the self-check at the end

The appends/s ratio through PgBouncer is ``bench.ab``'s (``POOLER:transaction``), against the same case
direct on one Postgres. Producers and subscribers here are ``workflow_streams.local.workload``'s: a
careful client's retries with its Idempotency-Key, subscribers resuming with Last-Event-ID, and a check of
everything acknowledged and seen against what is stored. Its Python client is not the load: only
``restarts`` measures under load, with wfs-loadgen (its CPU printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench import generator
from bench.harness import PREFIX, TOKEN, Server, pins, start_postgres
from workflow_streams.local.postgres import find_bindir, free_port, migrated_database
from workflow_streams.local.topologies import ConfiguredPostgres, Partition, PgBouncer, Replication, ServeInNamespace
from workflow_streams.local.workload import Workload

DATABASE = "wfs"


def _log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="wfs-shapes-"))


async def _prober(work: Workload, base: str, stop: asyncio.Event, producers: int = 4) -> None:
    """Appends one at a time per producer until ``stop``: every attempt's time and answer go in
    ``work.attempts`` (recovery times are read from it)."""

    async def one(n: int) -> None:
        i = 0
        while not stop.is_set():
            await work.append(base, work.streams[n % len(work.streams)], f"probe{work.bases.index(base)}-{n}-{i}")
            i += 1

    await asyncio.gather(*(one(n) for n in range(producers)))


async def restarts(args: argparse.Namespace) -> None:
    logs = _log_dir()
    pg = await start_postgres()
    bouncer = PgBouncer(pg)
    await asyncio.to_thread(bouncer.start)
    server = Server(
        bouncer.dsn_for("postgres"),
        logs / "server.log",
        workers=args.workers,
        WFS_DATABASE_POOLER="transaction",
        WFS_LISTEN_DATABASE_URL=pg.dsn,
    )
    try:
        await server.ready()
        base = server.url + PREFIX
        run = f"restarts-{random.randrange(10**6)}"
        await generator.run("create", base, TOKEN, run=run, streams=1000, create=pins())
        kills: list[float] = []
        stop = asyncio.Event()
        measuring = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            work = Workload(session, [server.url], TOKEN, run=f"probe-{run}", streams=4)
            await work.create(pins())

            def phase(name: str) -> None:
                if name == "measuring":
                    measuring.set()

            async def faults() -> None:
                await measuring.wait()
                started = time.monotonic()
                for at in (args.seconds * 0.3, args.seconds * 0.65):  # within the measured window
                    await asyncio.sleep(started + at - time.monotonic())
                    kills.append(time.monotonic())
                    await asyncio.to_thread(bouncer.restart)

            probe = asyncio.create_task(_prober(work, server.url, stop))
            fault = asyncio.create_task(faults())
            report = await generator.run(
                "append",
                base,
                TOKEN,
                on_phase=phase,
                run=run,
                streams=1000,
                conns=32,
                warmup="2s",
                duration=f"{args.seconds}s",
            )
            await fault
            stop.set()
            await probe
            problems = await work.check()
        failed = sum(n for status, n in report["errors"].items() if status.startswith("5") or not status.isdigit())
        answered = report["requests_ok"] + sum(report["errors"].values())
        recoveries = [work.attempts.first_success_after(kill) for kill in kills]
        print(f"appends through PgBouncer, 1,000 x 32, {args.seconds:g} s, PgBouncer killed and started {len(kills)}x")
        print(
            f"  {report['appends_per_s']:,.0f}/s; {failed} of {answered} answered 5xx or not at all "
            f"({failed / max(answered, 1):.2%}); errors {report['errors']}; generator {report['cpu_share']:.3f} cores"
        )
        print("  acknowledged again after each kill: " + ", ".join(_seconds(r) for r in recoveries))
        print(f"  prober: {work.attempts.statuses}; self-check: {problems or 'ok'}")
    finally:
        server.stop()
        bouncer.stop()
        pg.destroy()


async def partition(args: argparse.Namespace) -> None:
    ok, why = Partition.available()
    if not ok:
        raise SystemExit(f"no network namespaces here: {why}")
    bindir = find_bindir()
    assert bindir is not None
    logs = _log_dir()
    with Partition(port=free_port()) as cut:
        pg = cut.postgres_for(bindir)
        await asyncio.to_thread(pg.init)
        await asyncio.to_thread(pg.start)
        try:
            dsn = await migrated_database(pg.dsn, DATABASE, pg.dsn_for(DATABASE))
            inside = ServeInNamespace(cut, DATABASE, logs / "inside.log", WFS_TOKENS=json.dumps({TOKEN: "bench"}))
            outside = Server(dsn, logs / "outside.log", workers=1)
            await inside.ready()
            await outside.ready()
            async with aiohttp.ClientSession() as session:
                work = Workload(session, [inside.base, outside.url], TOKEN, streams=4)
                await work.create(pins())
                work.subscribe()
                stop = asyncio.Event()
                probe = asyncio.create_task(_prober(work, inside.base, stop, producers=8))
                await asyncio.sleep(3)
                cut_at = time.monotonic()
                await asyncio.to_thread(cut.cut)
                await asyncio.sleep(args.cut)
                await asyncio.to_thread(cut.heal)
                healed = time.monotonic()
                await asyncio.sleep(5)
                stop.set()
                await probe
                await _until(work.caught_up, 60)
                problems = await work.check()
                await work.close()
            during = [s for started, _, s in work.attempts.timeline if cut_at <= started <= healed]
            print(f"one data plane cut from Postgres for {args.cut:g} s (iptables DROP in its namespace)")
            print(f"  slowest answer {work.attempts.slowest:.2f} s; answers during the cut: {_counts(during)}")
            print(f"  acknowledged again {_seconds(work.attempts.first_success_after(healed))} after the heal")
            print(f"  {len(work.acknowledged)} acknowledged; self-check: {problems or 'ok'}")
            inside.stop()
            outside.stop()
        finally:
            pg.destroy()


async def failover(args: argparse.Namespace) -> None:
    bindir = find_bindir()
    assert bindir is not None
    logs = _log_dir()
    pair = Replication(bindir, synchronous=not args.asynchronous)
    await asyncio.to_thread(pair.start)
    servers: list[Server] = []
    try:
        dsn = await migrated_database(pair.primary.dsn, DATABASE, pair.dsn_for(DATABASE))
        servers = [Server(dsn, logs / f"server-{i}.log", workers=1) for i in range(2)]
        for server in servers:
            await server.ready()
        async with aiohttp.ClientSession() as session:
            work = Workload(session, [s.url for s in servers], TOKEN, streams=4)
            await work.create(pins())
            work.subscribe()
            stop = asyncio.Event()
            probe = asyncio.create_task(_prober(work, servers[0].url, stop, producers=8))
            probe2 = asyncio.create_task(_prober(work, servers[1].url, stop, producers=8))
            await asyncio.sleep(5)
            await asyncio.to_thread(pair.primary.kill)
            killed = time.monotonic()  # once every process of it is gone
            await asyncio.to_thread(pair.standby.promote)
            promoted = time.monotonic()
            await asyncio.sleep(8)
            stop.set()
            await asyncio.gather(probe, probe2)
            await _until(work.caught_up, 60)
            problems = await work.check()
            await work.close()
        kind = "an asynchronous" if args.asynchronous else "a synchronous"
        print(f"failover to {kind} standby under two data planes (multi-host DSN)")
        print(
            f"  primary killed; standby promoted {promoted - killed:.2f} s later; appends acknowledged again "
            f"{_seconds(work.attempts.first_success_after(killed))} after the kill"
        )
        print(f"  answers: {work.attempts.statuses}; {len(work.acknowledged)} acknowledged")
        print(f"  self-check: {_summary(problems)}")
    finally:
        for server in servers:
            server.stop()
        pair.destroy()


async def chaos(args: argparse.Namespace) -> None:
    """Faults one after another for --minutes under producers and subscribers, then the self-check."""
    bindir = find_bindir()
    assert bindir is not None
    logs = _log_dir()
    rng = random.Random(args.seed)
    shape = _Shape(bindir)
    await asyncio.to_thread(shape.start)
    servers: list[Server] = []
    faults: dict[str, int] = {}
    try:
        dsn = await migrated_database(shape.primary.dsn, DATABASE, shape.dsn)
        servers = [Server(dsn, logs / f"server-{i}.log", workers=1, WFS_DATABASE_TIMEOUT_SECONDS="2") for i in range(2)]
        for server in servers:
            await server.ready()
        async with aiohttp.ClientSession() as session:
            work = Workload(session, [s.url for s in servers], TOKEN, streams=8, request_timeout=15)
            await work.create(pins())
            work.subscribe(per_stream_and_base=2)
            stop = asyncio.Event()
            probes = [asyncio.create_task(_prober(work, s.url, stop, producers=6)) for s in servers]
            ends = time.monotonic() + args.minutes * 60
            while time.monotonic() < ends:
                await asyncio.sleep(rng.uniform(2, 6))
                fault = rng.choice(["kill-serve", "crash-restart", "pause", "failover", "erase"])
                faults[fault] = faults.get(fault, 0) + 1
                print(f"  {time.strftime('%H:%M:%S')} {fault}", flush=True)
                await _fault(fault, shape, servers, rng)
            stop.set()
            await asyncio.gather(*probes)
            await _until(work.caught_up, 120)
            problems = await work.check()
            await work.close()
        print(
            f"{args.minutes:g} minutes of faults under two data planes, a synchronous standby made anew after"
            " each failover"
        )
        print(f"  faults: {faults}")
        print(f"  answers: {work.attempts.statuses}; {len(work.acknowledged)} acknowledged")
        print(f"  subscribers: {len(work.subscribers)}, {sum(len(s.seen) for s in work.subscribers)} records seen")
        print(f"  self-check: {_summary(problems)}")
    finally:
        for server in servers:
            server.stop()
        shape.destroy()


class _Shape:
    """A synchronous pair whose roles swap at each failover: the promoted standby becomes the primary and
    a new standby is made from it on the old primary's port, so the multi-host DSN stays right."""

    def __init__(self, bindir: Path) -> None:
        self.pair = Replication(bindir)
        self.ports = (self.pair.primary.port, self.pair.standby.port)

    @property
    def primary(self) -> ConfiguredPostgres:
        return self.pair.primary

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[0]},127.0.0.1:{self.ports[1]}/{DATABASE}?target_session_attrs=read-write"

    def start(self) -> None:
        self.pair.start()

    def fail_over(self) -> None:
        from workflow_streams.local.topologies import Standby, primary_settings

        old = self.pair.primary
        old.kill()
        self.pair.standby.promote()
        promoted = self.pair.standby
        # the promoted standby waits for a standby of its own from now on ("required" durability): made
        # anew on the old primary's port, from the new primary
        promoted.query(f"ALTER SYSTEM SET synchronous_standby_names = 'standby_{old.port}'")
        promoted.query("SELECT pg_reload_conf()")
        old.destroy()
        fresh = Standby(promoted, f"standby_{old.port}", port=old.port)
        fresh.init()
        fresh.start()
        fresh.wait_streaming()
        promoted.settings.update(primary_settings(fresh.name))
        self.pair.primary, self.pair.standby = promoted, fresh

    def destroy(self) -> None:
        self.pair.destroy()


async def _fault(kind: str, shape: _Shape, servers: list[Server], rng: random.Random) -> None:
    if kind == "kill-serve":
        index = rng.randrange(len(servers))
        old = servers[index]
        os.kill(old.process.pid, signal.SIGKILL)
        await asyncio.sleep(0.5)
        servers[index] = Server(old.dsn, old.log, workers=1, port=old.port, **old.env)
        await servers[index].ready()
    elif kind == "crash-restart":
        await asyncio.to_thread(shape.primary.crash_restart)
    elif kind == "pause":
        pids = _postgres_pids(shape.primary)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(rng.uniform(1, 4))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    elif kind == "failover":
        await asyncio.to_thread(shape.fail_over)
    elif kind == "erase":
        # the erased-read shape: the standby cut off, commits waiting for it made visible by a crash
        # restart of the primary, and the standby promoted (those commits are gone)
        await asyncio.to_thread(shape.pair.standby.pause_replication)
        await asyncio.sleep(rng.uniform(1, 3))
        await asyncio.to_thread(shape.primary.crash_restart)
        await asyncio.sleep(rng.uniform(1, 3))
        await asyncio.to_thread(shape.fail_over)


def _postgres_pids(cluster: ConfiguredPostgres) -> list[int]:
    postmaster = cluster.postmaster_pid()
    if postmaster is None:
        return []
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(stat.parent.name))
    return [postmaster, *children]


async def _until(check: Callable[[], Any], seconds: float) -> None:
    ends = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > ends:
            print(f"  (not caught up after {seconds:g} s)")
            return
        await asyncio.sleep(0.2)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _counts(statuses: list[int]) -> str:
    out: dict[int, int] = {}
    for status in statuses:
        out[status] = out.get(status, 0) + 1
    return str(dict(sorted(out.items())))


def _summary(problems: list[str]) -> str:
    if not problems:
        return "ok: nothing lost, nothing stored twice, every subscriber saw exactly what is stored"
    return f"{len(problems)} problems: " + "; ".join(problems[:5])


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="case", required=True)
    r = sub.add_parser("restarts", help="PgBouncer killed and started again under load")
    r.add_argument("--seconds", type=float, default=20)
    r.add_argument("--workers", type=int, default=2)
    p = sub.add_parser("partition", help="one data plane cut from Postgres (root)")
    p.add_argument("--cut", type=float, default=15, help="seconds the cut lasts")
    f = sub.add_parser("failover", help="the primary killed, the standby promoted")
    f.add_argument("--asynchronous", action="store_true", help="an asynchronous standby instead")
    c = sub.add_parser("chaos", help="minutes of faults, then the self-check")
    c.add_argument("--minutes", type=float, default=10)
    c.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    cases = {"restarts": restarts, "partition": partition, "failover": failover, "chaos": chaos}
    asyncio.run(cases[args.case](args))


if __name__ == "__main__":
    cli()
