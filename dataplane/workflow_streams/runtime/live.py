"""The live-read engine: how a connection follows a stream, whatever protocol frames it.

Order of operations, which is what makes it exact: the wake watch is registered (``Live.watch``), then
the backfill is read (``first_page``), then the stream is followed (``follow``). Every wake re-reads
Postgres after the last sequence delivered; a wake is never the data. A connection is never given a
record twice (boundary duplicates are dropped), and a wake that announces records beyond the next one
means signals were missed: the re-read fills the gap from Postgres and the evidence is kept.

A connection is a ``Sink`` (its socket: a write now if the socket takes it, or an awaited write under
the stall watch) and an ``Encoder`` (its protocol's framing: our API's events, or the Durable Streams
protocol's). While it is caught up, its stream's fan-out (``runtime.fanout``) writes to it with every
other follower of the stream; when the fan-out cannot, its own task goes on here. Memory per connection
is one page plus its socket's buffer, and a reader that stops taking bytes is cut off (``StallWatch``),
never buffered: it resumes from the last position it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import NamedTuple, Protocol, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from ..adapters import metrics
from ..domain.authz import Access
from ..domain.errors import StreamError, StreamNotFound, TooManySubscriptions
from ..store import db, gaps, streams
from ..store.bodies import Body, Form, Plan
from ..store.db import DB_UNAVAILABLE
from .durability import Durability
from .fanout import Fanout
from .reads import ENDS_A_PAGE, SharedPage, SharedReads, plan_read, planned_bodies, read_page
from .retries import BACKOFF
from .supervisor import Supervisor
from .wakes import Wake, WakeHub

log = logging.getLogger(__name__)

R = TypeVar("R")

# Records per read of a follower's fan-out: a live page is what one wake brought, rarely more. A reader
# further behind than this reads catch-up bodies (store.bodies) of up to CATCH_UP_BYTES instead.
FOLLOW_PAGE = 500
CATCH_UP_RECORDS = 100_000
CATCH_UP_BYTES = 4 * 1024 * 1024
# A connection whose pending write has not finished within this time is cut off; it resumes from the
# last position it was given (Last-Event-ID, or the protocol's offset). Read each round, so a test can
# shorten it.
WRITE_TIMEOUT_SECONDS = 30.0


class Delivery(NamedTuple):
    """What an encoder made of a page for one connection: the bytes, how many records they carry, and
    the connection's position after them."""

    chunk: bytes
    records: int
    last: int


class Encoder(Protocol):
    """A surface's framing of a page, for one connection (it may keep per-connection state, such as the
    protocol's cursor). Encodings shared by every connection go in ``SharedPage.memo``."""

    heartbeat: bytes
    # the form a catch-up body of this surface is assembled in (store.bodies)
    form: Form

    def body(self, body: Body, last: int) -> Delivery:
        """A catch-up body's records, all in one write (one part of a page, as it is read)."""

    def start(self, shared: SharedPage, last: int) -> Delivery:
        """The first bytes of the response: the backfill after ``last``, and what the protocol says first."""

    def events(self, shared: SharedPage, last: int) -> Delivery:
        """The records after ``last`` (maybe a prefix of them: a budget), or an empty delivery."""

    def closed(self, last: int) -> bytes:
        """What ends the response of a closed stream whose every record was delivered (may be empty)."""

    def error(self, exc: StreamError) -> bytes:
        """Why the response ends early (may be empty)."""


class Sink(Protocol):
    """A connection's socket as the engine writes to it."""

    @property
    def can_offer(self) -> bool:
        """Whether the fan-out may write to it with ``offer``."""

    def offer(self, chunk: bytes) -> bool:
        """Write ``chunk`` now if the socket takes it without waiting; False if it cannot."""

    async def send(self, chunk: bytes) -> None:
        """Write ``chunk``, waiting for the socket under the stall watch: ``TimeoutError`` once cut off,
        ``ConnectionResetError`` once the client has gone."""

    def abort(self) -> None:
        """Drop the connection and whatever it still buffers."""


class Stallable(Protocol):
    def cut_off(self) -> None:
        """Abort the connection: its waiting write returns and its task ends."""


class StallWatch:
    """One watchdog for every connection's pending writes. No timer per write (on Python 3.11
    ``wait_for`` costs a task per call, and a fan-out to 1,000 subscribers makes thousands of writes a
    second): writes that wait for their socket are noted here, and those waiting too long are cut off.
    Only writes in progress are looked at: 10,000 connections are mostly idle or written to by the
    fan-out's ``offer``, which never waits."""

    def __init__(self) -> None:
        self._writing: dict[Stallable, float] = {}

    def begin(self, sink: Stallable) -> None:
        self._writing[sink] = time.monotonic()

    def end(self, sink: Stallable) -> None:
        self._writing.pop(sink, None)

    async def run(self) -> None:
        while True:
            timeout = WRITE_TIMEOUT_SECONDS
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for sink, started in list(self._writing.items()):
                if now - started > timeout:
                    del self._writing[sink]
                    sink.cut_off()


class Slots:
    """Open live connections per principal on this replica, both surfaces together, bounded so that one
    caller cannot exhaust the replica."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()

    @contextlib.contextmanager
    def hold(self, principal: str) -> Iterator[None]:
        if self._open[principal] >= self.limit:
            raise TooManySubscriptions(f"at most {self.limit} open subscriptions per principal", limit=self.limit)
        self._open[principal] += 1
        metrics.SUBSCRIPTIONS_OPEN.inc()
        try:
            yield
        finally:
            metrics.SUBSCRIPTIONS_OPEN.dec()
            self._open[principal] -= 1
            if not self._open[principal]:
                del self._open[principal]


class _Follower:
    """A connection as a follower of its stream's fan-out (``runtime.fanout.Follower``)."""

    __slots__ = ("_encoder", "_sink", "detached", "last", "pins_digest")

    def __init__(self, sink: Sink, encoder: Encoder, last: int, pins_digest: str) -> None:
        self._sink = sink
        self._encoder = encoder
        self.last = last
        self.pins_digest = pins_digest
        self.detached = asyncio.Event()

    def offer(self, shared: SharedPage) -> bool:
        delivery = self._encoder.events(shared, self.last)
        if not delivery.chunk:
            return True
        if not self._sink.offer(delivery.chunk):
            return False
        self.last = delivery.last
        metrics.SUBSCRIPTION_EVENTS.inc(delivery.records)
        return True

    def detach(self) -> None:
        self.detached.set()


class Live:
    """This process's live reads: the shared reads, the fan-outs, the stall watch and the slots."""

    def __init__(
        self,
        pool: db.Pool,
        hub: WakeHub,
        durability: Durability,
        reads: SharedReads,
        supervisor: Supervisor,
        *,
        max_per_principal: int,
    ) -> None:
        self._pool = pool
        self._hub = hub
        self._durability = durability
        self._reads = reads
        self._gap_tasks: set[asyncio.Task[None]] = set()
        self.fanout = Fanout(hub, reads, FOLLOW_PAGE, self._report_gap, supervisor)
        self.stalls = StallWatch()
        self.slots = Slots(max_per_principal)
        supervisor.start("stall-watch", self.stalls.run)

    async def close(self) -> None:
        await self.fanout.close()

    @contextlib.asynccontextmanager
    async def watch(self, principal: str, run_id: str, stream_id: str) -> AsyncIterator[Wake]:
        """A live connection's slot and its wake watch, taken before anything is read."""
        with self.slots.hold(principal):
            async with self._hub.watch_records(run_id, stream_id) as wake:
                yield wake

    async def first_page(
        self,
        run_id: str,
        stream_id: str,
        after: int,
        limit: int,
        access: Access,
    ) -> SharedPage:
        """The backfill, shared with connections at the same cursor (a burst of connections is one read
        per stream), then authorized for this caller. A read that fails is repeated unshared with the
        caller's rights checked first, so a caller without rights learns nothing, not even whether its
        cursor is valid. Call it inside ``watch``."""
        try:
            # join no read older than the watch: a commit announced before the watch existed would never
            # be signalled to it, so the read must have started after it (runtime/reads.py)
            shared = await self._reads.page(run_id, stream_id, after, limit, self._hub.clock)
        except StreamError:
            await read_page(
                self._pool,
                self._durability,
                run_id,
                stream_id,
                after,
                limit,
                access=access,
            )
            raise  # not reached unless the stream changed between the two reads
        # what a read checks first, checked here on the shared page's pins
        streams.authorize(shared.page.pins, access)
        return shared

    async def next_page(
        self, wake: Wake, run_id: str, stream_id: str, after: int, limit: int, until: float
    ) -> SharedPage:
        """A long poll: the records after ``after`` once there are some (or the stream is closed), else
        the empty page read last when the loop's clock reaches ``until``. Call it inside ``watch``, after
        the caller was authorized on this stream."""
        loop = asyncio.get_running_loop()
        woken_at = self._hub.clock
        while True:
            wake.cursor = after  # the head poller wakes it only when the stream moves past this
            shared = await self._reads.page(run_id, stream_id, after, limit, woken_at)
            page = shared.page
            remaining = until - loop.time()
            if page.records or page.closed or remaining <= 0 or not await wake.wait(remaining):
                return shared
            wake.clear()
            woken_at = self._hub.generation(run_id, stream_id)

    async def follow(
        self,
        sink: Sink,
        encoder: Encoder,
        run_id: str,
        stream_id: str,
        wake: Wake,
        shared: SharedPage,
        backfill: Delivery,
        *,
        limit: int,
        ends_at: float,
        heartbeat: float,
    ) -> int:
        """Follow the stream after ``backfill`` (the first page's delivery, already written) until it
        closes, fails, the client goes, or the loop's clock reaches ``ends_at``, when the client
        resumes (maybe on another replica). Returns the last position given."""
        pins_digest = shared.page.pins_digest
        last = backfill.last
        latest, closed = shared.page.bounds.latest, shared.page.closed
        if backfill.records:
            metrics.SUBSCRIPTION_EVENTS.inc(backfill.records)
        try:
            try:
                while True:
                    wake.cursor = last
                    if last >= latest:  # caught up: follow
                        if closed:
                            await _send(sink, encoder.closed(last))
                            return last
                        if sink.can_offer:
                            follower = _Follower(sink, encoder, last, pins_digest)
                            still_open = await self._with_fanout(
                                follower, sink, encoder.heartbeat, run_id, stream_id, wake, ends_at, heartbeat
                            )
                            last = follower.last
                            if not still_open:
                                return last
                        else:
                            if not await _await_news(sink, encoder, wake, ends_at, heartbeat):
                                return last
                            self._note_gap(run_id, stream_id, wake, last)
                    # clear, then take the generation: a signal after this point sets the flag again
                    wake.clear()
                    woken_at = self._hub.generation(run_id, stream_id)
                    if latest - last > FOLLOW_PAGE:
                        # far behind: the records in their wire form, assembled by Postgres for this
                        # reader alone (no shared page would serve anyone else), in large pages written
                        # part by part as they are read
                        page = await self._retrying(
                            sink,
                            functools.partial(
                                plan_read,
                                self._pool,
                                self._durability,
                                run_id,
                                stream_id,
                                last,
                                encoder.form,
                                max_records=CATCH_UP_RECORDS,
                                max_bytes=CATCH_UP_BYTES,
                            ),
                        )
                        _same_stream(page.pins_digest, pins_digest)
                        latest, closed = page.bounds.latest, page.closed
                        last = await self._write_parts(sink, encoder, page, last)
                        continue
                    shared = await self._retrying(
                        sink, functools.partial(self._reads.page, run_id, stream_id, last, limit, woken_at)
                    )
                    _same_stream(shared.page.pins_digest, pins_digest)
                    delivery = encoder.events(shared, last)
                    latest, closed = shared.page.bounds.latest, shared.page.closed
                    await _send(sink, delivery.chunk)
                    metrics.SUBSCRIPTION_EVENTS.inc(delivery.records)
                    last = delivery.last
            except StreamError as exc:
                # e.g. retention pruned past a lagging reader: say why in-band, then end
                await _send(sink, encoder.error(exc))
        except ConnectionResetError:
            log.info("reader of %s/%s left at sequence %d", run_id, stream_id, last)
        except TimeoutError:
            log.info("reader of %s/%s too slow at sequence %d: disconnected", run_id, stream_id, last)
            sink.abort()  # drop what is buffered: it resumes from its last position
        return last

    async def _with_fanout(
        self,
        follower: _Follower,
        sink: Sink,
        heartbeat_bytes: bytes,
        run_id: str,
        stream_id: str,
        wake: Wake,
        ends_at: float,
        heartbeat: float,
    ) -> bool:
        """Let the stream's fan-out write to this connection until it lets go, with heartbeats meanwhile.
        True once it let go, False when the connection's time is up."""
        self.fanout.join(run_id, stream_id, follower)
        wake.dormant = True  # the fan-out watches for it; it re-reads after the fan-out lets go
        try:
            loop = asyncio.get_running_loop()
            while True:
                remaining = ends_at - loop.time()
                if remaining <= 0:
                    return False
                try:
                    async with asyncio.timeout(min(heartbeat, remaining)):
                        await follower.detached.wait()
                    return True
                except TimeoutError:
                    await sink.send(heartbeat_bytes)
        finally:
            wake.dormant = False
            self.fanout.leave(run_id, stream_id, follower)

    async def _write_parts(self, sink: Sink, encoder: Encoder, page: Plan, last: int) -> int:
        """Write a planned catch-up page part by part as its parts are read (``planned_bodies``); the last
        position given. Records pruned or the database lost end the page early, before its first part too:
        what was written stands, and the next round reads on from there (planning again says why, or waits
        the outage out)."""
        try:
            async with contextlib.aclosing(planned_bodies(self._pool, page, encoder.form)) as each:
                async for body in each:
                    delivery = encoder.body(body, last)
                    await _send(sink, delivery.chunk)
                    metrics.SUBSCRIPTION_EVENTS.inc(delivery.records)
                    last = delivery.last
        except ENDS_A_PAGE as exc:  # its first part: nothing of it was written
            log.info("catch-up page after %d not read (%r); reading on", last, exc)
        return last

    async def _retrying(self, sink: Sink, read: Callable[[], Awaitable[R]]) -> R:
        """A read of a page or body, with Postgres restarts waited out and a comment line before each
        wait, so that proxies keep the connection."""

        async def waiting(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            delay = state.next_action.sleep if state.next_action is not None else 0.0
            log.warning("live read failed (%s); retrying in %.1fs", exc, delay)
            await sink.send(b": database unavailable, retrying\n\n")

        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(DB_UNAVAILABLE), wait=BACKOFF, before_sleep=waiting, reraise=True
        ):
            with attempt:
                result = await read()
        return result

    def _note_gap(self, run_id: str, stream_id: str, wake: Wake, last: int) -> None:
        first = wake.first_announced
        if first is not None and first > last + 1:
            self._report_gap(run_id, stream_id, last + 1, first)

    def _report_gap(self, run_id: str, stream_id: str, expected: int, observed: int) -> None:
        """Gap evidence is kept in the background: the re-read already fills the gap."""
        task = asyncio.create_task(self._record_gap(run_id, stream_id, expected, observed))
        self._gap_tasks.add(task)
        task.add_done_callback(self._gap_tasks.discard)

    async def _record_gap(self, run_id: str, stream_id: str, expected: int, observed: int) -> None:
        """A database that is away costs the evidence, never the connection."""
        try:
            async with self._pool.acquire() as conn:
                await gaps.record_gap(conn, run_id, stream_id, expected, observed, detected_by="sse")
        except DB_UNAVAILABLE as exc:
            log.warning("could not record gap evidence: %s", exc)


def _same_stream(digest: str, pins_digest: str) -> None:
    """The first read authorized this connection; pins never change, so only a stream made again under
    its name (another digest) ends it."""
    if digest != pins_digest:
        raise StreamNotFound("the stream was deleted and created again")


async def _send(sink: Sink, chunk: bytes) -> None:
    if chunk:
        await sink.send(chunk)


async def _await_news(sink: Sink, encoder: Encoder, wake: Wake, ends_at: float, heartbeat: float) -> bool:
    """Wait for a wake, writing heartbeats while idle. False once the connection's time is up."""
    loop = asyncio.get_running_loop()
    while True:
        remaining = ends_at - loop.time()
        if remaining <= 0:
            return False
        if await wake.wait(min(heartbeat, remaining)):
            return True
        await sink.send(encoder.heartbeat)
