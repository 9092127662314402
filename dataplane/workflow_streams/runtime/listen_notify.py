"""The LISTEN/NOTIFY wake source: one listening connection and one notifier per process.

Why the notifier is separate from the appends: NOTIFY takes one cluster-wide lock in
``PreCommit_Notify`` and holds it through the commit's WAL flush, so every transaction that notifies
commits alone (PostgreSQL ``src/backend/commands/async.c``). Appends therefore never notify. After their
commit returns, their signals queue here; one task sends everything queued since its last send in one
short transaction of its own (many streams per payload), with at most one send in flight, and sends
start at least ``min_interval`` apart.

Why the interval: a NOTIFY costs Postgres more than its own transaction. Every listening backend runs a
transaction to read the notification queue (``ProcessIncomingNotify`` in async.c) and wakes its process, so
one NOTIFY is 1 + (processes listening) commits. Sent once per round trip, the notify transactions would
outnumber the group commits they announce (``pg_stat_database.xact_commit`` counts both). Spacing sends
``MIN_NOTIFY_INTERVAL_SECONDS`` apart (River spaces its per-queue notifications the same way, further apart)
bounds them to one per interval per process, at the cost of at most one interval more for a wake that
crosses processes; a longer interval adds that latency without adding appends (figures: bench/README.md,
constants). The first signal after a quiet spell goes at once. And what is sent is only what someone may
wait for: records of streams no process watches are not announced at all (``runtime.interest``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

import asyncpg

from ..domain.wakes import CHANNEL, MalformedPayload, Signal, decode
from ..store import db, notify
from .wakes import Deliver

log = logging.getLogger(__name__)

# signals waiting to be sent are merged per stream, so this bounds memory if Postgres is away
_MAX_PENDING = 100_000

# NOTIFYs of one process start at least this far apart (the module docstring says why)
MIN_NOTIFY_INTERVAL_SECONDS = 0.005


class ListenNotify:
    """The listening connection and the notifier, as two loops for the supervisor: each raises when its
    connection is lost, and is started again (``runtime.supervisor``). Never through a transaction
    pooler: LISTEN receives nothing there (``config`` sees to it)."""

    def __init__(
        self,
        dsn: str,
        sender: str,
        *,
        connecting: db.Connecting = db.DIRECT,
        keepalive_seconds: float = 5.0,
        application_name: str = "wfs-listen",
        min_interval: float = MIN_NOTIFY_INTERVAL_SECONDS,
    ) -> None:
        self._dsn = dsn
        self._sender = sender
        self._connecting = connecting
        self._keepalive = keepalive_seconds
        self._min_interval = min_interval
        self._application_name = application_name
        self.connected = asyncio.Event()
        # LISTEN connections made so far: every one after the first may have missed notifications
        self.connections = 0
        self._deliver: Deliver | None = None
        self._lost: Callable[[], None] | None = None
        self._pending: dict[tuple[str, str, str], Signal] = {}
        self._has_pending = asyncio.Event()
        self._open: set[asyncpg.Connection] = set()

    def loops(self, deliver: Deliver, lost: Callable[[], None]) -> dict[str, Callable[[], Awaitable[None]]]:
        self._deliver, self._lost = deliver, lost
        return {"listen": self._listen, "notify": self._notify}

    async def stop(self) -> None:
        for conn in list(self._open):
            conn.terminate()
        self._open.clear()
        self.connected.clear()

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

    async def _connect(self, application_name: str) -> asyncpg.Connection:
        conn = await db.connect(self._dsn, self._connecting, application_name)
        self._open.add(conn)
        return conn

    def _close(self, conn: asyncpg.Connection | None) -> None:
        if conn is not None:
            self._open.discard(conn)
            conn.terminate()

    async def _notify(self) -> None:
        loop = asyncio.get_running_loop()
        next_send = loop.time()
        conn: asyncpg.Connection | None = None
        try:
            while True:
                await self._has_pending.wait()
                if (wait := next_send - loop.time()) > 0:
                    await asyncio.sleep(wait)  # what queues meanwhile goes in the same payloads
                next_send = loop.time() + self._min_interval
                self._has_pending.clear()
                batch, self._pending = self._pending, {}
                try:
                    if conn is None:
                        conn = await self._connect(self._application_name + "-notify")
                    with db.deadline(conn, loop.time() + self._connecting.timeout_seconds):
                        await notify.send(conn, batch.values(), self._sender)
                except BaseException:
                    self.send(batch.values())  # merged with anything newer, for the next run to send
                    raise
        finally:
            self._close(conn)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            sender, signals = decode(payload, unless_from=self._sender)
        except MalformedPayload as exc:
            log.warning("ignoring a notification: %s", exc)
            return
        if sender != self._sender and self._deliver is not None:  # our own were delivered at publish
            self._deliver(signals)

    async def _listen(self) -> None:
        conn: asyncpg.Connection | None = None
        try:
            conn = await self._connect(self._application_name)
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _conn: lost.set())
            await conn.add_listener(CHANNEL, self._on_notify)
            self.connected.set()
            self.connections += 1
            if self.connections > 1:
                log.info("LISTEN connection re-established; waking all watchers to re-read")
                if self._lost is not None:
                    self._lost()  # notifications sent while we were away are gone
            loop = asyncio.get_running_loop()
            while not lost.is_set():
                try:
                    await asyncio.wait_for(lost.wait(), self._keepalive)
                    break
                except TimeoutError:
                    pass
                # a silent network loss shows up only when we ask
                with db.deadline(conn, loop.time() + self._keepalive):
                    await conn.fetchval("SELECT 1")
            raise ConnectionError("LISTEN connection terminated")
        finally:
            self.connected.clear()
            self._close(conn)
