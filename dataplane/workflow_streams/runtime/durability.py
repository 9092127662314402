"""Serving only what is as durable as an acknowledged append.

An append is acknowledged when its COMMIT returns, and then it is as durable as replication makes a
commit (with a synchronous standby: on the standby too). Postgres can make a commit visible that is less
durable than that: a commit whose wait for the synchronous standby is cancelled stays committed on the
primary, and a primary's crash recovery replays commits the standby never received. A failover then
erases them, and their sequences go to other records: a reader served one would keep a record that no
longer exists and never see the one stored in its place. So nothing read is served before it is known
to be that durable.

WAL is a prefix: when a commit returns, everything before it in the WAL is as durable as it. A read is
therefore confirmed once a commit *sent after the read ended*, on the same WAL timeline, has returned:
every commit the read saw is earlier in that WAL. Under load this process's group commits are such
commits, for free; otherwise a barrier commit (``store.wal``) is made, one at a time for every read
waiting. The order of "read ended" and "commit sent" is exact: both are ticks of one counter in this
process, and a read's reply has arrived before a COMMIT sent later could have been received.

Timelines tell WAL histories apart (``store.wal``): a promoted standby starts a newer one. A commit on it
says nothing of what was read on the old primary, whose unreplicated commits are exactly what the failover
erases; and once a newer timeline has been seen, a read on an older one (a primary that was replaced and
still answers) is never served. Acknowledged commits of an older timeline are in the newer one, so what
is known durable stays known across a failover.

Most reads need no wait at all, because the sequences they return are already known durable: those
written by this process's commits that returned, those announced by other processes' signals (a signal
is sent only after its commit returned, and says on which timeline), and those of reads confirmed before
(a confirmed read confirms its stream's head as it saw it, so a catch-up reader paging through history
waits once, not per page).

A read not confirmed in time (the standby is away, so every commit waits) is served up to what is known
durable: the records beyond are held back, and its reader, still behind the head, reads again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type

from ..adapters import metrics
from ..domain.errors import StreamError
from ..domain.wakes import RECORDS, Signal
from ..store import wal
from ..store.bodies import Plan
from ..store.db import DB_UNAVAILABLE, Pool
from ..store.reads import Page
from .retries import BACKOFF

# what a read returns: records as rows (a live page) or in their wire form (a catch-up body)
Read = TypeVar("Read", Page, Plan)

log = logging.getLogger(__name__)

StreamKey = tuple[str, str]


@dataclasses.dataclass
class _Waiter:
    read_at: int  # the tick at which the read ended
    timeline: str  # the timeline it ran on
    confirmed: asyncio.Future[bool]  # True once confirmed, False if it never can be


class Durability:
    """What this process knows to be durable, and the barrier commits that confirm reads."""

    # streams whose durable head is remembered (the first told are forgotten first; a forgotten stream
    # costs its next read a wait, never a record)
    MAX_STREAMS = 100_000

    def __init__(self, pool: Pool, *, slot: int | None = None) -> None:
        self._pool = pool
        self._slot = random.randrange(wal.SLOTS) if slot is None else slot
        self._ticks = 0
        # the newest WAL timeline seen (timelines are fixed-width hex: they compare as strings)
        self._timeline = ""
        # per timeline, the tick at which the latest commit known to have returned was sent
        self._confirmed: dict[str, int] = {}
        self._waiters: list[_Waiter] = []
        self._barrier: asyncio.Task[None] | None = None
        # per stream, the highest sequence known durable
        self._through: dict[StreamKey, int] = {}

    def tick(self) -> int:
        """A point in this process's order of events: take it when a read's reply has arrived, and just
        before a COMMIT is sent."""
        self._ticks += 1
        return self._ticks

    def _see(self, timeline: str) -> None:
        """A statement ran on ``timeline``: if it is newer than any before, reads on older ones can never
        be confirmed."""
        if timeline <= self._timeline:
            return
        self._timeline = timeline
        for waiter in self._waiters:
            if waiter.timeline < timeline and not waiter.confirmed.done():
                waiter.confirmed.set_result(False)

    def commit_returned(self, sent_at: int, timeline: str) -> None:
        """A commit sent at tick ``sent_at`` returned, on ``timeline``: every read on that timeline that
        ended before it is confirmed."""
        self._see(timeline)
        if sent_at <= self._confirmed.get(timeline, 0):
            return
        self._confirmed[timeline] = sent_at
        for waiter in self._waiters:
            if waiter.timeline == timeline and waiter.read_at < sent_at and not waiter.confirmed.done():
                waiter.confirmed.set_result(True)
        self._waiters = [waiter for waiter in self._waiters if not waiter.confirmed.done()]

    def known(self, run_id: str, stream_id: str) -> int:
        """The highest sequence of the stream known durable (0: nothing known)."""
        return self._through.get((run_id, stream_id), 0)

    def note(self, run_id: str, stream_id: str, through: int, timeline: str) -> None:
        """Sequences up to ``through`` of the stream are durable, as committed on ``timeline``."""
        if timeline > self._timeline:
            self._see(timeline)
        key = (run_id, stream_id)
        if through > self._through.get(key, 0):
            self._through[key] = through
            if len(self._through) > self.MAX_STREAMS:  # the first told goes first
                del self._through[next(iter(self._through))]

    def forget(self, run_id: str, stream_id: str) -> None:
        """The stream is gone (or was seen behind what was known: made again): nothing is known of it."""
        self._through.pop((run_id, stream_id), None)

    def note_written(self, written: Mapping[StreamKey, tuple[int, int, bool]], timeline: str) -> None:
        """A commit that returned on ``timeline`` wrote these streams' sequences (first, last, is input)."""
        if timeline > self._timeline:
            self._see(timeline)
        through = self._through
        for key, (_first, last, _is_input) in written.items():
            if last > through.get(key, 0):
                through[key] = last
        while len(through) > self.MAX_STREAMS:  # the first told go first
            del through[next(iter(through))]

    def note_signals(self, signals: Iterable[Signal]) -> None:
        """Record signals are published only after their commit returned: what those that name their
        timeline announce is durable (the others only wake)."""
        for kind, run_id, stream_id, _first, last, timeline in signals:  # every commit publishes: kept cheap
            if kind == RECORDS and timeline and last > 0:
                self.note(run_id, stream_id, last, timeline)

    async def confirm(self, read_at: int, timeline: str, until: float) -> bool:
        """Wait until a commit sent after tick ``read_at`` has returned on ``timeline``; False if loop time
        ``until`` passes first, or once a newer timeline is seen."""
        self._see(timeline)
        if timeline < self._timeline:
            return False
        if read_at < self._confirmed.get(timeline, 0):
            return True
        waiter = _Waiter(read_at, timeline, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        if self._barrier is None or self._barrier.done():
            self._barrier = asyncio.create_task(self._barriers(), name="wfs-durability-barrier")
        metrics.DURABILITY_WAITS.inc()
        try:
            async with asyncio.timeout_at(until):
                return await waiter.confirmed
        except TimeoutError:
            return False
        finally:
            if not waiter.confirmed.done():
                waiter.confirmed.cancel()

    async def covers(
        self, run_id: str, stream_id: str, through: int, read_at: int, timeline: str, until: float
    ) -> bool:
        """Whether sequences up to ``through`` of the stream, read at tick ``read_at`` on ``timeline``, may
        be served (for readers of rows other than pages: the dispatcher's outbox)."""
        self._see(timeline)
        if timeline == self._timeline and through <= self.known(run_id, stream_id):
            return True
        if not await self.confirm(read_at, timeline, until):
            return False
        self.note(run_id, stream_id, through, timeline)
        return True

    def unconfirmed(self, pages: Sequence[tuple[StreamKey, Read | StreamError]]) -> bool:
        """Whether any of ``pages`` holds a record not yet known durable."""
        return any(self._needs(key, page) for key, page in pages if not isinstance(page, StreamError))

    async def confirmed(
        self, pages: Sequence[tuple[StreamKey, Read | StreamError]], read_at: int, until: float
    ) -> list[Read | StreamError]:
        """``pages`` (or the errors read instead), read together (one statement) and ended at tick
        ``read_at``, as they may be served: whole once confirmed, else each only up to what is known
        durable of its stream. An error is what it was: the stream's row said so, not its records."""
        if not self.unconfirmed(pages):
            return [page for _, page in pages]
        timeline = next(page.timeline for _, page in pages if not isinstance(page, StreamError))
        if await self.confirm(read_at, timeline, until):
            for (run_id, stream_id), page in pages:
                if not isinstance(page, StreamError):
                    self.note(run_id, stream_id, page.bounds.latest, timeline)
            return [page for _, page in pages]
        return [
            self._prefix(key, page) if not isinstance(page, StreamError) and self._needs(key, page) else page
            for key, page in pages
        ]

    def _needs(self, key: StreamKey, page: Page | Plan) -> bool:
        self._see(page.timeline)
        if page.timeline < self._timeline:
            return page.last_sequence is not None  # read on a replaced primary: nothing of it is known
        known = self._through.get(key, 0)
        if page.bounds.latest < known:
            # sequences never go back within a stream: this one was made again under the same name
            self.forget(*key)
            known = 0
        last = page.last_sequence
        return last is not None and last > known

    def _prefix(self, key: StreamKey, page: Read) -> Read:
        """What of ``page`` may be served unconfirmed: what is known durable, and nothing of a read on a
        replaced primary (its sequences may hold other records now)."""
        known = self.known(*key) if page.timeline == self._timeline else 0
        served, held = page.held_back(known)
        metrics.DURABILITY_HELD_BACK.inc(held)
        log.warning("%s/%s: %d records read but not confirmed durable in time; held back", *key, held)
        return served

    async def _barriers(self) -> None:
        """Barrier commits, one after the other, while reads wait for one; a lost database is tried again
        (the waiting reads give up at their own deadlines)."""
        while self._waiters:
            async for attempt in AsyncRetrying(retry=retry_if_exception_type(DB_UNAVAILABLE), wait=BACKOFF):
                with attempt:
                    self._waiters = [waiter for waiter in self._waiters if not waiter.confirmed.done()]
                    if not self._waiters:
                        return
                    async with self._pool.acquire() as conn:
                        sent_at = self.tick()
                        timeline = await wal.barrier(conn, self._slot)
                    metrics.DURABILITY_BARRIERS.inc()
                    self.commit_returned(sent_at, timeline)

    async def close(self) -> None:
        if self._barrier is not None:
            self._barrier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._barrier
