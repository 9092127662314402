"""Reading records after a cursor, consistently with the stream's bounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..domain.authz import Access
from ..domain.cursor import Bounds, check_cursor
from ..domain.errors import StreamError
from ..domain.pins import StreamPins
from ..domain.records import DEFAULT_CONTENT_TYPE, StoredRecord
from . import streams
from .wal import TIMELINE

# The columns of a stored record, in ``StoredRecord``'s field order: every query that returns records
# selects these first, from ``wfs_records r``, so ``stored_record`` can take them by position. The row
# does not store ``kind`` (exactly one of payload and object is set) or ``size_bytes`` (the payload's
# length, or the object's size): migration 482 dropped both to narrow the row, and they are computed
# here, the one place, so a stored record reads back as it was appended. Nor does it store the default
# content type (migration 483: NULL is DEFAULT_CONTENT_TYPE).
RECORD_COLUMNS = (
    "r.sequence, CASE WHEN r.object IS NULL THEN 'inline' ELSE 'object' END AS kind,"
    f" coalesce(r.content_type, '{DEFAULT_CONTENT_TYPE}') AS content_type, r.payload,"
    " coalesce(octet_length(r.payload)::bigint, (r.object->>'size')::bigint) AS size_bytes, r.object,"
    " r.appended_at"
)
_WIDTH = len(StoredRecord._fields)
RECORD_NULLS = ", ".join(["NULL"] * _WIDTH)
STREAM_NULLS = ", ".join(["NULL"] * len(streams.COLUMNS.split(",")))
# tuple.__new__ straight from the row: the cheapest way to build the value (catch-up reads build one per
# record); StoredRecord(...) and StoredRecord._make add a Python call each.
_new_record: Callable[[type[StoredRecord], Iterable[Any]], StoredRecord] = tuple.__new__


def stored_record(row: asyncpg.Record) -> StoredRecord:
    """The one mapping from a row that starts with ``RECORD_COLUMNS`` to a ``StoredRecord``."""
    return _new_record(StoredRecord, row if len(row) == _WIDTH else row[:_WIDTH])


@dataclass(frozen=True)
class Page:
    records: list[StoredRecord]
    bounds: Bounds
    closed: bool
    pins: StreamPins
    pins_digest: str
    # the WAL timeline the read ran on (store.wal)
    timeline: str

    @property
    def next_after(self) -> int | None:
        return self.records[-1].sequence if self.records else None

    @property
    def last_sequence(self) -> int | None:
        return self.records[-1].sequence if self.records else None

    def held_back(self, known: int) -> tuple[Page, int]:
        """This page as far as ``known`` is durable (the head at most ``known``, never below the page's own
        start, and not closed: the close may lie beyond), and how many records were held back."""
        served = [r for r in self.records if r.sequence <= known]
        start = served[-1].sequence if served else self.records[0].sequence - 1 if self.records else self.bounds.latest
        bounds = self.bounds.as_durable_as(known, start)
        return dataclasses.replace(self, records=served, bounds=bounds, closed=False), len(self.records) - len(served)


# The stream's row and the page after the cursor in one statement: one snapshot (a concurrent prune can
# never become a silent gap) and one round trip, where a read-only transaction around two queries took
# four (BEGIN, stream, records, COMMIT) — every subscriber's first page and every fan-out read pays it.
# The first branch is the stream's row (``part`` 0), the second the records in sequence order, their
# columns first as ``stored_record`` takes them; each branch's missing columns are NULLs. (Not an ARRAY
# of ROW()s in one row: Postgres builds the array whole and asyncpg decodes it element by element, which
# reads records slower; figures: bench/README.md, constants.)
# The records are found by the stream's surrogate key (migration 482), which the first branch's row
# carries; it is not among the stream's columns the caller gets. That row also says which WAL timeline the
# read ran on (store.wal: what confirms a read must have run on the same).
_PAGE = f"""
WITH s AS (SELECT stream_key, {streams.COLUMNS} FROM wfs_streams WHERE run_id = $1 AND stream_id = $2)
SELECT {RECORD_NULLS}, 0 AS part, {streams.COLUMNS}, {TIMELINE} AS timeline FROM s
UNION ALL
SELECT p.*, 1, {STREAM_NULLS}, NULL
FROM s, LATERAL (
    SELECT {RECORD_COLUMNS} FROM wfs_records r
    WHERE r.stream_key = s.stream_key AND r.sequence > $3 ORDER BY r.sequence LIMIT $4
) p
"""


# The same page for many streams in one statement: each key's stream row and its records, tagged with
# the key's position (``i``, last so that ``stored_record`` still takes the record columns first). A burst
# of subscribers over many streams, or one wake of many streams' fan-outs, reads in one round trip
# (``runtime.reads.SharedReads`` batches them). Per key it is ``_PAGE``'s statement: the stream by its
# names, its records by its surrogate key after the cursor, each a lookup per array element. A key whose
# stream does not exist has no rows. (The single-stream statement stays: its plan is cached per
# connection, where array parameters make Postgres plan this one for each call, which a page read for
# one caller need not pay.)
_PAGES = f"""
WITH s AS (
    SELECT k.i, k.after, k.page_limit, w.*
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[]) WITH ORDINALITY
         AS k(run_id, stream_id, after, page_limit, i)
    CROSS JOIN LATERAL (
        SELECT stream_key, {streams.COLUMNS} FROM wfs_streams WHERE run_id = k.run_id AND stream_id = k.stream_id
    ) w
)
SELECT {RECORD_NULLS}, 0 AS part, {streams.COLUMNS}, {TIMELINE} AS timeline, s.i FROM s
UNION ALL
SELECT p.*, 1, {STREAM_NULLS}, NULL, s.i
FROM s, LATERAL (
    SELECT {RECORD_COLUMNS} FROM wfs_records r
    WHERE r.stream_key = s.stream_key AND r.sequence > s.after ORDER BY r.sequence LIMIT s.page_limit
) p
"""

PageKey = tuple[str, str, int, int]  # run_id, stream_id, after, limit


async def fetch_page(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    after: int,
    limit: int,
    *,
    access: Access | None = None,
) -> Page:
    """Records with sequence > after, ascending. With ``access``, it is checked on the stream row before
    anything else is decided, so a caller without the right learns nothing, not even whether its cursor
    is valid; ``access=None`` is for readers that authorized this stream earlier in the same request (a
    subscription's later, shared pages). Bounds and records come from one snapshot: a concurrent prune
    can never become a silent gap."""
    rows = await conn.fetch(_PAGE, run_id, stream_id, after, limit)
    return _page(rows, after, access)


async def fetch_pages(conn: asyncpg.Connection, keys: Sequence[PageKey]) -> list[Page | StreamError]:
    """``fetch_page`` (``access=None``) for each key, in one statement: per key its page, or the error
    ``fetch_page`` would have raised for it (no such stream, a cursor past the latest or pruned)."""
    rows = await conn.fetch(_PAGES, *(list(column) for column in zip(*keys, strict=True)))
    by_key: list[list[asyncpg.Record]] = [[] for _ in keys]
    for row in rows:
        by_key[row["i"] - 1].append(row)
    out: list[Page | StreamError] = []
    for (_, _, after, _), key_rows in zip(keys, by_key, strict=True):
        try:
            out.append(_page(key_rows, after, None))
        except StreamError as exc:
            out.append(exc)
    return out


def _page(rows: Sequence[asyncpg.Record], after: int, access: Access | None) -> Page:
    """A page from the rows of one stream (``_PAGE``'s, or one key's of ``_PAGES``)."""
    # the stream's row comes first (Postgres appends the branches in order; found by ``part`` anyway)
    head = next((row for row in rows if row["part"] == 0), None)
    stream = streams.checked(head, access)
    assert head is not None  # checked raises for a missing stream
    check_cursor(after, stream.bounds)
    records = [stored_record(row) for row in rows if row["part"] == 1]
    return Page(records, stream.bounds, stream.closed, stream.pins, stream.pins_digest, head["timeline"])
