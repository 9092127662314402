"""Live reads of the protocol: long-poll and Server-Sent Events, on the live-read engine of our own
subscriptions (``runtime.live``: the wake watch before the first read, a re-read on every wake, the
fan-out, the stall cut-off and the per-principal cap), framed as the protocol's ``data`` and ``control``
events."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt

from aiohttp import web

from ...adapters import metrics, wire
from ...domain import durable as rules
from ...domain.authz import Access, Principal
from ...domain.errors import StreamError, StreamNotFound
from ...runtime.live import FOLLOW_PAGE, Delivery
from ...runtime.reads import SharedPage
from ...store import durable as store
from ...store.bodies import Body, Form
from .. import events
from ..common import client_region_of
from ..state import AppState
from . import headers as h
from .pages import PAGE_BYTES, body_response, page_response, read_records, within_budget


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _empty(after: int, cursor: str, closed: bool) -> web.Response:
    """The long-poll timeout (or a closed stream's end): 204, still at the tail."""
    headers = {
        h.NEXT_OFFSET: rules.encode_offset(after),
        h.UP_TO_DATE: "true",
        h.CURSOR: cursor,
        "Cache-Control": h.NO_STORE,
    }
    if closed:
        headers[h.CLOSED] = "true"
    return web.Response(status=204, headers=headers)


def _same_stream(shared: SharedPage, meta: store.Meta) -> SharedPage:
    """The stream authorized on ``meta``, not one made again under its name since."""
    if shared.page.pins_digest != meta.stream.pins_digest:
        raise StreamNotFound("the stream was deleted and created again")
    return shared


async def long_poll(
    request: web.Request, app: AppState, principal: Principal, meta: store.Meta, after: int
) -> web.Response:
    """Answer at once when there are records after ``after`` (a catch-up response) or the stream is
    closed at the tail; otherwise wait for a wake up to the long-poll timeout, then 204. Long polls at
    the same offset share the reads that answer them."""
    cursor = rules.stream_cursor(_now(), request.query.get("cursor"))
    if after < meta.last_sequence:
        body = await read_records(app, meta, after, Access(principal, "subscribe", client_region_of(request)))
        metrics.READ_RECORDS.inc(body.count)
        return body_response(request, meta, after, body, cursor)
    live = app.live
    until = asyncio.get_running_loop().time() + app.settings.durable_long_poll_seconds
    async with live.watch(principal.name, meta.run_id, meta.stream_id) as wake:
        shared = await live.next_page(wake, meta.run_id, meta.stream_id, after, FOLLOW_PAGE, until)
    page = _same_stream(shared, meta).page
    if page.records:
        metrics.READ_RECORDS.inc(len(page.records))
        return page_response(request, meta, after, page, cursor)
    return _empty(after, cursor, closed=page.closed)


# The records one ``data`` event carries at most (and at least one): a JSON stream's event is one line,
# and SSE parsers bound their lines (aiohttp's at 512 KiB).
EVENT_BYTES = 256 * 1024


class ProtocolEvents:
    """The protocol's encoder, for one connection: a page is ``data`` events (a JSON array, text, or
    base64 of the bytes; up to EVENT_BYTES of records each), each followed by a ``control`` event with the
    offset after it, whether that is the tail, and the CDN cursor, which never goes backwards within a
    connection nor below the one the client echoed. The first control comes at once, data or not; a
    closed stream's last control carries ``streamClosed`` and ends the response."""

    heartbeat = wire.HEARTBEAT

    def __init__(self, content_type: str, echoed_cursor: str | None) -> None:
        self._content_type = content_type
        self._json = rules.is_json_mode(content_type)
        self.form: Form = "messages" if self._json else "bytes"
        self._echoed = echoed_cursor
        self._cursor = -1
        self._closed_sent = False

    def start(self, shared: SharedPage, last: int) -> Delivery:
        return self._events(shared, last, announce=True)

    def events(self, shared: SharedPage, last: int) -> Delivery:
        return self._events(shared, last, announce=False)

    def body(self, body: Body, last: int) -> Delivery:
        out: list[bytes] = []
        for last, joined in body.chunks(EVENT_BYTES):
            out.append(self._data(joined))
            out.append(self._control(last, body.bounds.latest, body.closed))
        return Delivery(b"".join(out), body.count, body.next_after)

    def closed(self, last: int) -> bytes:
        if self._closed_sent:
            return b""
        self._closed_sent = True
        return wire.control_event(rules.encode_offset(last), None, up_to_date=True, closed=True)

    def error(self, exc: StreamError) -> bytes:
        return wire.protocol_error_event(exc)

    def _events(self, shared: SharedPage, last: int, announce: bool) -> Delivery:
        """Pairs of a ``data`` event and the ``control`` event after it, up to PAGE_BYTES of records."""
        page = shared.page
        records = page.records
        start = shared.start_after(last)
        end = start + within_budget(records, start, PAGE_BYTES) if start < len(records) else start
        if start == end and not announce and not (page.closed and last >= page.bounds.latest):
            return Delivery(b"", 0, last)
        out: list[bytes] = []
        position = last
        while True:
            count = min(within_budget(records, start, EVENT_BYTES), end - start) if start < end else 0
            if count:
                # one encoding per page and event for every connection of this content type
                key = (ProtocolEvents, self._content_type, start, count)
                out.append(shared.memo(key, _data_event, start, count, self._content_type))
                position = records[start + count - 1].sequence
                start += count
            out.append(self._control(position, page.bounds.latest, page.closed))
            if start >= end:
                return Delivery(b"".join(out), start - shared.start_after(last), position)

    def _data(self, joined: bytes) -> bytes:
        """A chunk of a catch-up body (messages joined by commas, or bytes) as one ``data`` event."""
        if not self._json:
            return wire.event("data", wire.data_text([joined], self._content_type))
        if b"\n" in joined or b"\r" in joined:  # a message stored with raw line breaks: one data line each
            return wire.event("data", "[" + joined.decode() + "]")
        return b"event: data\ndata:[" + joined + b"]\n\n"

    def _control(self, position: int, latest: int, closed: bool) -> bytes:
        up_to_date = position >= latest
        ends = closed and up_to_date
        self._closed_sent = self._closed_sent or ends
        return wire.control_event(rules.encode_offset(position), self._next_cursor(), up_to_date, ends)

    def _next_cursor(self) -> str:
        value = max(int(rules.stream_cursor(_now(), self._echoed)), self._cursor)
        self._cursor = value
        return str(value)


def _data_event(shared: SharedPage, start: int, count: int, content_type: str) -> bytes:
    return wire.data_event(shared.page.records[start : start + count], content_type)


async def sse(
    request: web.Request, app: AppState, principal: Principal, meta: store.Meta, after: int
) -> web.StreamResponse:
    """Server-Sent Events. Connections end after ``durable_sse_seconds`` so that clients spread over
    replicas (and CDNs can collapse them); clients resume at the last offset they were given."""
    settings = app.settings
    headers = dict(events.HEADERS)
    if rules.sse_base64(meta.content_type):
        headers[h.SSE_ENCODING] = "base64"
    live = app.live
    ends_at = asyncio.get_running_loop().time() + settings.durable_sse_seconds
    async with live.watch(principal.name, meta.run_id, meta.stream_id) as wake:
        shared = await live.first_page(
            meta.run_id, meta.stream_id, after, FOLLOW_PAGE, Access(principal, "subscribe", client_region_of(request))
        )
        _same_stream(shared, meta)
        encoder = ProtocolEvents(meta.content_type, request.query.get("cursor"))
        backfill = encoder.start(shared, after)
        response = await events.start(request, headers, backfill.chunk)
        await live.follow(
            response,
            encoder,
            meta.run_id,
            meta.stream_id,
            wake,
            shared,
            backfill,
            limit=FOLLOW_PAGE,
            ends_at=ends_at,
            heartbeat=settings.sse_heartbeat_seconds,
        )
    if not response.stalled:
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
    return response
