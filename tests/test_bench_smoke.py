"""The benchmark's load generator (bench/loadgen) against a real server, with tiny numbers: its JSON
reports parse, agree with what the server stored, and every subscriber saw every record once and
in order. bench.ab runs once with tiny numbers. Functional checks of the instruments;
no timing is asserted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def _bench_module(*args: str) -> str:
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=repo, capture_output=True, text=True, timeout=300, env=_bench_env(repo)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _bench_env(repo: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "dataplane"), str(repo)])}


def test_ab_runs_a_variant_and_reports_medians(tmp_path: Path) -> None:
    """bench.ab, one tiny round: each variant's server starts from its tree, and every case is reported."""
    repo = Path(__file__).resolve().parents[1]
    out = _bench_module(
        "bench.ab", f"here={repo}", "--cases", "3x2", "--rounds", "1", "--seconds", "1", "--logs", str(tmp_path),
    )  # fmt: skip
    lines = out.splitlines()
    assert any(line.startswith("round 0") and "here 3x2" in line and "errors {}" in line for line in lines), out
    assert "medians over rounds:" in lines
    assert (tmp_path / "here.log").exists()


def test_ab_sets_each_case_beside_pgbench_around_its_round(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    out = _bench_module(
        "bench.ab", f"here={repo}", "--cases", "3x2", "--rounds", "2", "--seconds", "1", "--pgbench", "--quiet", "0",
        "--logs", str(tmp_path),
    )  # fmt: skip
    lines = out.splitlines()
    ratios = [line.split(":")[0] for line in lines if "pgbench -N around (" in line]
    assert ratios == ["round 0       here 3x2", "round 1       here 3x2"], out
    assert any(line.startswith("3x2") and line.endswith("pgbench -N around") for line in lines), out  # the median
    assert any(line.startswith("3x2") and "lowest" in line and "highest" in line for line in lines), out


def test_drift_reads_pgbench_again_and_again() -> None:
    out = _bench_module("bench.drift", "--runs", "2", "--seconds", "1", "--pause", "0", "--reinit")
    assert sum("pgbench -N run" in line for line in out.splitlines()) == 2, out
    assert "spread: highest / lowest =" in out
