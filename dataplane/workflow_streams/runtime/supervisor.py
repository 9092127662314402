"""Background work that never dies silently: every long-lived task of a process runs under one supervisor.

A task that raises is logged (one line for a lost database, its traceback for anything else), counted
(``wfs_background_restarts_total``) and started again after ``runtime.retries.BACKOFF`` (0.1 s doubling
to 2 s), by tenacity, as every retry here is. A task that returns is a bug too, restarted alike: they
are loops meant to run for the process's life.

While a *critical* task (one live delivery depends on: the LISTEN connection, the notifier, the head
poller) is down, ``down()`` names it and /readyz answers 503, so a Service stops sending subscribers to a
process that cannot wake them. Tasks that are not critical (pruner, dispatcher, janitor, sampler) are
restarted the same way; other replicas cover for them meanwhile (their work is claimed with leases).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from ..adapters import metrics
from ..store.db import DB_UNAVAILABLE
from .retries import BACKOFF

log = logging.getLogger(__name__)


class TaskReturned(RuntimeError):
    """A supervised loop ended by itself."""


def log_failure(what: str, exc: BaseException, delay: float) -> None:
    """A lost database is expected (a restart, a failover, a partition): one line. Anything else is a
    bug: its traceback."""
    if isinstance(exc, (*DB_UNAVAILABLE, asyncpg.PostgresError)):
        log.warning("%s failed (%s: %s); restarting in %.1fs", what, type(exc).__name__, exc, delay)
    else:
        log.error("%s failed unexpectedly; restarting in %.1fs", what, delay, exc_info=exc)


@dataclass
class _Task:
    name: str
    critical: bool
    task: asyncio.Task[None] | None = None
    down: bool = False


class Supervisor:
    def __init__(self) -> None:
        self._tasks: dict[str, _Task] = {}

    def start(self, name: str, run: Callable[[], Awaitable[None]], *, critical: bool = False) -> None:
        """Run ``run()`` until ``stop``, restarting it whenever it raises or returns."""
        assert name not in self._tasks, f"two background tasks named {name}"
        entry = self._tasks[name] = _Task(name, critical)
        entry.task = asyncio.create_task(self._keep(entry, run), name=f"wfs-{name}")

    def down(self) -> list[str]:
        """The critical tasks that failed and have not been started again."""
        return [t.name for t in self._tasks.values() if t.critical and t.down]

    def report(self, what: str, exc: BaseException) -> None:
        """A short-lived task that failed on its own (a stream's fan-out): logged and counted here; its
        owner starts another when it is needed."""
        log_failure(what, exc, 0.0)
        metrics.BACKGROUND_RESTARTS.labels(what.split(" ")[0]).inc()

    async def stop(self) -> None:
        tasks = [t.task for t in self._tasks.values() if t.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _keep(self, entry: _Task, run: Callable[[], Awaitable[None]]) -> None:
        def failed(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            delay = state.next_action.sleep if state.next_action is not None else 0.0
            entry.down = True
            metrics.BACKGROUND_DOWN.labels(entry.name).set(1)
            metrics.BACKGROUND_RESTARTS.labels(entry.name).inc()
            if exc is not None:
                log_failure(entry.name, exc, delay)

        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(Exception), wait=BACKOFF, before_sleep=failed, reraise=True
        ):
            with attempt:
                entry.down = False
                metrics.BACKGROUND_DOWN.labels(entry.name).set(0)
                await run()
                raise TaskReturned(f"{entry.name} returned")
