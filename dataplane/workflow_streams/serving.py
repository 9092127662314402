"""Serving one port from N processes: ``workflow-streams serve --workers N``.

One Python process uses one core. With ``--workers N`` the parent starts N serving processes that
each bind the same port with SO_REUSEPORT (the kernel spreads connections across them), each with its
own pool, group commit and wake source; they meet only in Postgres, exactly like replicas on different
machines do. The parent only supervises: it forwards SIGTERM/SIGINT, and if a worker dies it stops
the others and exits with that worker's status, so the pod restarts whole rather than limping along.
Workers die with the parent (PR_SET_PDEATHSIG), so a killed parent never leaves orphans serving.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
from types import FrameType

from aiohttp import web

from .config import Settings

log = logging.getLogger(__name__)

# accepted-but-not-yet-served connections the kernel keeps per process: a burst of thousands of
# subscribers connecting at once must not overflow it (the kernel caps it at net.core.somaxconn)
LISTEN_BACKLOG = 4096

_PR_SET_PDEATHSIG = 1


def worker_count(settings: Settings) -> int:
    return settings.workers if settings.workers > 0 else (os.cpu_count() or 1)


def serve(settings: Settings) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status."""
    workers = worker_count(settings)
    if workers == 1:
        _run(settings, reuse_port=False)
        return 0
    context = multiprocessing.get_context("spawn")  # a clean interpreter: no inherited event loop
    processes = [
        context.Process(target=_worker, args=(settings, os.getpid()), name=f"wfs-serve-{i}", daemon=False)
        for i in range(workers)
    ]
    for process in processes:
        process.start()
    log.info("serving %s:%d from %d processes (pids %s)", settings.host, settings.port, workers,
             ", ".join(str(p.pid) for p in processes))  # fmt: skip
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signal.SIGTERM if signum == signal.SIGINT else signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    remaining = list(processes)
    while remaining:
        multiprocessing.connection.wait([p.sentinel for p in remaining])
        for process in [p for p in remaining if not p.is_alive()]:
            remaining.remove(process)
            code = process.exitcode or 0
            if not stopping:
                log.error("worker %s exited with status %s; stopping the others", process.pid, code)
                status = code or 1
                forward(signal.SIGTERM, None)
    return status


def _worker(settings: Settings, parent: int) -> None:
    # die with the parent, whatever killed it: no orphan keeps serving the port
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect (it may be PID 1 itself)
        sys.exit(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s")
    _run(dataclasses.replace(settings, workers=1), reuse_port=True)


def _run(settings: Settings, *, reuse_port: bool) -> None:
    from .api.app import create_app

    web.run_app(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        access_log=None,
        reuse_port=reuse_port,
        backlog=LISTEN_BACKLOG,
        print=None if reuse_port else print,  # one "running on" line, not N
    )
