"""Wake signals from Postgres LISTEN: one connection per process, fanned out in memory.

A notification is only a hint that a stream may have news; whoever wakes re-reads Postgres.
NOTIFY is sent inside the appending transaction, so Postgres delivers it only after the commit.
After a reconnect every watcher is woken, since notifications sent while disconnected are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import asyncpg

log = logging.getLogger(__name__)

RECORDS = "wfs_records"
ACKS = "wfs_acks"
CHANNELS = (RECORDS, ACKS)

# identifiers are never empty, so this cannot collide with a real stream
_ANY = ""


def payload(run_id: str, stream_id: str, first: int = 0, last: int = 0) -> str:
    """Identifiers never contain '/', so the payload splits unambiguously."""
    return f"{run_id}/{stream_id}/{first}/{last}"


class Wake:
    """A level-triggered flag for one watcher: many notifications coalesce into one wake-up."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        # lowest first sequence announced since the last clear (0 = unknown: re-read everything)
        self.first_announced: int | None = None

    def signal(self, first: int) -> None:
        """``first``: the lowest sequence the notification announces (0: unknown, re-read all)."""
        if self.first_announced is None or first < self.first_announced:
            self.first_announced = first
        self._event.set()

    def clear(self) -> None:
        self._event.clear()
        self.first_announced = None

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, seconds: float) -> bool:
        """True if woken, False if ``seconds`` passed first."""
        try:
            async with asyncio.timeout(seconds):
                await self._event.wait()
        except TimeoutError:
            return False
        return True


class WakeHub:
    def __init__(self, dsn: str, keepalive_seconds: float = 5.0, application_name: str = "wfs-listen") -> None:
        self._dsn = dsn
        self._application_name = application_name
        self._keepalive = keepalive_seconds
        self._watchers: dict[tuple[str, str, str], set[Wake]] = {}
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self.connected = asyncio.Event()
        self.reconnects = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="wfs-wake-hub")
        # a first connection failure is reported at start-up rather than hidden in the loop
        await asyncio.wait_for(self.connected.wait(), timeout=30)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()

    @contextlib.contextmanager
    def watch(self, channel: str, run_id: str, stream_id: str) -> Iterator[Wake]:
        """Register before reading Postgres, so nothing committed after the read goes unnoticed."""
        key = (channel, run_id, stream_id)
        wake = Wake()
        self._watchers.setdefault(key, set()).add(wake)
        try:
            yield wake
        finally:
            watchers = self._watchers.get(key)
            if watchers is not None:
                watchers.discard(wake)
                if not watchers:
                    del self._watchers[key]

    @contextlib.contextmanager
    def watch_channel(self, channel: str) -> Iterator[Wake]:
        """Woken by every notification on ``channel``, whatever the stream (for workers)."""
        with self.watch(channel, _ANY, _ANY) as wake:
            yield wake

    def _on_notify(self, _conn: object, _pid: int, channel: str, message: str) -> None:
        try:
            run_id, stream_id, first, last = message.split("/")
            first_seq, _last_seq = int(first), int(last)  # both must parse: malformed otherwise
        except ValueError:
            log.warning("ignoring malformed notification on %s", channel)
            return
        for key in ((channel, run_id, stream_id), (channel, _ANY, _ANY)):
            for wake in self._watchers.get(key, ()):
                wake.signal(first_seq)

    def _wake_everyone(self) -> None:
        for watchers in self._watchers.values():
            for wake in watchers:
                wake.signal(0)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                conn = await asyncpg.connect(self._dsn, server_settings={"application_name": self._application_name})
                self._conn = conn
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                for channel in CHANNELS:
                    await conn.add_listener(channel, self._on_notify)
                self.connected.set()
                if self.reconnects:
                    log.info("LISTEN connection re-established; waking all watchers to re-read")
                self._wake_everyone()
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
            except (
                OSError,
                ConnectionError,
                asyncpg.PostgresError,
                asyncpg.InterfaceError,
                TimeoutError,
            ) as exc:
                self.connected.clear()
                self.reconnects += 1
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, backoff)
                if self._conn is not None:
                    self._conn.terminate()
                    self._conn = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
