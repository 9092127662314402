"""Shared pieces of the benchmarks: a Postgres, the server as a process, timing helpers."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from workflow_streams.localpg import LocalPostgres, find_bindir, free_port
from workflow_streams.store.migrate import apply_migrations

TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFIX = "/api/workflow-streams"


def pins(**credit: Any) -> dict[str, Any]:
    return {
        "direction": "output",
        "content_class": "model_output",
        "schema_ref": "bench/v1",
        "placement": {
            "metadata_home": "local",
            "object_regions": ["local"],
            "client_egress_regions": ["local"],
            "log_region": "local",
        },
        "authorization": {"append": ["bench"], "read": ["bench"], "ack": ["bench"], "close": ["bench"]},
        "credit": {"max_unread_items": 10**9, "max_unread_bytes": 10**15, **credit},
    }


def machine() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    pg = subprocess.run(
        [str((find_bindir() or Path("/usr/bin")) / "postgres"), "--version"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(int(meminfo) / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "postgres": pg,
        "note": "server, Postgres and load generator share these cores; compare ratios, not absolutes",
    }


async def start_postgres() -> LocalPostgres:
    bindir = find_bindir()
    assert bindir is not None, "PostgreSQL binaries are needed (scripts/bootstrap installs them)"
    pg = LocalPostgres(bindir)
    await asyncio.to_thread(pg.init)
    await asyncio.to_thread(pg.start)
    await apply_migrations(pg.dsn)
    return pg


class Server:
    """``workflow-streams serve`` in its own process, as in production."""

    def __init__(self, dsn: str, log: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workflow_streams.cli", "serve"],
            env={
                **os.environ,
                "WFS_DATABASE_URL": dsn,
                "WFS_PORT": str(self.port),
                "WFS_REGION": "local",
                "WFS_TOKENS": json.dumps({TOKEN: "bench"}),
                "WFS_PRUNE_INTERVAL_SECONDS": "0",
                "WFS_POOL_MAX": "40",
                "WFS_SSE_MAX_PER_PRINCIPAL": "100000",
                "WFS_SSE_HEARTBEAT_SECONDS": "30",
                **env,
            },
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    async def ready(self) -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(f"{self.url}/readyz") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError("server did not start")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


async def run_for(seconds: float, workers: int, work: Callable[[int], Awaitable[int]]) -> float:
    """Run ``workers`` loops of ``work`` for ``seconds``; returns units of work per second."""
    done = 0
    stop_at = time.perf_counter() + seconds

    async def loop(worker: int) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            done += await work(worker)

    started = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(workers)))
    return done / (time.perf_counter() - started)


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    if not samples_ms:
        return {"p50": float("nan"), "p99": float("nan"), "p99.9": float("nan"), "n": 0}
    ordered = sorted(samples_ms)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p99": at(0.99), "p99.9": at(0.999), "mean": statistics.fmean(ordered), "n": len(ordered)}
