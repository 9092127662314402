"""Live subscriptions over Server-Sent Events.

Order of operations, which is what makes this exact: register the wake watcher, then backfill from
Postgres, then follow. Every wake re-reads Postgres after the last delivered sequence; notification
payloads are never the data. Memory per subscriber is one page plus the socket buffer: a slow reader
holds back only its own reads, and one that stops reading is disconnected with a resumable id.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from .. import metrics
from ..domain.authz import Principal
from ..domain.cursor import parse_cursor
from ..domain.errors import InvalidInput, StreamError, StreamNotFound, TooManySubscriptions
from ..runtime import wakes
from ..runtime.reads import SharedPage, SharedReads
from ..runtime.retries import BACKOFF
from ..store import db, gaps, reads
from ..store.db import DB_UNAVAILABLE
from .common import STREAM, client_region_of, stream_key
from .state import STREAMING, principal_of, state_of

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

PAGE = 500
RECONNECT_MS = 1000
_RETRY = f"retry: {RECONNECT_MS}\n\n".encode()
# a client that does not take a page within this time is cut off; it resumes with Last-Event-ID
WRITE_TIMEOUT_SECONDS = 30.0
# the fan-out writes to a subscriber only while its socket's buffer stays under this; beyond it, the
# subscriber's own task writes (and a stall is cut off by the watchdog)
_OFFER_BUFFER_BYTES = 256 * 1024

# open subscriptions per principal name
SUBSCRIPTIONS = web.AppKey("workflow_streams_subscriptions", collections.Counter[str])
# handler tasks of open subscriptions, cancelled on shutdown
OPEN_STREAMS = web.AppKey("workflow_streams_open_sse", weakref.WeakSet[asyncio.Task[object]])
# the responses of open subscriptions in the middle of a write, watched for stalls
EVENT_STREAMS = web.AppKey("workflow_streams_event_streams", set["EventStream"])


def _resume_cursor(request: web.Request) -> int:
    """A browser's automatic reconnect sends Last-Event-ID, which wins over the original ?after."""
    last_event_id = request.headers.get("Last-Event-ID")
    if last_event_id is not None:
        return parse_cursor(last_event_id.strip(), "Last-Event-ID")
    return parse_cursor(request.query.get("after"))


class EventStream(web.StreamResponse):
    """A streaming response whose writes are watched: a reader that stops taking bytes is cut off, not
    buffered. No timer per write (on Python 3.11 ``wait_for`` costs a task per call, and a fan-out to
    1,000 subscribers makes thousands of writes a second): one watchdog per app (``cut_stalled``) looks
    at the writes still waiting for the socket and aborts the connections of those waiting too long."""

    write_started: float | None = None  # monotonic time the pending write began; None when idle
    stalled = False
    # the app's set of responses with a write in progress: what the watchdog looks at
    writing: set[EventStream] | None = None
    _transport: asyncio.Transport | None = None
    _chunked = False  # HTTP/1.1 chunked body: the fan-out may write framed chunks itself
    # aiohttp's switch (web.Response sets it so too): the headers wait for the first write, which
    # carries the retry line and the backfill (``_start_event_stream``), so a subscriber's start is one
    # socket write, not three; on loopback each write also runs the reader's side of TCP in the kernel.
    # ``offer`` writes to the transport itself, so it must never come first: it follows that write.
    _send_headers_immediately = False

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        self._transport = request.transport
        if request.version >= HttpVersion11:
            self.enable_chunked_encoding()
            self._chunked = True
        return await super().prepare(request)

    @property
    def can_offer(self) -> bool:
        return self._chunked and self._transport is not None

    def offer(self, chunk: bytes) -> bool:
        """Write ``chunk`` now, without waiting, if the socket takes it: True if written. This is the
        fan-out's write (runtime/fanout.py): no task, no timer. It frames the chunk as aiohttp's writer
        does for the chunked body it started (``enable_chunked_encoding`` in ``_start_event_stream``);
        the bytes go to the same transport in order with every other write of this response."""
        transport = self._transport
        if transport is None or self.stalled or transport.is_closing():
            return False
        if transport.get_write_buffer_size() + len(chunk) > _OFFER_BUFFER_BYTES:
            return False  # backed up: the subscriber's own task writes, with the stall watchdog
        transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
        return True

    async def send(self, chunk: bytes) -> None:
        if self.stalled:
            raise TimeoutError("subscriber stopped reading")
        self.write_started = time.monotonic()
        if self.writing is not None:
            self.writing.add(self)
        try:
            await self.write(chunk)  # returns at once unless the socket's buffers are full
        finally:
            self.write_started = None
            if self.writing is not None:
                self.writing.discard(self)
        if self.stalled:  # cut off while this write waited: what it buffered went with the connection
            raise TimeoutError("subscriber stopped reading")

    def cut_off(self) -> None:
        """Abort the connection: the waiting write returns, and the handler ends (see ``send``)."""
        self.stalled = True
        if self._transport is not None:
            self._transport.abort()


async def cut_stalled(app: web.Application) -> AsyncIterator[None]:
    """The watchdog of every open event stream (an aiohttp cleanup context)."""
    # only responses in the middle of a write (a set, not every open stream: 10,000 subscribers are
    # mostly idle or served by the fan-out's direct writes)
    streams = app[EVENT_STREAMS]

    async def watch() -> None:
        while True:
            # read each round, so a test can shorten it
            timeout = WRITE_TIMEOUT_SECONDS
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for stream in list(streams):
                started = stream.write_started
                if started is not None and now - started > timeout and not stream.stalled:
                    stream.cut_off()

    task = asyncio.create_task(watch(), name="wfs-sse-stall-watchdog")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@routes.get(STREAM + "/subscribe")
async def subscribe(request: web.Request) -> web.StreamResponse:
    app = state_of(request)
    principal = await principal_of(request, allow_query_token=True)
    run_id, stream_id = stream_key(request)
    after = _resume_cursor(request)
    unknown = set(request.query) - {"after", "access_token"}
    if unknown:
        raise InvalidInput(f"unknown query parameter(s): {', '.join(sorted(unknown))}", field=min(unknown))
    settings = app.settings
    ends_at = asyncio.get_running_loop().time() + settings.sse_max_connection_seconds

    async with _subscription_slot(request, principal.name), app.hub.watch_records(run_id, stream_id) as wake:
        # the first read validates cursor and rights, so errors are ordinary HTTP responses
        shared = await _first_page(request, principal, run_id, stream_id, after)
        first, count, last = shared.events_after(after)
        response = await _start_event_stream(request, first)
        if count:
            metrics.SUBSCRIPTION_EVENTS.inc(count)
        try:
            while True:
                wake.cursor = last
                page = shared.page
                if len(page.records) < PAGE:  # caught up: follow
                    if page.closed and last >= page.bounds.latest:
                        await response.send(_close_event(last))
                        break
                    if response.can_offer:
                        # the stream's fan-out writes to us until it cannot; then we go on alone
                        live = _Live(response, last, page.pins_digest)
                        app.fanout.join(run_id, stream_id, live)
                        wake.dormant = True  # the fan-out watches for us; we re-read after it lets go
                        try:
                            still_open = await _await_detach(response, live, ends_at, settings.sse_heartbeat_seconds)
                        finally:
                            wake.dormant = False
                            app.fanout.leave(run_id, stream_id, live)
                        last = live.last
                        if not still_open:
                            break  # rebalance: the client reconnects (maybe elsewhere) with Last-Event-ID
                    else:
                        if not await _await_news(response, wake, ends_at, settings.sse_heartbeat_seconds):
                            break
                        await _note_gap(app.pool, run_id, stream_id, wake, last)
                # clear, then take the generation: a signal after this point sets the flag again
                wake.clear()
                woken_at = app.hub.generation(run_id, stream_id)
                shared = await _read_retrying(
                    app.shared_reads, run_id, stream_id, last, woken_at, page.pins_digest, response
                )
                last = await _deliver(response, shared, last)
        except StreamError as exc:
            # e.g. retention pruned past a lagging subscriber: say why in-band, then end
            await response.send(_error_event(exc))
        except ConnectionResetError:
            log.info("subscriber of %s/%s left at sequence %d", run_id, stream_id, last)
        except TimeoutError:
            log.info("subscriber of %s/%s too slow at sequence %d: disconnected", run_id, stream_id, last)
            if request.transport is not None:
                request.transport.abort()  # drop what is buffered: it resumes with Last-Event-ID
        return response


@contextlib.asynccontextmanager
async def _subscription_slot(request: web.Request, principal: str) -> AsyncIterator[None]:
    """Bound open subscriptions per principal on this replica, so one caller cannot exhaust it."""
    counts = request.app[SUBSCRIPTIONS]
    limit = state_of(request).settings.sse_max_per_principal
    if counts[principal] >= limit:
        raise TooManySubscriptions(f"at most {limit} open subscriptions per principal", limit=limit)
    counts[principal] += 1
    metrics.SUBSCRIPTIONS_OPEN.inc()
    try:
        yield
    finally:
        metrics.SUBSCRIPTIONS_OPEN.dec()
        counts[principal] -= 1
        if not counts[principal]:
            del counts[principal]


async def _start_event_stream(request: web.Request, first: bytes) -> EventStream:
    """Start the response: its headers, the retry line and ``first`` (the backfill's events) in one write."""
    response = EventStream(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache, no-transform",
            "X-Accel-Buffering": "no",
        }
    )
    request[STREAMING] = True  # from the first byte on, a failure can no longer become a problem (or a retry)
    await response.prepare(request)
    response.writing = request.app[EVENT_STREAMS]
    task = asyncio.current_task()
    if task is not None:
        request.app[OPEN_STREAMS].add(task)
    await response.send(_RETRY + first)
    return response


async def _first_page(
    request: web.Request, principal: Principal, run_id: str, stream_id: str, after: int
) -> SharedPage:
    """The backfill, shared with subscribers connecting at the same cursor (a burst of connections is
    one read per stream), then authorized for this caller. A read that fails is repeated unshared with
    the caller's rights checked first, so a caller without rights learns nothing, not even whether its
    cursor is valid."""
    app = state_of(request)
    region = client_region_of(request)
    try:
        # join no read older than this watch: a commit announced before the watch existed would never
        # be signalled to us, so the read must have started after it (runtime/reads.py)
        shared = await app.shared_reads.page(run_id, stream_id, after, PAGE, app.hub.clock)
    except StreamError:
        async with app.pool.acquire() as conn:
            await reads.read_page(conn, run_id, stream_id, after, PAGE, principal, "subscribe", region)
        raise  # not reached unless the stream changed between the two reads
    # what read_page checks first, checked here on the shared page's pins
    reads.authorize(shared.page.pins, principal, "subscribe", region)
    return shared


async def _deliver(response: EventStream, shared: SharedPage, last: int) -> int:
    """Write the page's records after ``last``; boundary duplicates are dropped. Returns the new last."""
    chunk, count, new_last = shared.events_after(last)
    if count:
        await response.send(chunk)
        metrics.SUBSCRIPTION_EVENTS.inc(count)
    return new_last


def _error_event(exc: StreamError) -> bytes:
    body = {"code": exc.code, "detail": exc.detail, **exc.extra}
    return f"event: error\ndata: {json.dumps(body)}\n\n".encode()


def _close_event(last: int) -> bytes:
    return f"event: close\ndata: {json.dumps({'last_sequence': last})}\n\n".encode()


class _Live:
    """This subscription as a follower of its stream's fan-out (runtime/fanout.Follower)."""

    __slots__ = ("_response", "detached", "last", "pins_digest")

    def __init__(self, response: EventStream, last: int, pins_digest: str) -> None:
        self._response = response
        self.last = last
        self.pins_digest = pins_digest
        self.detached = asyncio.Event()

    def offer(self, chunk: bytes, count: int) -> bool:
        if not self._response.offer(chunk):
            return False
        metrics.SUBSCRIPTION_EVENTS.inc(count)
        return True

    def detach(self) -> None:
        self.detached.set()


async def _await_detach(response: EventStream, live: _Live, ends_at: float, heartbeat: float) -> bool:
    """While the fan-out serves us: heartbeats when idle. True once detached, False when time is up."""
    loop = asyncio.get_running_loop()
    while True:
        remaining = ends_at - loop.time()
        if remaining <= 0:
            return False
        try:
            async with asyncio.timeout(min(heartbeat, remaining)):
                await live.detached.wait()
            return True
        except TimeoutError:
            await response.send(b": heartbeat\n\n")


def gap_recorder(pool: db.Pool) -> Callable[[str, str, int, int], None]:
    """The fan-out's report of skipped wakes, recorded as gap evidence in the background."""
    pending: set[asyncio.Task[None]] = set()

    def report(run_id: str, stream_id: str, expected: int, observed: int) -> None:
        task = asyncio.create_task(_record_gap(pool, run_id, stream_id, expected, observed))
        pending.add(task)
        task.add_done_callback(pending.discard)

    return report


async def _await_news(response: EventStream, wake: wakes.Wake, ends_at: float, heartbeat: float) -> bool:
    """Wait for a wake, writing heartbeat comments while idle. False once the connection's time is up."""
    loop = asyncio.get_running_loop()
    while True:
        remaining = ends_at - loop.time()
        if remaining <= 0:
            return False
        if await wake.wait(min(heartbeat, remaining)):
            return True
        await response.send(b": heartbeat\n\n")


async def _read_retrying(
    shared: SharedReads,
    run_id: str,
    stream_id: str,
    after: int,
    woken_at: int,
    pins_digest: str,
    response: EventStream,
) -> SharedPage:
    """The next page, read once for every subscriber at this cursor. The first read authorized this
    subscriber; pins never change, so only a replaced stream (another digest) ends it. Postgres
    restarts are waited out, with a comment line before each wait so that proxies keep the connection."""

    async def waiting(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("subscription read failed (%s); retrying in %.1fs", exc, delay)
        await response.send(b": database unavailable, retrying\n\n")

    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(DB_UNAVAILABLE), wait=BACKOFF, before_sleep=waiting, reraise=True
    ):
        with attempt:
            page = await shared.page(run_id, stream_id, after, PAGE, woken_at)
    if page.page.pins_digest != pins_digest:
        raise StreamNotFound("the stream was deleted and created again")
    return page


async def _note_gap(pool: db.Pool, run_id: str, stream_id: str, wake: wakes.Wake, last: int) -> None:
    """A wake that announces records beyond last + 1 means notifications were missed: the re-read
    fills the gap from Postgres, and the evidence is kept."""
    first = wake.first_announced
    if first is not None and first > last + 1:
        await _record_gap(pool, run_id, stream_id, last + 1, first)


async def _record_gap(pool: db.Pool, run_id: str, stream_id: str, expected: int, observed: int) -> None:
    """Keep gap evidence; a database that is away costs the evidence, never the subscription."""
    try:
        async with pool.acquire() as conn:
            await gaps.record_gap(conn, run_id, stream_id, expected, observed, detected_by="sse")
    except DB_UNAVAILABLE as exc:
        log.warning("could not record gap evidence: %s", exc)


async def close_open_streams(app: web.Application) -> None:
    """On shutdown: end open subscriptions so clients reconnect to another replica promptly."""
    tasks: weakref.WeakSet[asyncio.Task[object]] = app[OPEN_STREAMS]
    for task in list(tasks):
        task.cancel()
