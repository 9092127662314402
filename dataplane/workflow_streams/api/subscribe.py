"""Live subscriptions over Server-Sent Events: our API's framing of the live-read engine
(``runtime.live``), which registers the wake watch before the backfill, re-reads Postgres on every wake,
and cuts off a reader that stops reading (it resumes with Last-Event-ID).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..adapters import wire
from ..domain.authz import Access
from ..domain.cursor import parse_cursor
from ..domain.errors import StreamError
from ..runtime.live import Delivery
from ..runtime.reads import SharedPage
from ..store.bodies import Body, Form
from . import events
from .common import STREAM, client_region_of, query, stream_key
from .state import principal_of, state_of

routes = web.RouteTableDef()

# records per read of the backfill and of a reader's own re-reads
PAGE = 500


def _resume_cursor(request: web.Request) -> int:
    """A browser's automatic reconnect sends Last-Event-ID, which wins over the original ?after."""
    last_event_id = request.headers.get("Last-Event-ID")
    if last_event_id is not None:
        return parse_cursor(last_event_id.strip(), "Last-Event-ID")
    return parse_cursor(request.query.get("after"))


class RecordEvents:
    """Our API's encoder: one ``record`` event per record (with its sequence as the id a reconnect sends
    back), a ``close`` event once a closed stream is drained, an ``error`` event when it ends early."""

    heartbeat = wire.HEARTBEAT
    form: Form = "events"

    def start(self, shared: SharedPage, last: int) -> Delivery:
        chunk, count, new_last = self.events(shared, last)
        return Delivery(wire.RETRY + chunk, count, new_last)

    def events(self, shared: SharedPage, last: int) -> Delivery:
        # the same for every connection at ``last``: made once per page and position
        return shared.memo((RecordEvents, last), _events_after, last)

    def body(self, body: Body, last: int) -> Delivery:
        return Delivery(body.joined(), body.count, body.next_after)

    def closed(self, last: int) -> bytes:
        return wire.close_event(last)

    def error(self, exc: StreamError) -> bytes:
        return wire.error_event(exc)


def _events_after(shared: SharedPage, last: int) -> Delivery:
    start = shared.start_after(last)
    events = shared.memo(RecordEvents, _record_events)
    if start >= len(events):
        return Delivery(b"", 0, last)
    return Delivery(b"".join(events[start:]), len(events) - start, shared.page.records[-1].sequence)


def _record_events(shared: SharedPage) -> list[bytes]:
    return [wire.record_event(r) for r in shared.page.records]


@routes.get(STREAM + "/subscribe")
@query("after", "access_token")
async def subscribe(request: web.Request) -> web.StreamResponse:
    app = state_of(request)
    principal = await principal_of(request, allow_query_token=True)
    run_id, stream_id = stream_key(request)
    after = _resume_cursor(request)
    settings = app.settings
    ends_at = asyncio.get_running_loop().time() + settings.sse_max_connection_seconds
    live = app.live
    async with live.watch(principal.name, run_id, stream_id) as wake:
        # the first read validates cursor and rights, so errors are ordinary HTTP responses
        shared = await live.first_page(
            run_id, stream_id, after, PAGE, Access(principal, "subscribe", client_region_of(request))
        )
        encoder = RecordEvents()
        backfill = encoder.start(shared, after)
        response = await events.start(request, events.HEADERS, backfill.chunk)
        await live.follow(
            response,
            encoder,
            run_id,
            stream_id,
            wake,
            shared,
            backfill,
            limit=PAGE,
            ends_at=ends_at,
            heartbeat=settings.sse_heartbeat_seconds,
        )
    return response
