"""The LISTEN/NOTIFY wake source: one listening connection and one notifier per process.

Why the notifier is separate from the appends: NOTIFY takes one cluster-wide lock in
``PreCommit_Notify`` and holds it through the commit's WAL flush, so every transaction that notifies
commits alone (PostgreSQL ``src/backend/commands/async.c``). Appends therefore never notify. After their
commit returns, their signals queue here; one task sends everything queued since its last send in one
short transaction of its own (many streams per payload), with at most one send in flight, and sends
start at least ``min_interval`` apart.

Why the interval: a NOTIFY costs Postgres more than its own transaction. Every listening backend runs a
transaction to read the notification queue (``ProcessIncomingNotify`` in async.c) and wakes its process,
so one NOTIFY is 1 + (processes listening) commits. Sent once per round trip, at 1,000 streams x 32
connections with two workers that was ~1,600 notify transactions a second, three for every group commit
(``pg_stat_database.xact_commit``). Spacing sends 5 ms apart (River spaces its per-queue notifications by
100 ms) bounds that to 200 per process a second, at the cost of at most 5 ms more for a wake that crosses
processes; the first signal after a quiet spell goes at once. And what is sent is only what someone
may wait for: records of streams no process watches are not announced at all (``runtime.interest``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

import asyncpg

from ..domain.wakes import CHANNEL, MalformedPayload, Signal, decode
from ..store import notify
from ..store.db import DB_UNAVAILABLE
from .wakes import Deliver

log = logging.getLogger(__name__)

# signals waiting to be sent are merged per stream, so this bounds memory if Postgres is away
_MAX_PENDING = 100_000

# NOTIFYs of one process start at least this far apart (the module docstring says why)
MIN_NOTIFY_INTERVAL_SECONDS = 0.005


class ListenNotify:
    def __init__(
        self,
        dsn: str,
        sender: str,
        *,
        keepalive_seconds: float = 5.0,
        application_name: str = "wfs-listen",
        min_interval: float = MIN_NOTIFY_INTERVAL_SECONDS,
    ) -> None:
        self._dsn = dsn
        self._sender = sender
        self._keepalive = keepalive_seconds
        self._min_interval = min_interval
        self._application_name = application_name
        self.connected = asyncio.Event()
        self.reconnects = 0
        self._deliver: Deliver | None = None
        self._pending: dict[tuple[str, str, str], Signal] = {}
        self._has_pending = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._listen_conn: asyncpg.Connection | None = None
        self._notify_conn: asyncpg.Connection | None = None
        self._lost: Callable[[], None] | None = None

    async def start(self, deliver: Deliver, lost: Callable[[], None]) -> None:
        self._deliver, self._lost = deliver, lost
        self._tasks = [
            asyncio.create_task(self._listen(), name="wfs-listen"),
            asyncio.create_task(self._notify(), name="wfs-notify"),
        ]
        # a first connection failure is reported at start-up rather than hidden in the loop
        await asyncio.wait_for(self.connected.wait(), timeout=30)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for conn in (self._listen_conn, self._notify_conn):
            if conn is not None and not conn.is_closed():
                await conn.close()

    def send(self, signals: Iterable[Signal]) -> None:
        for signal in signals:
            earlier = self._pending.get(signal.key)
            self._pending[signal.key] = signal if earlier is None else earlier.merge(signal)
        if len(self._pending) > _MAX_PENDING:
            # other processes still find these commits by polling their heads
            log.warning("dropping %d unsent wake signals (Postgres unreachable?)", len(self._pending))
            self._pending.clear()
        if self._pending:
            self._has_pending.set()

    async def _notify(self) -> None:
        backoff = 0.1
        loop = asyncio.get_running_loop()
        next_send = loop.time()
        while True:
            await self._has_pending.wait()
            if (wait := next_send - loop.time()) > 0:
                await asyncio.sleep(wait)  # what queues meanwhile goes in the same payloads
            next_send = loop.time() + self._min_interval
            self._has_pending.clear()
            batch, self._pending = self._pending, {}
            try:
                if self._notify_conn is None or self._notify_conn.is_closed():
                    self._notify_conn = await asyncpg.connect(
                        self._dsn, server_settings={"application_name": self._application_name + "-notify"}
                    )
                await notify.send(self._notify_conn, batch.values(), self._sender)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the sender must outlive any failure, or other processes hear nothing
                _log_failure(exc, "NOTIFY failed", backoff)
                if self._notify_conn is not None:
                    self._notify_conn.terminate()
                    self._notify_conn = None
                self.send(batch.values())  # merged with anything newer
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            sender, signals = decode(payload, unless_from=self._sender)
        except MalformedPayload as exc:
            log.warning("ignoring a notification: %s", exc)
            return
        if sender != self._sender and self._deliver is not None:  # our own were delivered at publish
            self._deliver(signals)

    async def _listen(self) -> None:
        backoff = 0.1
        while True:
            try:
                conn = await asyncpg.connect(self._dsn, server_settings={"application_name": self._application_name})
                self._listen_conn = conn
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                self.connected.set()
                if self.reconnects:
                    log.info("LISTEN connection re-established; waking all watchers to re-read")
                    if self._lost is not None:
                        self._lost()  # notifications sent while we were away are gone
                backoff = 0.1
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), self._keepalive)
                        break
                    # a silent network loss shows up only when we ask
                    await asyncio.wait_for(conn.fetchval("SELECT 1"), timeout=self._keepalive)
                raise ConnectionError("LISTEN connection terminated")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # likewise the listener: its end would leave only the polls
                self.connected.clear()
                self.reconnects += 1
                _log_failure(exc, "LISTEN connection lost", backoff)
                if self._listen_conn is not None:
                    self._listen_conn.terminate()
                    self._listen_conn = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)


def _log_failure(exc: Exception, what: str, backoff: float) -> None:
    """A lost connection is expected (a restart, a failover, a killed backend): one line. Anything else
    is a bug, logged with its traceback, and the loop still carries on."""
    if isinstance(exc, (*DB_UNAVAILABLE, asyncpg.PostgresError)):
        log.warning("%s (%s); retrying in %.1fs", what, exc, backoff)
    else:
        log.error("%s unexpectedly; retrying in %.1fs", what, backoff, exc_info=exc)
