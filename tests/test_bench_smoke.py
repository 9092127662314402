"""The benchmark's load generator (bench/loadgen) against a real server, with tiny numbers: its JSON
reports parse, agree with what the server stored, every subscriber saw every record once and in order,
and a catch-up reader reaches the end of a stream on every surface. Functional checks of the
instrument; no timing, and no benchmark's printed output, is asserted."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from bench import generator

from tests.replica import Replica
from tests.support import ALICE, pins

pytestmark = pytest.mark.slow

TOKEN = ALICE["Authorization"].removeprefix("Bearer ")


@pytest.fixture
async def server(database_url: str, tmp_path: Path) -> AsyncIterator[str]:
    replica = Replica(database_url, tmp_path / "server.log", WFS_REGION="eu-west-1")
    try:
        async with aiohttp.ClientSession() as session:
            await replica.ready(session)
        yield f"{replica.base}/api/workflow-streams"
    finally:
        replica.stop()


def test_generator_checker_detects_duplicates_and_gaps() -> None:
    """The Go unit tests: the sequence checker counts a duplicate and a gap it is fed."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    result = subprocess.run([go, "test", "./..."], cwd=generator.SOURCES, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


async def test_append_report_matches_what_the_server_stored(server: str) -> None:
    report = await generator.run(
        "append", server, TOKEN, run="smoke-a", streams=3, conns=2, warmup="0.3s", duration="1s", create=pins()
    )
    assert report["mode"] == "append" and report["connections"] == 2 and report["streams"] == 3
    assert report["errors"] == {}
    assert report["requests_ok"] > 0
    assert report["latency_ms"]["n"] == report["requests_ok"]
    assert report["latency_ms"]["p50"] <= report["latency_ms"]["max"]
    assert report["cpu_seconds"] >= 0
    stored = 0
    async with aiohttp.ClientSession(headers=ALICE) as session:
        for i in range(3):
            async with session.get(f"{server}/runs/smoke-a/streams/bench-{i}") as resp:
                assert resp.status == 200
                stored += (await resp.json())["state"]["last_sequence"]
    # warm-up appends are stored but not counted
    assert stored >= report["requests_ok"]


async def test_read_counts_only_pages_answered_200(server: str) -> None:
    """Reads of existing streams count; a stream that does not exist is counted as its status, not as a read."""
    await generator.run(
        "append", server, TOKEN, run="smoke-r", streams=2, conns=1, warmup="0s", duration="0.3s", create=pins()
    )
    report = await generator.run("read", server, TOKEN, run="smoke-r", streams=2, conns=2, warmup="0.2s", duration="1s")
    assert report["mode"] == "read" and report["connections"] == 2 and report["after"] == 0
    assert report["errors"] == {}
    assert report["requests_ok"] > 0 and report["latency_ms"]["n"] == report["requests_ok"]
    assert report["bytes_per_s"] > 0 and report["cpu_seconds"] >= 0
    # absent-0 was never created: answered like a stream the caller may not see (403), never a 200
    missing = await generator.run(
        "read", server, TOKEN, run="smoke-r", prefix="absent-", streams=1, conns=1, warmup="0s", duration="0.3s"
    )
    assert missing["requests_ok"] == 0 and sum(missing["errors"].values()) > 0
    assert set(missing["errors"]) <= {"403", "404"}, missing["errors"]


async def test_sse_subscribers_see_every_record_once_in_order(server: str) -> None:
    phases: list[str] = []
    report = await generator.run(
        "sse",
        server,
        TOKEN,
        on_phase=phases.append,
        run="smoke-s",
        streams=2,
        subscribers=5,
        rate=20.0,
        duration="1s",
        create=pins(),
    )
    assert phases == ["connecting", "appending", "draining", "done"]
    assert report["connected"] == 5 and report["connect_errors"] == {}
    assert report["append_errors"] == {} and report["appended"] > 0
    assert report["foreign_sequences"] == 0
    # subscribers 0, 2, 4 follow stream 0 and 1, 3 stream 1: each expects all of its stream's records
    per_stream = [(report["appended"] + 1) // 2, report["appended"] // 2]
    assert report["expected"] == 3 * per_stream[0] + 2 * per_stream[1]
    assert report["delivered"] == report["expected"]
    assert report["duplicates"] == 0 and report["gaps"] == 0 and report["missing"] == 0
    assert report["disconnects"] == {}
    assert report["latency_ms"]["n"] == report["delivered"]


async def test_sse_subscribers_behind_read_the_backlog_then_follow(server: str) -> None:
    """With a backlog, every stream holds that many records before anyone connects; subscribers read them
    from the start (counted for order, not latency), then the live ones."""
    report = await generator.run(
        "sse", server, TOKEN, run="smoke-b", streams=2, subscribers=4, rate=20.0, duration="1s",
        backlog=1200, create=pins(),
    )  # fmt: skip
    assert report["backlog"] == 1200 and report["connected"] == 4 and report["append_errors"] == {}
    assert report["foreign_sequences"] == 0 and report["appended"] > 0
    assert report["expected"] == 4 * 1200 + 2 * report["appended"]
    assert report["delivered"] == report["expected"] and report["missing"] == 0
    assert report["duplicates"] == 0 and report["gaps"] == 0
    assert report["latency_ms"]["n"] == 2 * report["appended"], "only live records carry a send time"
    assert report["caught_up_seconds"] > 0


async def test_catchup_reads_a_whole_stream_on_every_surface(server: str) -> None:
    """The catch-up reader follows each surface's cursor to the end: our API's next_after, the protocol's
    Stream-Next-Offset, and both SSE forms, counting the bytes it read."""
    async with aiohttp.ClientSession(headers=ALICE) as session:
        created = await session.post(f"{server}/runs/smoke-c/streams", json={"stream_id": "s", "pins": pins()})
        assert created.status == 201
        for start in range(0, 3000, 1000):
            batch = {"records": [{"data": n} for n in range(start, start + 1000)]}
            assert (await session.post(f"{server}/runs/smoke-c/streams/s/records", json=batch)).status == 201
    ds = server.replace("/api/workflow-streams", "/api/durable-streams")
    for surface, base, flags in (
        ("api", server, {"limit": 700, "max_bytes": 10_000}),
        ("ds", ds, {}),
        ("sse", server, {}),
        ("ds-sse", ds, {}),
    ):
        where = {"surface": surface, "run": "smoke-c", "stream": "s", "until": 3000}
        report = await generator.run("catchup", base, TOKEN, **where, **flags)
        assert report["records"] == 3000 and report["bytes"] > 3000 * 4, report
        if surface == "api":  # payloads of a few bytes: the page's 700 records bind before its 10,000 bytes
            assert report["requests"] == 5, report
