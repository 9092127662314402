"""The measurements. Each returns ours, the baseline measured in the same run, and their ratio."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench.harness import AUTH, PREFIX, Server, percentiles, pins, run_for
from workflow_streams.domain.authz import Principal
from workflow_streams.domain.pins import parse_pins
from workflow_streams.domain.records import RecordIn, encode_json
from workflow_streams.localpg import LocalPostgres
from workflow_streams.store.appends import append_once
from workflow_streams.store.db import create_pool
from workflow_streams.store.definitions import create_definition

BENCH = Principal("bench")


def _ratio(ours: float, base: float) -> float:
    return round(ours / base, 3) if base else float("nan")


async def _create(session: aiohttp.ClientSession, url: str, run: str, stream: str) -> None:
    async with session.post(
        f"{url}{PREFIX}/runs/{run}/streams", json={"stream_id": stream, "pins": pins()}, headers=AUTH
    ) as resp:
        assert resp.status in (200, 201), await resp.text()


async def append_throughput(server: Server, dsn: str, seconds: float) -> list[dict[str, Any]]:
    """Appends over HTTP vs the same store transaction called directly on an asyncpg pool."""
    cases = [
        {"name": "1 producer, 100 B", "producers": 1, "streams": 1, "batch": 1, "size": 100},
        {"name": "8 producers, 100 B", "producers": 8, "streams": 1, "batch": 1, "size": 100},
        {"name": "32 producers, 100 B", "producers": 32, "streams": 1, "batch": 1, "size": 100},
        {"name": "1,000 streams, 32 producers, 100 B", "producers": 32, "streams": 1000, "batch": 1, "size": 100},
        {"name": "8 producers, batches of 100 x 100 B", "producers": 8, "streams": 1, "batch": 100, "size": 100},
        {"name": "8 producers, 4 KiB", "producers": 8, "streams": 1, "batch": 1, "size": 4096},
        {"name": "8 producers, 64 KiB", "producers": 8, "streams": 1, "batch": 1, "size": 65536 - 16},
    ]
    pool = await create_pool(dsn, min_size=8, max_size=40)
    out = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for case in cases:
            run = f"a-{uuid.uuid4().hex[:8]}"
            streams = [f"s{i}" for i in range(case["streams"])]
            for stream in streams:
                await _create(session, server.url, run, stream)
                async with pool.acquire() as conn:
                    await create_definition(conn, run + "-direct", stream, parse_pins(pins()), "bench")
            value = "x" * (case["size"] - 2)
            body = {"data": value} if case["batch"] == 1 else {"records": [{"data": value}] * case["batch"]}
            records = [RecordIn("application/json", encode_json(value))] * case["batch"]

            async def over_http(worker: int) -> int:
                stream = streams[(worker + int(time.perf_counter() * 1000)) % len(streams)]
                async with session.post(
                    f"{server.url}{PREFIX}/runs/{run}/streams/{stream}/records", json=body, headers=AUTH
                ) as resp:
                    assert resp.status == 201, await resp.text()
                return case["batch"]

            async def direct(worker: int) -> int:
                stream = streams[(worker + int(time.perf_counter() * 1000)) % len(streams)]
                async with pool.acquire() as conn:
                    await append_once(conn, run + "-direct", stream, records, BENCH)
                return case["batch"]

            ours = await run_for(seconds, case["producers"], over_http)
            base = await run_for(seconds, case["producers"], direct)
            out.append(
                {
                    "case": case["name"],
                    "ours_records_per_s": round(ours),
                    "direct_records_per_s": round(base),
                    "ratio": _ratio(ours, base),
                    "bytes_per_record": case["size"],
                }
            )
            print(f"  append {case['name']}: {ours:.0f}/s vs direct {base:.0f}/s", flush=True)
    await pool.close()
    return out


def pgbench_tps(pg: LocalPostgres, seconds: float, clients: int = 8) -> float:
    """pgbench's simple-update commit rate on the same server: the Postgres commit ceiling."""
    pgbench = str(pg.bindir / "pgbench")
    conn = ["-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres"]
    subprocess.run([str(pg.bindir / "createdb"), *conn, "pgbench"], capture_output=True)
    subprocess.run([pgbench, *conn, "-i", "-s", "1", "-q", "pgbench"], capture_output=True, check=True)
    result = subprocess.run(
        [pgbench, *conn, "-N", "-n", "-c", str(clients), "-j", "2", "-T", str(int(seconds)), "pgbench"],
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(r"tps = ([\d.]+)", result.stdout)
    assert match, result.stdout
    return float(match[1])


async def _sse_latencies(server: Server, subscribers: int, records: int, rate: float) -> list[float]:
    run, stream = f"l-{uuid.uuid4().hex[:8]}", "s"
    samples: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await _create(session, server.url, run, stream)
        url = f"{server.url}{PREFIX}/runs/{run}/streams/{stream}/subscribe"
        responses = await asyncio.gather(*(session.get(url, headers=AUTH) for _ in range(subscribers)))

        async def listen(resp: aiohttp.ClientResponse) -> None:
            seen = 0
            async for raw in resp.content:
                if raw.startswith(b"data: "):
                    sent = json.loads(raw[6:])["data"]["t"]
                    samples.append((time.time_ns() - sent) / 1e6)
                    seen += 1
                    if seen == records:
                        return

        listeners = [asyncio.create_task(listen(r)) for r in responses]
        await asyncio.sleep(0.5)
        for _ in range(records):
            async with session.post(
                f"{server.url}{PREFIX}/runs/{run}/streams/{stream}/records",
                json={"data": {"t": time.time_ns()}},
                headers=AUTH,
            ) as resp:
                assert resp.status == 201
            await asyncio.sleep(1 / rate)
        await asyncio.wait_for(asyncio.gather(*listeners), 120)
        for r in responses:
            r.close()
    return samples


async def _notify_latencies(dsn: str, records: int, rate: float) -> list[float]:
    """Baseline: the Postgres ceiling for a wake-up, a committed NOTIFY to a LISTEN connection."""
    samples: list[float] = []
    done = asyncio.Event()
    listener = await asyncpg.connect(dsn)
    sender = await asyncpg.connect(dsn)

    def on_notify(_c: object, _p: int, _ch: str, payload: str) -> None:
        samples.append((time.time_ns() - int(payload)) / 1e6)
        if len(samples) == records:
            done.set()

    await listener.add_listener("bench_latency", on_notify)
    for _ in range(records):
        async with sender.transaction():
            await sender.execute("SELECT pg_notify('bench_latency', $1)", str(time.time_ns()))
        await asyncio.sleep(1 / rate)
    await asyncio.wait_for(done.wait(), 30)
    await listener.close()
    await sender.close()
    return samples


async def delivery_latency(server: Server, dsn: str, records: int) -> list[dict[str, Any]]:
    base = percentiles(await _notify_latencies(dsn, records, 50))
    out = []
    for subscribers in (1, 100, 1000):
        ours = percentiles(await _sse_latencies(server, subscribers, records, 20))
        out.append(
            {
                "subscribers": subscribers,
                "ours_ms": ours,
                "listen_notify_ms": base,
                "ratio_p50": _ratio(ours["p50"], base["p50"]),
                "ratio_p99": _ratio(ours["p99"], base["p99"]),
            }
        )
        print(
            f"  latency {subscribers} subscribers: p50 {ours['p50']:.2f} ms p99 {ours['p99']:.2f} ms "
            f"(NOTIFY p50 {base['p50']:.2f} ms)",
            flush=True,
        )
    return out


async def catch_up(server: Server, dsn: str, count: int) -> dict[str, Any]:
    """Reading a long stream from a cold cursor: HTTP pages vs the same SELECT on asyncpg."""
    run, stream = f"c-{uuid.uuid4().hex[:8]}", "s"
    value = "y" * 1000
    async with aiohttp.ClientSession() as session:
        await _create(session, server.url, run, stream)
        for _ in range(count // 1000):
            async with session.post(
                f"{server.url}{PREFIX}/runs/{run}/streams/{stream}/records",
                json={"records": [{"data": value}] * 1000},
                headers=AUTH,
            ) as resp:
                assert resp.status == 201
        started, after, got, size = time.perf_counter(), 0, 0, 0
        while got < count:
            async with session.get(
                f"{server.url}{PREFIX}/runs/{run}/streams/{stream}/records",
                params={"after": str(after), "limit": "1000"},
                headers=AUTH,
            ) as resp:
                body = await resp.read()
            page = json.loads(body)
            got += len(page["records"])
            size += len(body)
            after = page["next_after"]
        ours = got / (time.perf_counter() - started)
    conn = await asyncpg.connect(dsn)
    started, after, got = time.perf_counter(), 0, 0
    while got < count:
        rows = await conn.fetch(
            """SELECT sequence, kind, content_type, payload, size_bytes, object, appended_at FROM wfs_records
               WHERE run_id = $1 AND stream_id = $2 AND sequence > $3 ORDER BY sequence LIMIT 1000""",
            run,
            stream,
            after,
        )
        got += len(rows)
        after = rows[-1]["sequence"]
    base = got / (time.perf_counter() - started)
    await conn.close()
    print(f"  catch-up: {ours:.0f} rec/s ({ours * size / count / 1e6:.1f} MB/s) vs direct {base:.0f} rec/s", flush=True)
    return {
        "records": count,
        "ours_records_per_s": round(ours),
        "ours_mb_per_s": round(ours * size / count / 1e6, 1),
        "direct_records_per_s": round(base),
        "ratio": _ratio(ours, base),
    }


BARE_SERVER = """
import asyncio, sys
from aiohttp import web
async def stream(request):
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"retry: 1000\\n\\n")
    await asyncio.Event().wait()
app = web.Application()
app.router.add_get("/s", stream)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


async def _open_idle(url: str, n: int, headers: dict[str, str]) -> tuple[aiohttp.ClientSession, list[Any]]:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    responses = []
    for start in range(0, n, 500):
        responses += await asyncio.gather(*(session.get(url, headers=headers) for _ in range(min(500, n - start))))
    for r in responses:
        await r.content.readline()
    return session, responses


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def subscriber_memory(server: Server, counts: tuple[int, ...], tmp: Path) -> list[dict[str, Any]]:
    """RSS per idle subscriber: ours vs a bare aiohttp server holding the same idle streams."""
    from workflow_streams.localpg import free_port

    port = free_port()
    bare = subprocess.Popen(
        [sys.executable, "-c", BARE_SERVER, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    await asyncio.sleep(1.5)
    run = f"m-{uuid.uuid4().hex[:8]}"
    async with aiohttp.ClientSession() as s:
        await _create(s, server.url, run, "s")
    out = []
    try:
        for n in counts:
            ours_before = server.rss_bytes()
            session, responses = await _open_idle(f"{server.url}{PREFIX}/runs/{run}/streams/s/subscribe", n, AUTH)
            await asyncio.sleep(1)
            ours_after = server.rss_bytes()
            for r in responses:
                r.close()
            await session.close()
            await asyncio.sleep(2)
            bare_before = _rss(bare.pid)
            bare_session, bare_responses = await _open_idle(f"http://127.0.0.1:{port}/s", n, {})
            await asyncio.sleep(1)
            bare_after = _rss(bare.pid)
            for r in bare_responses:
                r.close()
            await bare_session.close()
            ours_each = (ours_after - ours_before) / n
            bare_each = (bare_after - bare_before) / n
            out.append(
                {
                    "subscribers": n,
                    "ours_rss_mib": round(ours_after / 2**20, 1),
                    "ours_kib_per_subscriber": round(ours_each / 1024, 1),
                    "bare_aiohttp_kib_per_stream": round(bare_each / 1024, 1),
                    "ratio": _ratio(ours_each, bare_each),
                }
            )
            print(
                f"  memory {n} idle subscribers: {ours_each / 1024:.1f} KiB each (bare aiohttp "
                f"{bare_each / 1024:.1f} KiB), server RSS {ours_after / 2**20:.0f} MiB",
                flush=True,
            )
            await asyncio.sleep(2)
    finally:
        bare.kill()
    return out
