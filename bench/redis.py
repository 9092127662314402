"""Redis as the batched appends' peer: a redis-server of our own, and ``redis-benchmark`` XADD against it.

Why Redis: a batch of records per request is what a pipeline of XADDs is to Redis, and Redis 7 with
``appendfsync always`` is the common in-memory log that still answers only after the write is on disk
(its AOF is fsync'ed before each reply is sent, the replies of one event-loop pass sharing it), as our
appends answer only after Postgres' commit. ``XADD stream:<0-999> * data <100 bytes>`` pipelined 10 or
100 deep over 32 connections is the shape of our batched cases: 1,000 streams, 32 connections, 10 or
100 records a round trip, one record an XADD. The server runs on a free loopback port, with its data in
a temporary directory and no snapshots (``--save ''``): only the AOF writes to disk. Debian's
``redis-server`` and ``redis-tools`` (scripts/bootstrap) provide both programs.
"""

from __future__ import annotations

import csv
import io
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import process_tree_cpu
from workflow_streams.local.postgres import free_port
from workflow_streams.local.process import Process

STREAMS = 1000  # -r: the keys are stream:000000000000 to stream:000000000999
RECORD = "x" * 100


def available() -> bool:
    return shutil.which("redis-server") is not None and shutil.which("redis-benchmark") is not None


class Redis:
    """redis-server with its AOF fsync'ed on every write, in a directory of its own; ``stop`` removes it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="wfs-redis-"))
        command = [
            "redis-server",
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.dir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--daemonize", "no",
        ]  # fmt: skip
        self.process = Process(command, log=self.dir / "redis.log", name="redis-server")

    def ready(self) -> None:
        self.process.wait_for_output("Ready to accept connections", seconds=30)

    def stop(self) -> None:
        self.process.stop(grace=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def xadd(self, pipeline: int, requests: int, clients: int = 32) -> dict[str, Any]:
        """``redis-benchmark`` XADD of 100-byte records to 1,000 streams, ``pipeline`` deep, ``requests``
        XADDs in all: records per second (an XADD is one record), with the CPU of redis-benchmark (the
        generator here) and of redis-server over the run."""
        command = [
            "redis-benchmark",
            "-h", "127.0.0.1",
            "-p", str(self.port),
            "-c", str(clients),
            "-P", str(pipeline),
            "-n", str(requests),
            "-r", str(STREAMS),
            "--csv",
            "XADD", "stream:__rand_int__", "*", "data", RECORD,
        ]  # fmt: skip
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        server = process_tree_cpu(self.process.pid)
        began = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if result.returncode != 0:
            raise RuntimeError(f"redis-benchmark failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        rows = list(csv.DictReader(io.StringIO(result.stdout)))
        if not rows or "rps" not in rows[0]:
            raise RuntimeError(f"redis-benchmark printed no rps:\n{result.stdout}\n{result.stderr}")
        client = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        return {
            "pipeline": pipeline,
            "clients": clients,
            "streams": STREAMS,
            "requests": requests,
            "records_per_s": round(float(rows[0]["rps"])),
            "latency_ms": {"p50": float(rows[0]["p50_latency_ms"]), "p99": float(rows[0]["p99_latency_ms"])},
            # over the program's whole run, connecting included: its wall time is what its rps is over
            "seconds": round(wall, 3),
            "generator_cores": round(client / wall, 3),
            "redis_cores": round((process_tree_cpu(self.process.pid) - server) / wall, 3),
        }
