"""Live fan-out: one task per followed stream reads each wake once and writes the same bytes to every
follower's socket, with no task switch per follower.

Why: with a task per subscriber, a record on a stream with many subscribers would wake as many tasks,
each joining the shared read and writing on its own, and the event loop's scheduling of them
(``call_soon``, ``Handle._run``, ``shield``) costs more than the socket writes themselves (figures:
bench/README.md, constants). Here the stream's task takes the read (after the wake, so never older than
it: see ``runtime/reads.py``), and hands each follower the page, which its surface encodes once for all
of them (``SharedPage.memo``), with a write that cannot wait.

A follower the fan-out cannot serve at once — its socket is backed up, the stream closed or was replaced,
a read failed — is *detached*: its own task takes over from the last sequence it was given, with the
ordinary read/write path (bounded writes, retries, error events). Nothing is lost or repeated at the
handover because the fan-out advances a follower's ``last`` only for bytes it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from ..domain.errors import StreamError
from .reads import SharedPage, SharedReads
from .supervisor import Supervisor
from .wakes import Wake, WakeHub

log = logging.getLogger(__name__)

# an idle stream's task wakes this often only to notice it has no followers left (it is also cancelled)
_IDLE_SECONDS = 60.0


class Follower(Protocol):
    """A live subscriber as the fan-out sees it."""

    # the last sequence written to it; the fan-out advances it only for bytes it wrote
    last: int
    # the stream incarnation it authorized against: a replaced stream is not its stream
    pins_digest: str

    def offer(self, shared: SharedPage) -> bool:
        """Write the page's records after ``last`` (encoded by the follower's surface, once per page for
        all its followers: ``SharedPage.memo``) now if the connection takes them without waiting, and
        advance ``last``; False if it cannot."""

    def detach(self) -> None:
        """The fan-out no longer serves this follower; its own task continues from ``last``."""


GapRecorder = Callable[[str, str, int, int], None]


class _StreamFanout:
    """The followers of one stream and the task that serves them."""

    def __init__(
        self,
        hub: WakeHub,
        reads: SharedReads,
        run_id: str,
        stream_id: str,
        limit: int,
        on_gap: GapRecorder,
        supervisor: Supervisor,
    ) -> None:
        self._hub = hub
        self._supervisor = supervisor
        self._reads = reads
        self.run_id = run_id
        self.stream_id = stream_id
        self._limit = limit
        self._on_gap = on_gap
        self.followers: set[Follower] = set()
        self._wake: Wake | None = None  # set once the task watches the stream
        # the stream's head as of the latest read: a joiner at or past it needs no read of its own
        self._head = 0
        self.task = asyncio.create_task(self._serve(), name=f"wfs-fanout {run_id}/{stream_id}")

    def add(self, follower: Follower) -> None:
        self.followers.add(follower)
        # behind what the task has read (a commit between its own read and joining, whose wake the task
        # already took): read again. At or past it, the task's next wake covers it; a connection burst
        # of many subscribers per stream then costs no read per subscriber.
        if self._wake is not None and follower.last < self._head:
            self._wake.signal(0)

    async def _serve(self) -> None:
        try:
            await self._follow()
        except Exception as exc:  # a bug: its followers go on alone, and the next joiner starts another
            self._supervisor.report(f"fanout {self.run_id}/{self.stream_id}", exc)
        finally:
            # ended for any reason (last follower left, shutdown, a bug): nobody is left waiting on us
            self._detach_all()

    async def _follow(self) -> None:
        async with self._hub.watch_records(self.run_id, self.stream_id) as wake:
            self._wake = wake
            wake.signal(0)  # the first read, for the followers that joined before we started
            while self.followers:
                if not await wake.wait(_IDLE_SECONDS):
                    continue
                first_announced = wake.first_announced
                # clear, then take the generation: a signal after this point is a new wake
                wake.clear()
                woken_at = self._hub.generation(self.run_id, self.stream_id)
                low = min(f.last for f in self.followers)
                if first_announced is not None and first_announced > low + 1:
                    self._on_gap(self.run_id, self.stream_id, low + 1, first_announced)
                try:
                    shared = await self._reads.page(self.run_id, self.stream_id, low, self._limit, woken_at)
                except Exception as exc:
                    # each follower's own task re-reads and says why (an error event) or retries
                    level = logging.DEBUG if isinstance(exc, StreamError) else logging.WARNING
                    log.log(level, "fan-out read of %s/%s failed (%s)", self.run_id, self.stream_id, exc)
                    self._detach_all()
                    continue
                latest = shared.page.bounds.latest
                self._head = max(self._head, latest)
                behind = self._write(shared, low)
                if self.followers:
                    wake.cursor = min(f.last for f in self.followers)
                    if behind or wake.cursor < latest:
                        # a follower this read did not cover, or one given less than the page's stream
                        # holds (a full page, or an encoder's byte budget): read again at once
                        wake.signal(0)

    def _write(self, shared: SharedPage, low: int) -> bool:
        """Offer each follower its part of the page; True if a follower joined behind the page's start
        while it was read (it needs another read: writing from the page would skip records)."""
        page = shared.page
        behind = False
        for follower in list(self.followers):
            if follower.last < low:
                behind = True
                continue
            if page.closed or page.pins_digest != follower.pins_digest:
                self._detach(follower)  # its own task writes the close event or the error
                continue
            if not follower.offer(shared):
                self._detach(follower)  # a backed-up socket: its own task writes, bounded in time
        return behind

    def _detach(self, follower: Follower) -> None:
        self.followers.discard(follower)
        follower.detach()

    def _detach_all(self) -> None:
        for follower in list(self.followers):
            self._detach(follower)


class Fanout:
    """The fan-outs of this process, one per followed stream, started and ended with their followers."""

    def __init__(
        self, hub: WakeHub, reads: SharedReads, limit: int, on_gap: GapRecorder, supervisor: Supervisor
    ) -> None:
        self._hub = hub
        self._reads = reads
        self._limit = limit
        self._on_gap = on_gap
        self._supervisor = supervisor
        self._streams: dict[tuple[str, str], _StreamFanout] = {}

    def join(self, run_id: str, stream_id: str, follower: Follower) -> None:
        key = (run_id, stream_id)
        fanout = self._streams.get(key)
        if fanout is None or fanout.task.done():
            fanout = self._streams[key] = _StreamFanout(
                self._hub, self._reads, run_id, stream_id, self._limit, self._on_gap, self._supervisor
            )
        fanout.add(follower)

    def leave(self, run_id: str, stream_id: str, follower: Follower) -> None:
        """Stop serving ``follower`` (idempotent); the last one out ends the stream's task."""
        key = (run_id, stream_id)
        fanout = self._streams.get(key)
        if fanout is None:
            return
        fanout.followers.discard(follower)
        if not fanout.followers:
            del self._streams[key]
            fanout.task.cancel()

    async def close(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        for fanout in streams:
            fanout._detach_all()
            fanout.task.cancel()
        for fanout in streams:
            with contextlib.suppress(asyncio.CancelledError):
                await fanout.task
