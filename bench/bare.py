"""The bare-server ceiling: what aiohttp alone serves on this machine, with no Postgres behind it.

``python -m bench.bare --port P [--workers N] [--loop asyncio|uvloop]`` serves every POST with what an
append costs the HTTP layer and nothing else: read the body, decode its JSON, answer 201 with a small
JSON document. It runs like ``workflow-streams serve``: N processes on one port (SO_REUSEPORT), the
same GC tuning, no access log. Driven by the same compiled generator as the real server, its rate is
the most any Python aiohttp server could append here; ``bench.run`` reports appends as a ratio to it
beside the ratio to pgbench. ``GET /readyz`` answers 200 so the harness can wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from bench import generator
from bench.harness import TOKEN, process_tree_cpu
from workflow_streams.local.postgres import free_port
from workflow_streams.local.process import Process
from workflow_streams.shells.serving import LISTEN_BACKLOG, tune_gc

ANSWER = {"first_sequence": 1, "last_sequence": 1, "sequences": [1]}


async def _append(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    if not isinstance(body, dict):
        raise web.HTTPBadRequest()
    return web.json_response(ANSWER, status=201)


async def _ready(request: web.Request) -> web.Response:
    return web.json_response({"status": "ready"})


def app() -> web.Application:
    application = web.Application()
    application.router.add_get("/readyz", _ready)
    application.router.add_post("/{tail:.*}", _append)
    return application


def _serve(port: int, loop: str, reuse_port: bool) -> None:
    if loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    tune_gc()
    web.run_app(
        app(), host="127.0.0.1", port=port, access_log=None, reuse_port=reuse_port, backlog=LISTEN_BACKLOG, print=None
    )


async def ceiling(log: Path, workers: int | None, cases: list[int], warmup: float, seconds: float) -> dict[str, Any]:
    """The bare server's rate at each connection count in ``cases`` (1,000 stream paths, as the append
    cases use), with its own CPU and the generator's; the server runs with ``workers`` processes."""
    port = free_port()
    command = [sys.executable, "-m", "bench.bare", "--port", str(port)]
    if workers is not None:
        command += ["--workers", str(workers)]
    process = Process(command, log=log, name="bare-server")
    out: dict[str, Any] = {"workers": workers, "cases": {}}
    try:
        await process.ready(f"http://127.0.0.1:{port}/readyz", seconds=30)
        for conns in cases:
            marks: dict[str, float] = {}
            report = await generator.run(
                "append",
                f"http://127.0.0.1:{port}/bare",
                TOKEN,
                on_phase=lambda phase: marks.__setitem__(phase, process_tree_cpu(process.pid)),
                streams=1000,
                conns=conns,
                warmup=f"{warmup}s",
                duration=f"{seconds}s",
            )
            server_cores = (marks["measured"] - marks["measuring"]) / seconds
            out["cases"][str(conns)] = {
                "requests_per_s": round(report["appends_per_s"]),
                "latency_ms": report["latency_ms"],
                "errors": report["errors"],
                "generator_cores": report["cpu_share"],
                "server_cores": round(server_cores, 3),
            }
            print(
                f"  bare aiohttp server, {conns} connections: {report['appends_per_s']:,.0f} requests/s; CPU cores: "
                f"generator {report['cpu_share']}, server {server_cores:.3f}",
                flush=True,
            )
    finally:
        process.stop(grace=10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    if args.workers == 1:
        _serve(args.port, args.loop, reuse_port=False)
        return
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_serve, args=(args.port, args.loop, True)) for _ in range(args.workers)]
    for worker in workers:
        worker.start()

    def stop(signum: int, _frame: object) -> None:
        for worker in workers:
            if worker.pid is not None:
                os.kill(worker.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for worker in workers:
        worker.join()
    sys.exit(0)


if __name__ == "__main__":
    main()
