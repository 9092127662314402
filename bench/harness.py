"""Shared pieces of the benchmarks: a Postgres, the server as a process, timing helpers."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from workflow_streams.local.postgres import LocalPostgres, find_bindir, free_port
from workflow_streams.local.process import Process, listening_sockets, workflow_streams
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
        "somaxconn": int(Path("/proc/sys/net/core/somaxconn").read_text()),
        "note": "server, Postgres and load generator share these cores; compare ratios, not absolutes",
    }


def listen_overflows() -> int:
    """The kernel's count of connections dropped because an accept queue was full (TcpExt
    ListenOverflows): a connection burst beyond the backlog shows here, and its clients retransmit."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split()[1:], values.split()[1:], strict=True))["ListenOverflows"])
    return 0


async def start_postgres() -> LocalPostgres:
    bindir = find_bindir()
    assert bindir is not None, "PostgreSQL binaries are needed (scripts/bootstrap installs them)"
    pg = LocalPostgres(bindir)
    await asyncio.to_thread(pg.init)
    await asyncio.to_thread(pg.start)
    await apply_migrations(pg.dsn)
    return pg


def raise_open_files_limit() -> None:
    """10,000 subscriptions are 10,000 sockets: lift the soft limit to the hard one (also in children)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: split after its closing one
    return text[text.rindex(")") + 2 :].split()


def process_tree(root: int) -> dict[int, list[str]]:
    """``root`` and all its live descendants: pid -> /proc stat fields after the command name."""
    children: dict[int, list[int]] = {}
    fields: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            fields[int(entry.name)] = stat
            children.setdefault(int(stat[1]), []).append(int(entry.name))  # field 4: ppid
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in fields:
            tree[pid] = fields[pid]
        todo += children.get(pid, [])
    return tree


def process_tree_times(root: int) -> tuple[float, float]:
    """User and system CPU seconds of ``root`` and its descendants, dead ones included: a process that
    exited (a Postgres backend whose connection closed) took its CPU with it from the live sum, which
    made a window's figure negative; once reaped, its time is in its parent's cutime/cstime."""
    tree = process_tree(root).values()
    # fields 14, 15: utime, stime; 16, 17: cutime, cstime (children waited for)
    user = sum(int(f[11]) + int(f[13]) for f in tree)
    system = sum(int(f[12]) + int(f[14]) for f in tree)
    return user / _TICKS, system / _TICKS


def process_tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and its descendants, dead ones included."""
    return sum(process_tree_times(root))


def process_tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and its live descendants."""
    return sum(int(f[21]) for f in process_tree(root).values()) * resource.getpagesize()  # field 24: rss pages


def pg_tool(pg: LocalPostgres, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One of Postgres' client programs (pgbench, psql, createdb) against ``pg``."""
    command = [str(pg.bindir / name), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", *args]
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def postmaster_pid(pg: LocalPostgres) -> int:
    return int((pg.datadir / "postmaster.pid").read_text().split()[0])


class Server:
    """``workflow-streams serve`` in its own process, as in production; ``workers`` passes
    ``--workers N`` through when given."""

    def __init__(
        self,
        dsn: str,
        log: Path,
        workers: int | None = None,
        python: str | None = None,
        port: int | None = None,
        **env: str,
    ) -> None:
        self.port = port or free_port()
        self.dsn, self.log, self.env = dsn, log, env
        self.url = f"http://127.0.0.1:{self.port}"
        command = workflow_streams("serve")
        if python is not None:  # another interpreter (bench.ab's PY:)
            command[0] = python
        if workers is not None:
            command += ["--workers", str(workers)]
        raise_open_files_limit()  # the server inherits it: 10,000 subscribers are 10,000 sockets
        self.process = Process(
            command,
            log=log,
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
            name="server",
        )
        self.proc = self.process.proc
        self.workers = workers if workers is not None else (os.cpu_count() or 1)

    async def ready(self) -> None:
        """Every worker listening, not only the first to answer: keep-alive connections opened while
        the second still starts all land on the first and stay there for the whole case (bench.ab's first
        case at 1 x 32 then ran on one worker in some rounds: ~31 appends per transaction, not ~12).
        Since 4ef9306 the server's /readyz waits for every worker itself; the check stays for the older
        trees bench.ab compares against."""
        await self.process.ready(f"{self.url}/readyz", seconds=30)
        deadline = time.monotonic() + 30
        while listening_sockets(self.port) < self.workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{listening_sockets(self.port)} of {self.workers} workers listen on {self.port}")
            await asyncio.sleep(0.05)

    def rss_bytes(self) -> int:
        """Resident memory of the server and its worker processes."""
        return process_tree_rss(self.process.pid)

    def cpu_seconds(self) -> float:
        return process_tree_cpu(self.process.pid)

    def stop(self) -> None:
        self.process.stop(grace=15)


# --- CPU of everyone involved -------------------------------------------------------------------


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks of the whole machine since boot (/proc/stat's first line)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


async def group_commits(server_url: str) -> tuple[float, float]:
    """(transactions, append requests) the server's group commit has carried so far, from its own
    ``wfs_group_commit_requests`` histogram (all workers). Taken before and after a case, their
    differences say how many appends a transaction carried (warm-up included: the server's counts are
    not split by the generator's phases)."""
    async with aiohttp.ClientSession() as session, session.get(server_url + "/metrics") as response:
        text = await response.text()
    values = {"wfs_group_commit_requests_count": 0.0, "wfs_group_commit_requests_sum": 0.0}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values["wfs_group_commit_requests_count"], values["wfs_group_commit_requests_sum"]


def appends_per_transaction(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    transactions = after[0] - before[0]
    return round((after[1] - before[1]) / transactions, 1) if transactions else None


@dataclass
class Meter:
    """Samples the server's and Postgres' CPU, the whole machine's busy time and the server's memory
    whenever the generator enters a phase (pass ``mark`` as its ``on_phase``), so that figures cover
    exactly the measured window."""

    server: Server
    postgres_pid: int
    # name -> (wall clock, server CPU s, Postgres CPU s, server RSS, machine busy ticks, machine ticks)
    marks: dict[str, tuple[float, float, float, int, int, int]] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        busy, total = machine_jiffies()
        self.marks[name] = (
            time.perf_counter(),
            self.server.cpu_seconds(),
            process_tree_cpu(self.postgres_pid),
            self.server.rss_bytes(),
            busy,
            total,
        )

    def between(self, start: str, end: str) -> dict[str, float]:
        """Seconds of CPU and cores used (CPU seconds per wall second) between two marks."""
        t0, s0, p0, *_ = self.marks[start]
        t1, s1, p1, *_ = self.marks[end]
        wall = max(t1 - t0, 1e-9)
        return {
            "wall_s": round(wall, 3),
            "server_cpu_s": round(s1 - s0, 3),
            "server_cores": round((s1 - s0) / wall, 3),
            "postgres_cpu_s": round(p1 - p0, 3),
            "postgres_cores": round((p1 - p0) / wall, 3),
        }

    def cores(self, start: str, end: str, generator_cpu_s: float) -> dict[str, float]:
        """Cores busy between two marks: the server's, Postgres', the generator's, the whole machine's,
        and others' (the machine's busy time minus ours: on a shared machine, what other work took
        while the figure was measured)."""
        t0, s0, p0, _, b0, n0 = self.marks[start]
        t1, s1, p1, _, b1, n1 = self.marks[end]
        seconds = max(t1 - t0, 1e-9)
        machine = (b1 - b0) / max(n1 - n0, 1) * (os.cpu_count() or 1)
        ours = (s1 - s0 + p1 - p0 + generator_cpu_s) / seconds
        return {
            "server": round((s1 - s0) / seconds, 3),
            "postgres": round((p1 - p0) / seconds, 3),
            "generator": round(generator_cpu_s / seconds, 3),
            "machine": round(machine, 3),
            "others": round(max(0.0, machine - ours), 3),
        }

    def rss(self, name: str) -> int:
        return self.marks[name][3]
