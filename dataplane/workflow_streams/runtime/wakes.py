"""Waking what waits in this process: subscribers, blocked producers, the dispatcher.

Signals come from three places, and all of them only say "re-read Postgres":

- this process, right after one of its commits returns (``WakeHub.publish``): local watchers wake at
  once, and the wake source passes the signals on to other processes (those of records only for
  streams some process has marked as watched: ``runtime.interest``);
- other processes, through the wake source (LISTEN/NOTIFY, or nothing in poll-only mode);
- the head poller, which every ``poll_seconds`` asks Postgres for the heads of the streams watched here
  and wakes any watcher behind its stream's head. A process can die between its commit and its NOTIFY,
  and poll-only mode (PgBouncer in transaction pooling, where LISTEN does not work) has no NOTIFY at
  all: a lost signal costs latency, never a record.

Every signal delivered here ticks a clock, and each watched stream remembers the tick of its latest
signal (its *generation*). A read that starts at clock ``c`` sees every commit announced by signals up
to ``c``, which is how shared reads avoid handing a woken subscriber a read older than its wake
(``runtime.reads``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Protocol

from ..domain.wakes import ACKS, INPUTS, RECORDS, Signal
from ..store import heads
from ..store.db import Pool
from .durability import Durability
from .interest import Interest
from .supervisor import Supervisor

log = logging.getLogger(__name__)

__all__ = ["ACKS", "INPUTS", "RECORDS", "Signal", "Wake", "WakeHub", "WakeSource"]

# identifiers are never empty, so this cannot collide with a real stream
_ANY = ""


class Wake:
    """A level-triggered flag for one watcher: many signals coalesce into one wake-up."""

    __slots__ = ("_event", "cursor", "dormant", "first_announced")

    def __init__(self) -> None:
        self._event = asyncio.Event()
        # set while its owner is served by someone else (a subscription the stream's fan-out writes to):
        # the head poller leaves it alone; its owner re-reads when it wakes up again
        self.dormant = False
        # lowest first sequence announced since the last clear (0 = unknown: re-read everything)
        self.first_announced: int | None = None
        # the last sequence this watcher has seen; the head poller wakes it when its stream is ahead
        self.cursor: int | None = None

    def signal(self, first: int) -> None:
        """``first``: the lowest sequence the signal announces (0: unknown, re-read all)."""
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
        if self._event.is_set():
            return True
        try:
            async with asyncio.timeout(seconds):
                await self._event.wait()
        except TimeoutError:
            return False
        return True


class _Topic:
    """The watchers of one (kind, stream) and the clock tick of its latest signal."""

    __slots__ = ("generation", "watchers")

    def __init__(self) -> None:
        self.watchers: set[Wake] = set()
        self.generation = 0


Deliver = Callable[[list[Signal]], None]


class WakeSource(Protocol):
    """How signals travel between processes."""

    # set while signals from other processes can arrive (readiness)
    connected: asyncio.Event

    def loops(self, deliver: Deliver, lost: Callable[[], None]) -> dict[str, Callable[[], Awaitable[None]]]:
        """The source's background loops, by name, for the supervisor to run. ``deliver`` takes signals
        from other processes; ``lost`` is called when some may have been lost (a reconnect), so that
        every watcher re-reads."""

    async def stop(self) -> None:
        """Close what the loops left open (the supervisor has cancelled them)."""

    def send(self, signals: Iterable[Signal]) -> None:
        """Pass signals of commits that already returned on to other processes (never blocks)."""


class WakeHub:
    def __init__(
        self,
        source: WakeSource,
        pool: Pool | None,
        poll_seconds: float,
        *,
        interest: Interest | None = None,
        durability: Durability | None = None,
    ) -> None:
        """``interest`` marks the streams watched here for other processes' appenders (with a wake source
        that carries signals between processes; poll-only mode needs none). ``durability`` learns from
        other processes' signals: each is sent after its commit returned."""
        self.source = source
        self._pool = pool
        self._poll_seconds = poll_seconds
        self._interest = interest
        self._durability = durability
        self._topics: dict[tuple[str, str, str], _Topic] = {}
        # ticks once per signal delivered; only ever grows
        self.clock = 0

    @property
    def connected(self) -> asyncio.Event:
        return self.source.connected

    async def start(self, supervisor: Supervisor, connect_seconds: float = 30.0) -> None:
        """The source's loops and the head poller, under ``supervisor`` (all critical: live delivery
        needs them). Waits until the source is connected, so that a database unreachable at start-up is
        reported then (``TimeoutError``) rather than only in the log."""
        for name, loop in self.source.loops(self._deliver_remote, self.wake_everyone).items():
            supervisor.start(name, loop, critical=True)
        if self._pool is not None and self._poll_seconds > 0:
            supervisor.start("head-poller", self._poll_heads, critical=True)
        await asyncio.wait_for(self.connected.wait(), timeout=connect_seconds)

    async def stop(self) -> None:
        """After the supervisor has stopped the loops."""
        await self.source.stop()

    @contextlib.contextmanager
    def watch(self, kind: str, run_id: str, stream_id: str) -> Iterator[Wake]:
        """Register before reading Postgres, so nothing committed after the read goes unnoticed."""
        key = (kind, run_id, stream_id)
        topic = self._topics.get(key)
        if topic is None:
            topic = self._topics[key] = _Topic()
        wake = Wake()
        topic.watchers.add(wake)
        try:
            yield wake
        finally:
            topic.watchers.discard(wake)
            if not topic.watchers and self._topics.get(key) is topic:
                del self._topics[key]

    @contextlib.asynccontextmanager
    async def watch_records(self, run_id: str, stream_id: str) -> AsyncIterator[Wake]:
        """``watch`` for a stream's records, marked as watched here before it yields: enter it before
        reading Postgres, and appends in every process will announce what the read did not see."""
        with self.watch(RECORDS, run_id, stream_id) as wake:
            if self._interest is not None:
                await self._interest.ensure(run_id, stream_id)
            yield wake

    @contextlib.contextmanager
    def watch_kind(self, kind: str) -> Iterator[Wake]:
        """Woken by every signal of ``kind``, whatever the stream (for workers)."""
        with self.watch(kind, _ANY, _ANY) as wake:
            yield wake

    def generation(self, run_id: str, stream_id: str) -> int:
        """The clock tick of the latest record signal for a watched stream (a read started at or after
        it covers that signal's commit)."""
        topic = self._topics.get((RECORDS, run_id, stream_id))
        return topic.generation if topic is not None else 0

    def publish(self, signals: Iterable[Signal], remote: Iterable[Signal] | None = None) -> None:
        """After a commit returned: wake this process's watchers now, and tell the other processes
        ``remote`` (by default all of ``signals``)."""
        signals = list(signals)
        self._deliver(signals)
        self.source.send(signals if remote is None else remote)

    def _deliver_remote(self, signals: list[Signal]) -> None:
        """Signals from other processes: what they vouch for is durable (their commits returned)."""
        if self._durability is not None:
            self._durability.note_signals(signals)
        self._deliver(signals)

    def _deliver(self, signals: Iterable[Signal]) -> None:
        for signal in signals:
            # ticks for unwatched streams too: a read that started before this signal is older than
            # anyone who starts watching after it (see runtime.reads)
            self.clock += 1
            for key in (signal.key, (signal.kind, _ANY, _ANY)):
                topic = self._topics.get(key)
                if topic is not None:
                    topic.generation = self.clock
                    for wake in topic.watchers:
                        wake.signal(signal.first)

    def wake_everyone(self) -> None:
        """After signals may have been lost (a reconnect): everyone re-reads."""
        self._deliver([Signal(kind, run_id, stream_id) for kind, run_id, stream_id in self._topics if run_id != _ANY])
        for kind in {kind for kind, _, _ in self._topics}:
            self._deliver([Signal(kind, _ANY, _ANY)])

    async def _poll_heads(self) -> None:
        """Wake watchers whose stream moved past them without a signal reaching this process. A failed
        poll raises: the supervisor restarts the poller, and readiness fails until it runs again."""
        assert self._pool is not None
        while True:
            await asyncio.sleep(self._poll_seconds)
            if self._interest is not None:
                self._interest.renew((r, s) for kind, r, s in self._topics if kind == RECORDS and r != _ANY)
            keys = [
                (run, stream)
                for (kind, run, stream), topic in self._topics.items()
                if kind == RECORDS and run != _ANY and any(not w.dormant for w in topic.watchers)
            ]
            if not keys:
                continue
            async with self._pool.acquire() as conn:
                found = await heads.fetch(conn, keys)
            for run_id, stream_id in keys:
                topic = self._topics.get((RECORDS, run_id, stream_id))
                if topic is None:
                    continue
                head = found.get((run_id, stream_id))
                if head is None and self._interest is not None:
                    self._interest.forget(run_id, stream_id)  # deleted: a stream made again is unmarked
                # gone (deleted) or closed streams: watchers re-read and see why
                behind = [
                    w
                    for w in topic.watchers
                    if not w.dormant
                    and (head is None or head.closed or w.cursor is None or w.cursor < head.last_sequence)
                ]
                if behind:
                    self.clock += 1
                    topic.generation = self.clock
                    for wake in behind:
                        wake.signal(0 if wake.cursor is None else wake.cursor + 1)


class PollOnly:
    """No signals between processes: other processes' commits are found by the head poller alone."""

    def __init__(self) -> None:
        self.connected = asyncio.Event()

    def loops(self, deliver: Deliver, lost: Callable[[], None]) -> dict[str, Callable[[], Awaitable[None]]]:
        self.connected.set()
        return {}

    async def stop(self) -> None:
        self.connected.clear()

    def send(self, signals: Iterable[Signal]) -> None:
        pass


def process_id() -> str:
    """Names this process in wake payloads, so it can skip its own notifications."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
