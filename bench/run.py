"""Run the benchmarks: ``python -m bench.run [--quick] [--workers N] [--cases a,b,…] [--out DIR]``.

Starts its own PostgreSQL (fsync on), measures the Postgres ceilings with pgbench and the bare-server
ceiling, then runs ``workflow-streams serve`` as a separate process and drives it with the compiled
generator (``bench/loadgen``): appends, live delivery over SSE, catch-up reads (``bench.catchup``), small
reads, batched appends beside Redis, and the Durable Streams surface's appends beside our API's and the
protocol's reference server. It prints one line per case and writes results.json into --out, with the
machine described; every throughput is also a ratio to a ceiling measured in the same run, and every
figure has the generator's, the server's and Postgres' CPU beside it. The current figures are in
bench/README.md.

``--cases`` runs only some of them (the pgbench ceilings always run; the bare-server ceiling only with
``appends``), e.g. ``--cases reads,batches,durable`` for issue 47's cases in a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import subprocess
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import workflow_streams
from bench import bare, catchup, generator, scenarios
from bench.harness import Server, machine, raise_open_files_limit, start_postgres

# every case, in the order they run; --cases picks some
CASES = ("appends", "sse", "catchup", "reads", "batches", "durable")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    cases: tuple[str, ...] = args.cases
    out.mkdir(parents=True, exist_ok=True)
    timing = scenarios.QUICK if args.quick else scenarios.FULL
    await asyncio.to_thread(generator.binary)  # built before anything is timed
    pg = await start_postgres()
    results: dict[str, Any] = {
        "machine": machine(),
        "started": dt.datetime.now(dt.UTC).isoformat(),
        "mode": "quick" if args.quick else "full",
        "workers": args.workers,
        "note": args.note,
        "cases": list(cases),
        "server_source": server_source(),
        "timing": timing.__dict__,
    }
    server = None
    try:
        # the ceilings first, while nothing else uses Postgres
        print("ceilings: pgbench", flush=True)
        results["ceilings"] = await asyncio.to_thread(scenarios.pgbench_ceilings, pg, timing.pgbench_seconds)
        if "appends" in cases:
            # what the HTTP layer alone allows here: aiohttp with the same workers, no Postgres behind it
            print("ceilings: bare aiohttp server", flush=True)
            connections = sorted({conns for _, conns in scenarios.APPEND_CASES})
            results["ceilings"]["bare"] = await bare.ceiling(
                out / "bare.log", args.workers, connections, timing.append_warmup, timing.append_seconds
            )
        server = Server(pg.dsn, out / "server.log", workers=args.workers)
        await server.ready()
        if "appends" in cases:
            print("appends", flush=True)
            results["appends"] = await scenarios.appends(server, pg, timing, results["ceilings"])
            for row in results["appends"]:
                ceiling = results["ceilings"]["bare"]["cases"][str(row["connections"])]["requests_per_s"]
                row["x_bare"] = round(row["appends_per_s"] / ceiling, 3)
            await scenarios.settle()
        if "sse" in cases:
            print("live delivery over SSE", flush=True)
            results["sse"] = await scenarios.deliveries(server, pg, timing)
            await scenarios.settle()
        if "catchup" in cases:
            print("catch-up reads", flush=True)
            results["catch_up"] = await catchup.measure(server, pg, timing.catch_up_records)
            await scenarios.settle()
        if "reads" in cases:
            print("small reads", flush=True)
            results["small_reads"] = await finding(scenarios.small_reads(server, pg, timing, results["ceilings"]))
            await scenarios.settle()
        if "batches" in cases:
            print("batched appends", flush=True)
            results["batched_appends"] = await finding(scenarios.batched_appends(server, pg, timing))
            await scenarios.settle()
        if "durable" in cases:
            print("Durable Streams appends", flush=True)
            results["durable_appends"] = await finding(scenarios.durable_appends(server, pg, timing))
    finally:
        if server is not None:
            server.stop()
        await asyncio.to_thread(pg.destroy)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out / 'results.json'}", flush=True)
    return results


async def finding(case: Coroutine[Any, Any, Any]) -> Any:
    """A case's results, or what made it fail: a failed case (a create the server refused, a peer that
    would not start) is a finding, not the end of the run: the cases after it still run."""
    try:
        return await case
    except RuntimeError as exc:
        print(f"  FAILED {exc}", flush=True)
        return {"failed": str(exc)}


def server_source() -> dict[str, Any]:
    """Which server code ran: the package's directory and, in a git checkout, its commit and
    whether the server's sources differ from it."""
    package = Path(workflow_streams.__file__).resolve().parent
    source: dict[str, Any] = {"package": str(package)}
    git = ["git", "-C", str(package)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        status = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True)
        source |= {"commit": head.stdout.strip(), "modified": bool(status.stdout.strip())}
    return source


def case_list(text: str) -> tuple[str, ...]:
    """``--cases``: names from CASES, comma-separated; they run in CASES' order."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = names - set(CASES)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"cases are some of {', '.join(CASES)} (got {text!r})")
    return tuple(name for name in CASES if name in names)


def main() -> None:
    raise_open_files_limit()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short measurements (~4 minutes instead of ~15)")
    parser.add_argument("--workers", type=int, help="pass --workers N to `workflow-streams serve`")
    parser.add_argument("--note", help="a line about this run for results.json (machine state, what changed)")
    parser.add_argument(
        "--cases",
        type=case_list,
        default=CASES,
        help=f"comma-separated, some of {','.join(CASES)} (default: all); the pgbench ceilings always run",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/latest"))
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
