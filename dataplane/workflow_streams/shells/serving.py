"""Serving one port from N processes: ``workflow-streams serve --workers N``.

One Python process uses one core. With ``--workers N`` the parent starts N serving processes that
each bind the same port with SO_REUSEPORT (the kernel spreads connections across them), each with its
own pool, group commit and wake source; they meet only in Postgres, exactly like replicas on different
machines do. The parent only supervises: it forwards SIGTERM/SIGINT, and if a worker dies it stops
the others and exits with that worker's status, so the pod restarts whole rather than limping along.
Workers die with the parent (PR_SET_PDEATHSIG), so a killed parent never leaves orphans serving.
Each worker listens before its app starts, and ``/readyz`` says ready only once all N have started:
a connection opened while one was still starting would otherwise land on the others for its life.

A scrape of ``/metrics`` lands on any worker, so the parent gives them prometheus_client's multiprocess
mode: a private directory, named in ``PROMETHEUS_MULTIPROC_DIR`` before the workers start, where each
worker keeps its values and from which any worker answers for all (see ``metrics.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from types import FrameType

import uvloop
from aiohttp import web
from prometheus_client.multiprocess import mark_process_dead

from ..adapters.config import Settings
from ..adapters.metrics import MULTIPROC_DIR_ENV

log = logging.getLogger(__name__)

# accepted-but-not-yet-served connections the kernel keeps per process: a burst of thousands of
# subscribers connecting at once must not overflow it, or the clients' retransmits (after whole seconds)
# dominate the connect. The kernel caps it at net.core.somaxconn (4096 by default): raise that too for
# bursts beyond it (figures: bench/README.md, constants)
LISTEN_BACKLOG = 16384

_PR_SET_PDEATHSIG = 1

# memory-backed, and writable in a container whose root filesystem is read-only (the chart's)
_SHM = Path("/dev/shm")
_METRICS_DIR_PREFIX = "wfs-metrics-"
_METRICS_LOCK = ".lock"  # held by the parent while it lives: an unlocked directory is a dead parent's


def worker_count(settings: Settings) -> int:
    return settings.workers if settings.workers > 0 else (os.cpu_count() or 1)


def serve(settings: Settings) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status."""
    workers = worker_count(settings)
    if workers == 1:
        _run(settings)
        return 0
    with _multiprocess_metrics() as metrics_dir:
        return _supervise(settings, workers, metrics_dir)


def _supervise(settings: Settings, workers: int, metrics_dir: Path | None) -> int:
    # spawn: the workers inherit os.environ as it is now, PROMETHEUS_MULTIPROC_DIR included, and import
    # prometheus_client afresh, so their metrics are born in multiprocess mode
    context = multiprocessing.get_context("spawn")  # a clean interpreter: no inherited event loop
    started = context.Value("i", 0)  # workers started (their readiness counts them: _Siblings)
    processes = [
        context.Process(
            target=_worker,
            args=(settings, os.getpid(), _Siblings(started, workers)),
            name=f"wfs-serve-{i}",
            daemon=False,
        )
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
            if metrics_dir is not None and process.pid is not None:
                # its live gauges stop counting (prometheus_client leaves this function untyped)
                mark_process_dead(process.pid, str(metrics_dir))  # type: ignore[no-untyped-call]
            code = process.exitcode or 0
            if not stopping:
                log.error("worker %s exited with status %s; stopping the others", process.pid, code)
                status = code or 1
                forward(signal.SIGTERM, None)
    return status


@contextlib.contextmanager
def _multiprocess_metrics() -> Iterator[Path | None]:
    """A fresh private directory in ``PROMETHEUS_MULTIPROC_DIR`` while the workers run; removed after.

    Directories that dead parents left (killed before they could remove theirs) are removed first.
    Without a writable place the workers serve with metrics of their own, as before, and say so."""
    base = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    _remove_abandoned(base)
    try:
        directory = Path(tempfile.mkdtemp(prefix=_METRICS_DIR_PREFIX, dir=base))
    except OSError as exc:
        log.warning("no directory for multiprocess metrics (%s): each worker's /metrics speaks for itself", exc)
        yield None
        return
    previous = os.environ.get(MULTIPROC_DIR_ENV)
    lock = -1
    try:
        # locked before it takes its name, so another parent's sweep never finds it unlocked
        lock = os.open(directory / f"{_METRICS_LOCK}.new", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.rename(directory / f"{_METRICS_LOCK}.new", directory / _METRICS_LOCK)
        os.environ[MULTIPROC_DIR_ENV] = str(directory)
        yield directory
    finally:
        if previous is None:
            os.environ.pop(MULTIPROC_DIR_ENV, None)
        else:
            os.environ[MULTIPROC_DIR_ENV] = previous
        shutil.rmtree(directory, ignore_errors=True)
        if lock >= 0:
            os.close(lock)


def _remove_abandoned(base: Path) -> None:
    for directory in base.glob(f"{_METRICS_DIR_PREFIX}*"):
        try:
            if directory.stat().st_uid != os.getuid():
                continue
            lock = os.open(directory / _METRICS_LOCK, os.O_RDWR)
        except OSError:  # not ours, gone, or not locked yet (its parent is starting): leave it
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live parent holds it
        finally:
            os.close(lock)
        shutil.rmtree(directory, ignore_errors=True)


class _Siblings:
    """The workers of one ``serve``, counted in shared memory as each starts (``api.app.Siblings``)."""

    def __init__(self, started: Synchronized[int], workers: int) -> None:
        self._started = started
        self._workers = workers

    def started(self) -> None:
        with self._started.get_lock():
            self._started.value += 1

    def starting(self) -> int:
        return max(0, self._workers - self._started.value)


def _worker(settings: Settings, parent: int, siblings: _Siblings) -> None:
    # die with the parent, whatever killed it: no orphan keeps serving the port
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect (it may be PID 1 itself)
        sys.exit(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s")
    _run(dataclasses.replace(settings, workers=1), siblings=siblings)


def tune_gc() -> None:
    """Fewer, cheaper cyclic collections for a server holding many long-lived objects.

    Each collection of the oldest generation walks every live object, and thousands of subscriptions
    are hundreds of thousands of them, so a burst of subscribers connecting (each allocating its
    ``Wake()`` and more) pays for walking them again and again. Objects made at start-up (modules, the
    app) are frozen out of collection, and the youngest generation is collected every 50,000 allocations
    instead of CPython's 700: requests make short-lived cycles rarely (most garbage is freed by reference
    counting), so this trades a little memory for CPU (figures: bench/README.md, constants).
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _listen(settings: Settings) -> socket.socket:
    """A worker's own socket on the shared port, listening at once: it counts as started only after its
    app has (``_Siblings``), so when every worker has started, every worker listens."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    return socket.create_server((settings.host, settings.port), family=family, backlog=LISTEN_BACKLOG, reuse_port=True)


def _run(settings: Settings, *, siblings: _Siblings | None = None) -> None:
    from .compose import create_app

    tune_gc()
    sock = _listen(settings) if siblings is not None else None
    web.run_app(
        create_app(settings, siblings=siblings),
        # uvloop (libuv, by asyncpg's authors) runs the event loop, its transports and callbacks in C, so
        # appends cost the server less. It serves a burst of connections evenly, so a burst's first reads
        # of a stream rarely overlap in time: they share statements because reads of many streams are
        # batched and ended reads stay joinable (runtime.reads), not by accident of scheduling (figures:
        # bench/README.md, constants)
        loop=uvloop.new_event_loop(),
        host=None if sock is not None else settings.host,
        port=None if sock is not None else settings.port,
        sock=sock,
        access_log=None,
        backlog=LISTEN_BACKLOG,
        print=None if siblings is not None else print,  # one "running on" line, not N
    )
