"""Pages of records as the protocol's catch-up and long-poll responses."""

from __future__ import annotations

from aiohttp import web

from ...adapters import wire
from ...domain import durable as rules
from ...domain.authz import Access
from ...domain.records import StoredRecord
from ...runtime import reads as runtime_reads
from ...store import durable as store
from ...store.bodies import Body
from ...store.reads import Page
from ..common import compressible
from ..state import AppState
from . import headers as h

# A catch-up response holds the whole of a stream of ordinary size: the protocol's clients, asked for a
# read that is not live, take the first response and stop (the reference server answers the whole stream
# at once). It is bounded in bytes (the records' stored sizes; at least one record), and assembled by
# Postgres (store.bodies), so its size costs the server little beyond the bytes themselves.
PAGE_RECORDS = 1_000_000
PAGE_BYTES = 16 * 1024 * 1024


def within_budget(records: list[StoredRecord], start: int, budget: int) -> int:
    """How many of ``records[start:]`` one event holds: up to ``budget`` bytes, and at least one."""
    total, keep = 0, 0
    for record in records[start:] if start else records:
        total += record.size_bytes
        if keep and total > budget:
            break
        keep += 1
    return keep


async def read_records(app: AppState, meta: store.Meta, after: int, access: Access) -> Body:
    """The records after ``after`` in the stream's form, as far as they are durable, for ``access``
    (checked again on the row: the stream may have been made again under its name since ``meta``)."""
    each = runtime_reads.read_bodies(
        app.pool,
        app.durability,
        meta.run_id,
        meta.stream_id,
        after,
        "messages" if rules.is_json_mode(meta.content_type) else "bytes",
        max_records=PAGE_RECORDS,
        max_bytes=PAGE_BYTES,
        access=access,
    )
    return await runtime_reads.whole(each)


def body_response(
    request: web.Request, meta: store.Meta, after: int, body: Body, cursor: str | None = None
) -> web.Response:
    """A catch-up (or long-poll) response: the data, where to read next, whether that is the tail (and
    the stream ended there), an ETag for revalidation, and the CDN cursor of live reads."""
    data = body.joined(b"[", b"]") if rules.is_json_mode(meta.content_type) else body.joined()
    return _response(request, meta, after, body.next_after, body.bounds.latest, body.closed, data, cursor)


def page_response(request: web.Request, meta: store.Meta, after: int, page: Page, cursor: str) -> web.Response:
    """A long-poll's answer from the shared live page that woke it."""
    next_after = page.next_after if page.next_after is not None else after
    data = wire.body(page.records, meta.content_type)
    return _response(request, meta, after, next_after, page.bounds.latest, page.closed, data, cursor)


def _response(
    request: web.Request,
    meta: store.Meta,
    after: int,
    next_after: int,
    latest: int,
    closed_stream: bool,
    data: bytes,
    cursor: str | None,
) -> web.Response:
    up_to_date = next_after >= latest
    closed = closed_stream and up_to_date
    tag = rules.etag(meta.incarnation, after, next_after, closed)
    headers = {
        "Content-Type": meta.content_type,
        h.NEXT_OFFSET: rules.encode_offset(next_after),
        "ETag": tag,
        # the tail moves; a page that ends before it never changes
        "Cache-Control": h.NO_STORE if up_to_date else h.IMMUTABLE_PAGE,
    }
    if cursor is not None:
        headers[h.CURSOR] = cursor
    if up_to_date:
        headers[h.UP_TO_DATE] = "true"
    if closed:
        headers[h.CLOSED] = "true"
    if rules.if_none_match(request.headers.get("If-None-Match"), tag):
        return web.Response(status=304, headers={k: v for k, v in headers.items() if k != "Content-Type"})
    return compressible(web.Response(body=data, headers=headers))
