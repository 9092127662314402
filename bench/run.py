"""Run the benchmarks: ``python -m bench.run [--quick] [--profile] [--out DIR]``.

Writes results.json, results.md and PNG plots, with the machine described. Every figure is a ratio
to a baseline measured in the same run, so results from different machines stay comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import nats_peer, scenarios
from bench.harness import Server, machine, start_postgres

CACHE_BIN = Path(os.environ.get("WFS_CACHE", Path.home() / ".cache" / "workflow-streams")) / "bin"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    seconds = 1.5 if args.quick else 4.0
    pg = await start_postgres()
    server = Server(pg.dsn, out / "server.log")
    await server.ready()
    results: dict[str, Any] = {
        "machine": machine(),
        "started": dt.datetime.now(dt.UTC).isoformat(),
        "seconds_per_measurement": seconds,
    }
    profiler = None
    try:
        if args.profile:
            profiler = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(server.proc.pid),
                    "--format",
                    "speedscope",
                    "--output",
                    str(out / "profile.speedscope.json"),
                    "--rate",
                    "200",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        print("append throughput", flush=True)
        results["append"] = await scenarios.append_throughput(server, pg.dsn, seconds)
        tps = await asyncio.to_thread(scenarios.pgbench_tps, pg, seconds)
        eight = next(r for r in results["append"] if r["case"] == "8 producers, 100 B")
        results["pgbench"] = {
            "clients": 8,
            "tps": round(tps),
            "ours_8_producers_per_s": eight["ours_records_per_s"],
            "ratio": round(eight["ours_records_per_s"] / tps, 3),
        }
        print(f"  pgbench -N 8 clients: {tps:.0f} tps", flush=True)
        print("append -> SSE delivery latency", flush=True)
        results["latency"] = await scenarios.delivery_latency(server, pg.dsn, 60 if args.quick else 150)
        print("catch-up read", flush=True)
        results["catch_up"] = await scenarios.catch_up(server, pg.dsn, 20_000 if args.quick else 50_000)
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            profiler.wait(60)
        print("memory per idle subscriber", flush=True)
        results["memory"] = await scenarios.subscriber_memory(server, (1000, 10_000), out)
    finally:
        server.stop()
        await asyncio.to_thread(pg.destroy)
    nats_bin = CACHE_BIN / "nats-server"
    if nats_bin.is_file():
        print("peer: NATS JetStream", flush=True)
        peer = await nats_peer.measure(nats_bin, seconds, 60 if args.quick else 150)
        ours_tp = {1: "1 producer, 100 B", 8: "8 producers, 100 B", 32: "32 producers, 100 B"}
        peer["ratios"] = {
            f"throughput_{n}_producers": round(
                next(r for r in results["append"] if r["case"] == case)["ours_records_per_s"] / peer["throughput"][n], 3
            )
            for n, case in ours_tp.items()
        }
        ours_lat = results["latency"][0]["ours_ms"]
        peer["ratios"]["latency_p50_1_subscriber"] = round(ours_lat["p50"] / peer["latency_1_subscriber_ms"]["p50"], 3)
        peer["ratios"]["latency_p99_1_subscriber"] = round(ours_lat["p99"] / peer["latency_1_subscriber_ms"]["p99"], 3)
        results["nats"] = peer
    (out / "results.json").write_text(json.dumps(results, indent=2))
    from bench.report import write_report

    write_report(results, out)
    return results


def _raise_open_files_limit() -> None:
    """10,000 subscriptions need 10,000 sockets in this process."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    _raise_open_files_limit()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short measurements (smoke run)")
    parser.add_argument("--profile", action="store_true", help="py-spy the server during the load phases")
    parser.add_argument("--out", type=Path, default=Path("bench/results/latest"))
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
