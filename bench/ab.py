"""A/B rounds of append cases on one Postgres: ``python -m bench.ab LABEL=TREE[=VAR:VALUE,...] ...``.

How bench/README.md's paired figures are taken (direct against pooled, before against after). Each
variant is a source tree (a ``git worktree`` at the commit to compare; its ``dataplane`` goes first on
``PYTHONPATH``) and optional
environment for its server (``W:1`` sets its worker count, ``PY:/path/to/python`` the interpreter, whose
environment must have the dependencies, ``POOLER:transaction`` puts Debian's PgBouncer in transaction
pooling, stock settings, between it and Postgres, with LISTEN on a direct DSN). Each round starts a fresh
``workflow-streams serve`` per variant, in an order that rotates between rounds, and drives every case
with wfs-loadgen; the medians over rounds come last. Short rounds on a shared 2-core machine vary by
±5-15 %: compare medians of several rounds, and CPU per append beside the rate.

    git worktree add /tmp/before HEAD~1
    python -m bench.ab before=/tmp/before after=. --cases 1000x32,1000x128 --rounds 3

Per case and round it prints appends/s, p50/p99, the server's and Postgres' CPU per append (user and
system apart: a change in system time is syscalls or wake-ups, in user time our code), the appends
per group-commit transaction (the server's ``wfs_group_commit_requests``; None for a tree without it)
and the generator's cores. ``--sse`` runs the 10,000-subscriber connect case instead (connect seconds, CPU,
and Postgres' transactions during the connect), after the append cases ``--cases`` names, on the same
server (the full run's order), when it names any.

``--pgbench`` also runs pgbench ``-N`` (32 clients, as ``bench.run``'s ceiling; as long as a case)
before the first round and after every round, each after ``--quiet`` seconds of quiet, and sets every
append case beside the mean of the two readings around its round: the ratio the issue-13 goals name,
paired in time, with its median, lowest and highest over the rounds instead of one sample of a
machine whose speed drifts.

    python -m bench.ab now=. --cases 1000x32 --rounds 6 --pgbench
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench import generator, scenarios
from bench.harness import (
    PREFIX,
    TOKEN,
    Meter,
    Server,
    appends_per_transaction,
    group_commits,
    pins,
    postmaster_pid,
    process_tree_times,
    start_postgres,
)
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.local.topologies import PgBouncer


@dataclass
class Variant:
    label: str
    tree: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Variant:
        label, _, rest = text.partition("=")
        tree, _, settings = rest.partition("=")
        if not label or not tree:
            raise argparse.ArgumentTypeError(f"expected LABEL=TREE[=VAR:VALUE,...], got {text!r}")
        env = dict(item.split(":", 1) for item in settings.split(",") if item)
        return cls(label, Path(tree).resolve(), env)

    def server(self, dsn: str, log_dir: Path, default_workers: int, pooler: PgBouncer | None = None) -> Server:
        env = {k: v for k, v in self.env.items() if k not in ("W", "PY", "POOLER")}
        if "POOLER" in self.env:
            assert pooler is not None
            env |= {"WFS_DATABASE_POOLER": self.env["POOLER"], "WFS_LISTEN_DATABASE_URL": dsn}
            dsn = pooler.dsn_for(dsn.rsplit("/", 1)[1])
        workers = int(self.env.get("W", default_workers))
        return Server(
            dsn,
            log_dir / f"{self.label}.log",
            workers=workers,
            python=self.env.get("PY"),
            PYTHONPATH=str(self.tree / "dataplane"),
            **env,
        )


async def _stats(dsn: str) -> tuple[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow("SELECT sum(xact_commit)::bigint, sum(sessions)::bigint FROM pg_stat_database")
        return int(row[0]), int(row[1])
    finally:
        await conn.close()


async def _append_case(server: Server, postgres: int, streams: int, conns: int, seconds: float) -> dict[str, Any]:
    base = server.url + PREFIX
    run = f"ab{streams}-{uuid.uuid4().hex[:8]}"
    await generator.run("create", base, TOKEN, run=run, streams=streams, create=pins())
    meter = Meter(server, postgres)
    times: dict[str, tuple[float, ...]] = {}

    def mark(phase: str) -> None:
        meter.mark(phase)
        times[phase] = process_tree_times(server.process.pid) + process_tree_times(postgres)

    commits = await group_commits(server.url)
    report = await generator.run(
        "append", base, TOKEN, on_phase=mark, run=run, streams=streams, conns=conns, warmup="2s", duration=f"{seconds}s"
    )
    per_transaction = appends_per_transaction(commits, await group_commits(server.url))
    rate = report["appends_per_s"]
    appended = rate * meter.between("measuring", "measured")["wall_s"]
    per_append = [(b - a) / appended * 1e6 for a, b in zip(times["measuring"], times["measured"], strict=True)]
    return {
        "rate": rate,
        "p50": report["latency_ms"]["p50"],
        "p99": report["latency_ms"]["p99"],
        "server_user": per_append[0],
        "server_sys": per_append[1],
        "postgres_user": per_append[2],
        "postgres_sys": per_append[3],
        "generator_cores": report["cpu_share"],
        "appends_per_transaction": per_transaction,
        "errors": report["errors"],
    }


async def _connect_case(server: Server, dsn: str, postgres: int) -> dict[str, Any]:
    base = server.url + PREFIX
    run = f"abs-{uuid.uuid4().hex[:8]}"
    await generator.run("create", base, TOKEN, run=run, streams=1000, create=pins())
    meter = Meter(server, postgres)
    before = await _stats(dsn)
    report = await generator.run(
        "sse", base, TOKEN, on_phase=meter.mark, run=run, streams=1000, subscribers=10_000, rate=100, duration="4s"
    )
    after = await _stats(dsn)
    connect = meter.between("connecting", "appending")
    return {
        "connect_s": report["connect_seconds"],
        "server_cpu_s": connect["server_cpu_s"],
        "postgres_cpu_s": connect["postgres_cpu_s"],
        "transactions": after[0] - before[0],
        "p99": report["latency_ms"]["p99"],
        "duplicates": report["duplicates"],
        "gaps": report["gaps"],
        "missing": report["missing"],
    }


def _maybe(value: float | None) -> str:
    # a median of two rounds is a mean: 12.149999999999999, printed as 12.1
    return "None" if value is None else f"{value:.1f}"


def _line(row: dict[str, Any]) -> str:
    if "connect_s" in row:
        return (
            f"connect {row['connect_s']:.2f} s, server {row['server_cpu_s']} CPU s, Postgres {row['postgres_cpu_s']} "
            f"CPU s, {row['transactions']:,} transactions; p99 {row['p99']:.1f} ms; duplicates {row['duplicates']} "
            f"gaps {row['gaps']} missing {row['missing']}"
        )
    return (
        f"{row['rate']:8,.0f}/s p50 {row['p50']:.1f} p99 {row['p99']:.1f} ms; per append: server "
        f"{row['server_user']:.0f}+{row['server_sys']:.0f} us, Postgres {row['postgres_user']:.0f}+"
        f"{row['postgres_sys']:.0f} us (user+system); {_maybe(row['appends_per_transaction'])} appends per "
        f"transaction; generator {row['generator_cores']:.3f} cores; errors {row['errors']}"
        + (f"; x{row['x_pgbench']:.3f} pgbench -N around" if "x_pgbench" in row else "")
    )


async def main(args: argparse.Namespace) -> None:
    variants: list[Variant] = args.variants
    # with --sse, append cases run only when named, first, on the same server: the connect as the full
    # run measures it, after the server has taken appends
    named = args.cases or ("" if args.sse else "1000x32")
    cases = [tuple(int(n) for n in case.split("x")) for case in named.split(",") if case]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    pg = await start_postgres()
    pooler = None
    if any("POOLER" in v.env for v in variants):
        pooler = PgBouncer(pg)
        await asyncio.to_thread(pooler.start)
    try:
        ceilings: list[float] = []
        if args.pgbench:
            scenarios.init_pgbench(pg)
            ceilings.append(await _pgbench(pg, args.seconds, quiet=0))
        for round_ in range(args.rounds):
            shift = round_ % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                server = variant.server(pg.dsn, args.logs, args.workers, pooler)
                try:
                    await server.ready()
                    names_rows = [
                        (f"{s}x{c}", await _append_case(server, postmaster_pid(pg), s, c, args.seconds))
                        for s, c in cases
                    ]
                    if args.sse:
                        names_rows.append(
                            ("10,000 subscribers", await _connect_case(server, pg.dsn, postmaster_pid(pg)))
                        )
                finally:
                    server.stop()
                for name, row in names_rows:
                    results.setdefault((name, variant.label), []).append(row)
                    print(f"round {round_} {variant.label:>10} {name}: {_line(row)}", flush=True)
            if args.pgbench:
                ceilings.append(await _pgbench(pg, args.seconds, quiet=args.quiet))
                before, after = ceilings[-2:]
                for (name, label), rows in results.items():
                    if "rate" in rows[-1]:  # this round's row of an append case
                        rows[-1]["x_pgbench"] = rows[-1]["rate"] / ((before + after) / 2)
                        print(
                            f"round {round_} {label:>10} {name}: x{rows[-1]['x_pgbench']:.3f} pgbench -N around "
                            f"({before:,.0f} tps before the round, {after:,.0f} after)",
                            flush=True,
                        )
    finally:
        if pooler is not None:
            pooler.stop()
        pg.destroy()
    print("\nmedians over rounds:")
    for (name, label), rows in sorted(results.items()):
        median = {k: statistics.median(r[k] for r in rows) for k, v in rows[0].items() if isinstance(v, int | float)}
        print(f"{name} {label:>10}: {_line({**rows[0], **median})}")
        ratios = [r["x_pgbench"] for r in rows if "x_pgbench" in r]
        if ratios:
            lowest, highest = min(ratios), max(ratios)
            print(f"{name} {label:>10}: x pgbench -N around each round, lowest {lowest:.3f} highest {highest:.3f}")


async def _pgbench(pg: LocalPostgres, seconds: float, quiet: float) -> float:
    await scenarios.settle(quiet)  # as bench.run: right after a case its tail would slow pgbench
    result = await asyncio.to_thread(scenarios.simple_update, pg, max(1, round(seconds)))
    return float(result["tps"])


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", type=Variant.parse, help="LABEL=TREE[=VAR:VALUE,...]")
    parser.add_argument(
        "--cases",
        help="streams x connections, comma-separated (default 1000x32; with --sse none, else these first)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8, help="measured seconds per case (after 2 s of warm-up)")
    parser.add_argument("--workers", type=int, default=2, help="serve --workers N unless a variant sets W")
    parser.add_argument("--sse", action="store_true", help="the 10,000-subscriber connect case instead of appends")
    parser.add_argument("--pgbench", action="store_true", help="pgbench -N around every round; ratios to it")
    parser.add_argument(
        "--quiet",
        type=float,
        default=scenarios.FULL.around_settle,
        help="with --pgbench: seconds of quiet before each pgbench -N after a round (default: the full run's)",
    )
    parser.add_argument("--logs", type=Path, default=Path("/tmp"), help="where each variant's server log goes")
    asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
