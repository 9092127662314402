"""Profile the server under one load case: ``python -m bench.profile {append,read,sse} [--out DIR] [flags]``.

Starts its own PostgreSQL and one ``workflow-streams serve`` process (one worker unless --workers;
py-spy samples every worker), drives it with wfs-loadgen, and records the server with py-spy
(``--idle`` off: only on-CPU time) over the measured window. Writes ``profile.collapsed`` (py-spy's
collapsed stacks, for any flame graph tool) and ``top.txt`` (the hottest functions, by own time and
including callees) into --out, and prints the top lines.

Examples::

    python -m bench.profile sse --subscribers 1000 --streams 1 --rate 20
    python -m bench.profile append --streams 1000 --conns 32
    python -m bench.profile append --streams 1000 --conns 32 --batch 100
    python -m bench.profile append --streams 1000 --conns 32 --surface durable   # text/plain streams, PUT
    python -m bench.profile read --streams 1000 --conns 32 --records 20 --after 0 --limit 1

``read`` loads --records records into each stream first (batch appends, not recorded); with ``--surface
durable`` it reads them through the Durable Streams surface (our own streams are JSON streams there).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from bench import generator
from bench.harness import PREFIX, TOKEN, Server, pins, start_postgres
from bench.scenarios import DS_PREFIX, preload


def _pyspy() -> str:
    """py-spy from the venv: the activated one's, else the one beside this interpreter (run as $V/python
    without activating it), else from PATH."""
    for bindir in (Path(os.environ.get("VIRTUAL_ENV", "")) / "bin", Path(sys.executable).parent):
        if (bindir / "py-spy").exists():
            return str(bindir / "py-spy")
    return "py-spy"


def top_functions(collapsed: Path, count: int = 25) -> str:
    """Own and inclusive sample counts per function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        samples = int(n)
        frames = stack.split(";")
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    lines = [f"{total} samples", "", "own time:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(count)]
    lines += ["", "including callees:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(count)]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pg = await start_postgres()
    server = Server(pg.dsn, out / "server.log", workers=args.workers)
    try:
        await server.ready()
        base = server.url + PREFIX
        run = f"p-{uuid.uuid4().hex[:8]}"
        durable = args.surface == "durable"
        if durable and args.mode == "append":  # the protocol's streams: text/plain, made with PUT
            target = server.url + DS_PREFIX
            await generator.run("create", target, TOKEN, run=run, streams=args.streams, surface="durable", create="put")
        else:
            await generator.run("create", base, TOKEN, run=run, streams=args.streams, create=pins())
            target = server.url + DS_PREFIX if durable else base
        if args.mode == "read":
            await preload(server.url, run, args.streams, args.records)
        if args.appends_first:
            # the full run's order: the server has taken appends before the case (bench.ab --sse --cases)
            warm = f"w-{uuid.uuid4().hex[:8]}"
            await generator.run(
                "append",
                base,
                TOKEN,
                run=warm,
                streams=1000,
                conns=32,
                warmup="0s",
                duration=f"{args.appends_first}s",
                create=pins(),
            )
        collapsed = out / "profile.collapsed"
        spy: list[subprocess.Popen[bytes]] = []

        sampled = ["--pid", str(server.process.pid), "--subprocesses"]
        # --native: C and Cython frames too (asyncpg's protocol, uvloop); py-spy then has to stop the
        # process for each sample, so it slows the server and figures are for shares only
        sampled.append("--native" if args.native else "--nonblocking")

        if args.perf:  # the whole machine, kernel included: perf's software clock, every process
            command = ["perf", "record", "-a", "-g", "-F", "499", "-e", "cpu-clock", "-o", str(out / "perf.data")]
        else:
            command = [_pyspy(), "record", "--format", "raw", "-o", str(collapsed), "-r", "200", *sampled]

        def on_phase(phase: str) -> None:
            if phase in (args.phase, "measuring") and not spy:
                spy.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        flags: dict[str, object] = {"run": run, "streams": args.streams, "duration": f"{args.seconds}s"}
        if args.mode == "sse":
            flags |= {"subscribers": args.subscribers, "rate": args.rate}
        else:
            flags |= {"conns": args.conns, "warmup": "1s", "surface": args.surface}
        if args.mode == "append":
            flags |= {"batch": args.batch}
        if args.mode == "read":
            flags |= {"after": args.after, "limit": args.limit}
        report = await generator.run(args.mode, target, TOKEN, on_phase=on_phase, **flags)
        for proc in spy:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        shown = ("latency_ms", "cpu_share", "requests_ok", "connect_seconds", "records_per_s", "reads_per_s", "errors")
        print({k: report[k] for k in report if k in shown})
        if collapsed.exists():
            top = top_functions(collapsed)
            (out / "top.txt").write_text(top + "\n")
            print(top)
    finally:
        server.stop()
        pg.destroy()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("append", "read", "sse"))
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20)
    parser.add_argument("--conns", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1, help="append: records per request (our API)")
    parser.add_argument(
        "--surface",
        choices=("api", "durable"),
        default="api",
        help="append, read: our API or the Durable Streams surface (append: text/plain streams made with PUT)",
    )
    parser.add_argument("--records", type=int, default=20, help="read: records loaded into each stream first")
    parser.add_argument("--after", type=int, default=0, help="read: the cursor of each read")
    parser.add_argument("--limit", type=int, default=0, help="read: ?limit= of each read (0: not sent)")
    parser.add_argument("--workers", type=int, default=1, help="serve --workers N (all sampled)")
    parser.add_argument(
        "--phase", default="appending", help="sse: start recording at this phase (connecting or appending)"
    )
    parser.add_argument(
        "--appends-first",
        type=int,
        default=0,
        metavar="SECONDS",
        help="first append to 1,000 streams over 32 connections for this long, unrecorded",
    )
    parser.add_argument("--native", action="store_true", help="py-spy --native: C and Cython frames too")
    parser.add_argument(
        "--perf",
        action="store_true",
        help="perf record -a, not py-spy: every process and the kernel (perf.data; perf report --sort comm,dso)",
    )
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="wfs-profile-"))
    asyncio.run(main(parser.parse_args()))
