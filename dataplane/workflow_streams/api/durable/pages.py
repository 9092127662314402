"""Pages of records as the protocol's bodies: JSON arrays of messages, or bytes."""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from ... import wire
from ...domain import durable as rules
from ...domain.records import StoredRecord, is_json
from ...runtime import reads as runtime_reads
from ...store import durable as store
from ...store import reads
from ..common import compressible
from ..state import AppState
from . import headers as h

# Records per read, and the bytes a page stops growing past (it always holds at least one record). A
# catch-up response holds the whole of a stream of ordinary size: the protocol's clients, asked for a
# read that is not live, take the first response and stop (as the reference server answers at once).
PAGE_RECORDS = 10_000
PAGE_BYTES = 4 * 1024 * 1024


async def read_page(app: AppState, meta: store.Meta, after: int) -> reads.Page:
    """The shared read: records after ``after`` and the bounds, from one snapshot, as far as they are
    durable (``runtime.reads.read_page``). A pruned offset is 410 with the bounds, an offset past the
    tail 400 (never a silent reset)."""
    return await runtime_reads.read_page(app.pool, app.durability, meta.run_id, meta.stream_id, after, PAGE_RECORDS)


def trimmed(page: reads.Page) -> reads.Page:
    total, keep = 0, 0
    for record in page.records:
        total += record.size_bytes
        if keep and total > PAGE_BYTES:
            break
        keep += 1
    return page if keep == len(page.records) else replace(page, records=page.records[:keep])


def message(record: StoredRecord) -> bytes:
    """A record as one JSON message: JSON payloads as stored; anything else (only our own streams hold
    base64 or object records) as the record object our own API returns."""
    if record.payload is not None and is_json(record.content_type):  # inline (the CHECK: kind = inline iff payload)
        return record.payload
    return wire.record_bytes(record)


def payloads(page: reads.Page, content_type: str) -> list[bytes]:
    if rules.is_json_mode(content_type):
        return [message(r) for r in page.records]
    return [r.payload for r in page.records if r.payload is not None]


def page_body(page: reads.Page, content_type: str) -> bytes:
    parts = payloads(page, content_type)
    if rules.is_json_mode(content_type):
        return b"[" + b",".join(parts) + b"]"
    return b"".join(parts)


def page_response(
    request: web.Request, meta: store.Meta, after: int, page: reads.Page, cursor: str | None = None
) -> web.Response:
    """A catch-up or long-poll page: the data, where to read next, whether that is the tail (and the
    stream ended there), an ETag for revalidation, and the CDN cursor of live reads."""
    next_after = page.next_after if page.next_after is not None else after
    up_to_date = next_after >= page.bounds.latest
    closed = page.closed and up_to_date
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
    return compressible(web.Response(body=page_body(page, meta.content_type), headers=headers))
