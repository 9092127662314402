"""Catch-up reads against the store's own speed: ``python -m bench.catchup [--records N] [--profile MODE]``.

One stream of N records of 100 bytes (a JSON string), appended through the API. Then, in one run and
on one Postgres: the ceiling, raw asyncpg fetching the same pages of the same table (pages of 1,000,
as a reader does); one server worker read from the start by the compiled generator (wfs-loadgen
catchup) on our API (``api``), the Durable Streams surface (``ds``) and both surfaces' SSE backfill
(``sse``, ``ds-sse``), each with the server's, Postgres' and the generator's CPU beside it; the
protocol's own TS client reading the first 100,000 records from us and from its reference server (in memory, loaded with
the same records) when Node is there; and the table's size per record, indexes included.

``--profile api`` records the server with py-spy during that case (top functions printed). ``bench.run``
runs the same cases (``measure``) on its own server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench import generator
from bench.harness import AUTH, PREFIX, TOKEN, Server, pins, postmaster_pid, process_tree_cpu, start_postgres
from bench.profile import _pyspy, top_functions
from workflow_streams.local.npm import npm_ci
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.store.reads import RECORD_COLUMNS

DS_PREFIX = "/api/durable-streams"
RUN, STREAM = "catchup", "history"
RAW_PAGE = 1000
TS_RECORDS = 100_000
# passes over the stream of which the ceiling and each case keep the best: a pass is a fraction of a
# second, and one disturbance on this machine moved it by a fifth
PASSES = 3
CLIENTS = Path(__file__).parent / "catchup"  # the npm project of the TS client and reference server

_RAW = (
    f"SELECT {RECORD_COLUMNS} FROM wfs_records r WHERE r.stream_key = $1 AND r.sequence > $2"
    " ORDER BY r.sequence LIMIT $3"
)


async def load(url: str, records: int) -> None:
    """The stream and its records, 1,000 per append."""
    payload = "x" * 98  # 100 bytes of JSON
    async with aiohttp.ClientSession(headers=AUTH) as http:
        created = await http.post(f"{url}{PREFIX}/runs/{RUN}/streams", json={"stream_id": STREAM, "pins": pins()})
        assert created.status in (200, 201), await created.text()
        batch = json.dumps({"records": [{"data": payload}] * 1000}).encode()
        for _ in range(records // 1000):
            resp = await http.post(
                f"{url}{PREFIX}/runs/{RUN}/streams/{STREAM}/records",
                data=batch,
                headers={"Content-Type": "application/json"},
            )
            assert resp.status == 201, await resp.text()


async def raw_ceiling(dsn: str, records: int) -> dict[str, float]:
    """Raw asyncpg: the same pages, decoded into records, nothing else."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ANALYZE wfs_records")
        key = await conn.fetchval(
            "SELECT stream_key FROM wfs_streams WHERE run_id = $1 AND stream_id = $2", RUN, STREAM
        )
        statement = await conn.prepare(_RAW)
        best = 0.0
        for _ in range(PASSES):  # the first pass warms the cache, as the server's reads are warm
            start, after = time.perf_counter(), 0
            while after < records:
                rows = await statement.fetch(key, after, RAW_PAGE)
                after = rows[-1][0]
            best = max(best, records / (time.perf_counter() - start))
        return {"records_per_s": round(best)}
    finally:
        await conn.close()


async def surface(server: Server, postgres: int, mode: str, records: int, profile: Path | None) -> dict[str, Any]:
    """One case from the generator, with the server's and Postgres' (the tree under ``postgres``) CPU over
    it, from the best of ``PASSES`` as for the raw ceiling. The stream is read once before, unmeasured: a
    whole case is a few requests, and the first ones of a kind paid the server's new connections and
    their first statements (the case run first measured 0.81-0.86 x, the same case run second 1.18-1.27
    x)."""
    base = server.url + (DS_PREFIX if mode.startswith("ds") else PREFIX)
    surface_name, page = API_PAGES.get(mode, (mode, {}))
    flags: dict[str, Any] = {"surface": surface_name, "run": RUN, "stream": STREAM, "until": records, **page}
    await generator.run("catchup", base, TOKEN, **flags)
    spy = None
    if profile is not None:
        command = [_pyspy(), "record", "--format", "raw", "-o", str(profile), "-r", "200", "--nonblocking"]
        spy = subprocess.Popen(
            [*command, "--pid", str(server.process.pid), "--subprocesses"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await asyncio.sleep(1)  # attached
    report: dict[str, Any] = {}
    for _ in range(PASSES):  # the best pass, as for the raw ceiling
        cpu, postgres_cpu = server.cpu_seconds(), process_tree_cpu(postgres)
        run = await generator.run("catchup", base, TOKEN, **flags)
        run["server_cpu_share"] = round((server.cpu_seconds() - cpu) / run["seconds"], 3)
        run["postgres_cpu_share"] = round((process_tree_cpu(postgres) - postgres_cpu) / run["seconds"], 3)
        if not report or run["seconds"] < report["seconds"]:
            report = run
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    return report


async def ts_client(server: Server, records: int) -> dict[str, Any] | None:
    """The protocol's TS client reading ``records`` from us and from its reference server."""
    if shutil.which("node") is None or not (CLIENTS / "package.json").exists():
        return None
    await asyncio.to_thread(npm_ci, CLIENTS, "the TS client comparison")
    url = f"{server.url}{DS_PREFIX}/v1/stream/{RUN}/{STREAM}"
    proc = await asyncio.create_subprocess_exec(
        "node", "read.mjs", url, TOKEN, str(records), cwd=CLIENTS, stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bench/catchup/read.mjs failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(out)
    return result


async def storage(dsn: str) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE wfs_records")
        size = await conn.fetchval("SELECT pg_total_relation_size('wfs_records')")
        count = await conn.fetchval("SELECT count(*) FROM wfs_records")
        return {"bytes_per_record": round(size / count, 1), "records": count}
    finally:
        await conn.close()


# Our API's reads at the page sizes readers ask for: a reader catching up asks for large pages (the
# Python client does), a plain GET takes the default page (sized by bytes), and many clients ask for
# pages of 1,000 records.
API_PAGES: dict[str, tuple[str, dict[str, int]]] = {
    "api": ("api", {"limit": 100_000, "max_bytes": 16 * 1024 * 1024}),
    "api-default": ("api", {}),
    "api-1000": ("api", {"limit": 1000}),
}
MODES = ("api", "api-default", "api-1000", "ds", "sse", "ds-sse")


async def measure(
    server: Server,
    pg: LocalPostgres,
    records: int,
    modes: tuple[str, ...] = MODES,
    profile: str | None = None,
    out: Path | None = None,
    ts: bool = True,
) -> dict[str, Any]:
    """Every case against ``server`` (its Postgres ``pg``), one line printed each; ``profile`` names a
    case to record with py-spy (into ``out``)."""
    dsn = pg.dsn
    await load(server.url, records)
    results: dict[str, Any] = {"records": records, "storage": await storage(dsn)}
    before = await raw_ceiling(dsn, records)
    for mode in modes:
        spied = out / f"{mode}.collapsed" if out is not None and profile == mode else None
        results[mode] = await surface(server, postmaster_pid(pg), mode, records, spied)
        if spied is not None and spied.exists():
            print(top_functions(spied))
    # the ceiling is the better of before and after the cases: whatever disturbed one pass of it (the
    # checkpoint after the load, autovacuum) does not lower the bar
    after = await raw_ceiling(dsn, records)
    raw = results["raw_asyncpg"] = max(before, after, key=lambda r: r["records_per_s"])
    print(
        f"  raw asyncpg, pages of {RAW_PAGE:,}: {raw['records_per_s']:,} records/s"
        f" (before the cases {before['records_per_s']:,}, after {after['records_per_s']:,})",
        flush=True,
    )
    for mode in modes:
        report = results[mode]
        report["vs_raw"] = round(report["records_per_s"] / raw["records_per_s"], 3)
        print(
            f"  catch-up {mode}: {report['records_per_s']:,.0f} records/s = {report['vs_raw']} x raw asyncpg; "
            f"CPU cores: generator {report['cpu_share']}, server {report['server_cpu_share']},"
            f" postgres {report['postgres_cpu_share']}",
            flush=True,
        )
    for live, plain in (("sse", "api"), ("ds-sse", "ds")):
        if live in results and plain in results:
            results[live]["vs_plain"] = round(results[live]["records_per_s"] / results[plain]["records_per_s"], 3)
    if ts:
        results["ts_client"] = await ts_client(server, min(TS_RECORDS, records))
        print(f"  TS client: {results['ts_client']}", flush=True)
    print(f"  on disk: {results['storage']['bytes_per_record']} bytes per record", flush=True)
    return results


async def main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pg = await start_postgres()
    server = Server(pg.dsn, out / "server.log", workers=1)
    try:
        await server.ready()
        results = await measure(server, pg, args.records, tuple(args.modes), args.profile, out, not args.no_ts)
    finally:
        server.stop()
        pg.destroy()
    (out / "catchup.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--profile", choices=MODES, help="py-spy the server in this case")
    parser.add_argument("--no-ts", action="store_true", help="skip the TS client comparison")
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="wfs-catchup-"))
    asyncio.run(main(parser.parse_args()))
