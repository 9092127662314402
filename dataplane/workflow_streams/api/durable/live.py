"""Live reads: long-poll and Server-Sent Events, on the same wake hub and read function as our own
subscriptions. The watcher is registered before the first read, so a commit after that read always
wakes it, and every wake leads to a fresh read from Postgres (a wake is never the data)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging

from aiohttp import web

from ... import metrics
from ...domain import durable as rules
from ...domain.errors import StreamError, StreamNotFound
from ...store import durable as store
from ..state import STREAMING, AppState
from ..subscribe import OPEN_STREAMS
from . import headers as h
from .pages import page_response, payloads, read_page, trimmed

log = logging.getLogger(__name__)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _empty(meta: store.Meta, after: int, cursor: str, closed: bool) -> web.Response:
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


async def long_poll(request: web.Request, app: AppState, meta: store.Meta, after: int) -> web.Response:
    """Answer at once when there are records after ``after`` (or the stream is closed at the tail);
    otherwise wait for a wake up to the long-poll timeout, then 204."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + app.settings.durable_long_poll_seconds
    async with app.hub.watch_records(meta.run_id, meta.stream_id) as wake:
        wake.cursor = after  # the head poller wakes us only when the stream moves past this
        while True:
            wake.clear()
            page = trimmed(await read_page(app, meta, after))
            cursor = rules.stream_cursor(_now(), request.query.get("cursor"))
            if page.records:
                metrics.READ_RECORDS.inc(len(page.records))
                return page_response(request, meta, after, page, cursor)
            if page.closed:
                return _empty(meta, after, cursor, closed=True)
            remaining = deadline - loop.time()
            if remaining <= 0 or not await wake.wait(remaining):
                return _empty(meta, after, cursor, closed=False)


class _Cursor:
    """Control events' cursors never go backwards within a connection, nor below the client's."""

    def __init__(self, echoed: str | None) -> None:
        self._echoed = echoed
        self._last = -1

    def next(self) -> str:
        value = max(int(rules.stream_cursor(_now(), self._echoed)), self._last)
        self._last = value
        return str(value)


async def sse(request: web.Request, app: AppState, meta: store.Meta, after: int) -> web.StreamResponse:
    """Each page of records is one ``data`` event followed by a ``control`` event with the offset after
    it; the first control says when the reader is up to date; a closed stream's last control carries
    ``streamClosed`` and ends the response. Connections end after ``durable_sse_seconds`` so that
    clients spread over replicas (and CDNs can collapse them); clients resume at the last offset."""
    settings = app.settings
    headers = {
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache, no-transform",
        "X-Accel-Buffering": "no",
    }
    if rules.sse_base64(meta.content_type):
        headers[h.SSE_ENCODING] = "base64"
    response = web.StreamResponse(status=200, headers=headers)
    loop = asyncio.get_running_loop()
    ends_at = loop.time() + settings.durable_sse_seconds
    cursors = _Cursor(request.query.get("cursor"))
    announced = False
    async with app.hub.watch_records(meta.run_id, meta.stream_id) as wake:
        while True:
            wake.cursor = after  # the head poller wakes us only when the stream moves past this
            wake.clear()
            try:
                page = trimmed(await read_page(app, meta, after))
            except StreamError as exc:
                if not response.prepared:
                    raise  # before the first byte, the error is an ordinary response
                if not isinstance(exc, StreamNotFound):  # a deleted stream just ends
                    await _write(response, rules.sse_event("error", json.dumps({"code": exc.code, **_safe(exc)})))
                break
            if not response.prepared:
                request[STREAMING] = True
                await response.prepare(request)
                task = asyncio.current_task()
                if task is not None:  # ended on shutdown like our own subscriptions: clients resume elsewhere
                    request.config_dict[OPEN_STREAMS].add(task)
            next_after = page.next_after if page.next_after is not None else after
            up_to_date = next_after >= page.bounds.latest
            closed = page.closed and up_to_date
            events = b""
            if page.records:
                metrics.READ_RECORDS.inc(len(page.records))
                text = rules.sse_data(payloads(page, meta.content_type), meta.content_type)
                events += rules.sse_event("data", text)
            if page.records or closed or not announced:
                body = rules.control(rules.encode_offset(next_after), cursors.next(), up_to_date, closed)
                events += rules.sse_event("control", json.dumps(body, separators=(",", ":")))
                announced = True
            after = next_after
            if events and not await _write(response, events):
                break
            if closed:
                break
            if not up_to_date:
                continue  # more pages are waiting: no need for a wake
            remaining = ends_at - loop.time()
            if remaining <= 0:
                break
            woken = await wake.wait(min(remaining, settings.sse_heartbeat_seconds))
            # idle: a comment keeps proxies from timing the connection out, and the loop re-reads
            # anyway, so a lost wake costs one heartbeat of latency at most
            if not woken and not await _write(response, b": heartbeat\n\n"):
                break
    if response.prepared:
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
    return response


def _safe(exc: StreamError) -> dict[str, object]:
    return {k: v for k, v in exc.extra.items() if isinstance(v, (int, str, bool))}


async def _write(response: web.StreamResponse, data: bytes) -> bool:
    """False once the client has gone."""
    try:
        await response.write(data)
    except ConnectionError:
        return False
    return True
