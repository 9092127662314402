"""Pages of records as the protocol's catch-up and long-poll responses."""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from ... import wire
from ...domain import durable as rules
from ...domain.records import StoredRecord
from ...store import durable as store
from ...store import reads
from ..common import compressible
from . import headers as h

# Records per read, and the bytes a page stops growing past (it always holds at least one record). A
# catch-up response holds the whole of a stream of ordinary size: the protocol's clients, asked for a
# read that is not live, take the first response and stop (as the reference server answers at once).
PAGE_RECORDS = 10_000
PAGE_BYTES = 4 * 1024 * 1024


def within_budget(records: list[StoredRecord], start: int = 0, budget: int = PAGE_BYTES) -> int:
    """How many of ``records[start:]`` one response (or event) holds: up to ``budget`` bytes, and at
    least one."""
    total, keep = 0, 0
    for record in records[start:] if start else records:
        total += record.size_bytes
        if keep and total > budget:
            break
        keep += 1
    return keep


def trimmed(page: reads.Page) -> reads.Page:
    keep = within_budget(page.records)
    return page if keep == len(page.records) else replace(page, records=page.records[:keep])


def page_response(
    request: web.Request, meta: store.Meta, after: int, page: reads.Page, cursor: str | None = None
) -> web.Response:
    """A catch-up or long-poll page: the data, where to read next, whether that is the tail (and the
    stream ended there), an ETag for revalidation, and the CDN cursor of live reads."""
    page = trimmed(page)
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
    return compressible(web.Response(body=wire.body(page.records, meta.content_type), headers=headers))
