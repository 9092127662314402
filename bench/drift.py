"""How far this machine's pgbench ceiling drifts by itself: ``python -m bench.drift [--runs N] [--reinit]``.

A throwaway Postgres, ``pgbench -i -s 1``, then pgbench ``-N`` (32 clients, as ``bench.run``'s ceiling)
again and again with a pause before each and nothing else running. Each run prints its tps and the CPU
per transaction of pgbench and Postgres together; the last line gives the spread (highest / lowest).
A ratio to one ceiling measured once carries that much noise: ``bench.run`` measures the ceiling again
around each append case for this reason (bench/HISTORY.md, items 29 and 32).

``--reinit`` makes pgbench's tables anew before every run, so that a drift that remains is the
machine's, not the tables' growing history and dead rows.

    python -m bench.drift --runs 6 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench import scenarios
from bench.harness import start_postgres


async def main(args: argparse.Namespace) -> None:
    pg = await start_postgres()
    try:
        began = time.monotonic()
        readings = []
        for run in range(args.runs):
            if run == 0 or args.reinit:
                scenarios.init_pgbench(pg)
            if run:
                await scenarios.settle(args.pause)
            result = await asyncio.to_thread(scenarios.simple_update, pg, args.seconds)
            readings.append(result["tps"])
            print(
                f"{time.monotonic() - began:5.0f} s  pgbench -N run {run + 1}: {result['tps']:,.0f} tps, "
                f"{result['cpu_us_per_txn']} us of CPU per transaction (pgbench {result['client_cores']} cores, "
                f"Postgres {result['postgres_cores']})",
                flush=True,
            )
        print(f"spread: highest / lowest = {max(readings) / min(readings):.3f} over {len(readings)} runs")
    finally:
        pg.destroy()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=10, help="each pgbench -N run")
    parser.add_argument("--pause", type=float, default=10.0, help="quiet seconds before each run after the first")
    parser.add_argument("--reinit", action="store_true", help="pgbench -i before every run, not only the first")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
