"""Catch-up reads assembled by Postgres: a page of records in their wire form, one value a part.

A reader that fell behind (a replay, a new subscriber with a backlog, a Durable Streams client asking for
the whole stream) reads far more records than a live page holds. Read as rows of columns, each record
would be decoded by asyncpg and encoded again in Python (``wire.record_bytes``), which would be most of
the server's time while Postgres idles. Here the server that holds the records builds each one's wire
form and joins a part of the page (``fetch_part``) into one ``bytes`` value, which crosses into Python
as it is. The forms are the ones ``adapters.wire`` makes from rows (tests/test_catchup_reads.py compares
them).

A page is bounded in records and in bytes (the records' stored sizes; at least one record). Where it
ends is decided first, from the records' cumulative bytes, so exactly the page's rows are read.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import asyncpg

from ..domain.authz import Access
from ..domain.cursor import Bounds, check_cursor
from ..domain.pins import StreamPins
from ..domain.records import DEFAULT_CONTENT_TYPE
from . import streams
from .wal import TIMELINE

Form = Literal["records", "events", "messages", "bytes"]

# A record as our API's JSON object (``wire.record_bytes``), as bytea: its payload spliced in as stored
# when it is JSON, else base64 (without the line breaks Postgres' encoder adds), or its object reference.
# This expression is most of Postgres' time a record, so each piece is written the cheapest way: the
# usual record (inline, of the default content type) by its own branch with its constant text in one
# literal (each || is a copy: 0.65 against 0.73 us a record); the timestamp as JSON writes it in the
# session's time zone (UTC: store.db connects so; converting it here cost 0.15 us a record, to_char
# more); the text made bytes by textsend, which writes it in the connection's client encoding (UTF8:
# asyncpg sets it), with none of convert_to's checks (figures: bench/README.md, constants).


def _record_json(opening: str = """'{"sequence":'""", tail: str = "}") -> str:
    """The expression, starting with the SQL text ``opening`` (which ends where the sequence goes) and
    ending with the text ``tail``: an SSE event's lines are written in the same copies as its record."""
    tail_bytes = f"'\\x{tail.encode().hex()}'::bytea"
    return f"""(CASE WHEN r.object IS NULL AND r.content_type IS NULL THEN textsend(
    {opening} || r.sequence || ',"kind":"inline","content_type":"{DEFAULT_CONTENT_TYPE}","size":'
    || octet_length(r.payload) || ',"appended_at":' || to_json(r.appended_at)::text || ',"data":')
    || r.payload || {tail_bytes}
ELSE textsend(
    {opening} || r.sequence
    || CASE WHEN r.object IS NULL THEN ',"kind":"inline"' ELSE ',"kind":"object"' END
    || CASE WHEN r.content_type IS NULL THEN ',"content_type":"{DEFAULT_CONTENT_TYPE}"'
            ELSE ',"content_type":' || to_json(r.content_type)::text END
    || ',"size":' || coalesce(octet_length(r.payload)::bigint, (r.object->>'size')::bigint)
    || ',"appended_at":' || to_json(r.appended_at)::text
    || CASE WHEN r.object IS NOT NULL THEN ',"object":' || r.object::text
            WHEN wfs_is_json(r.content_type) THEN ',"data":'
            ELSE ',"data_base64":"' || translate(encode(r.payload, 'base64'), E'\\n', '') || '"' END)
    || CASE WHEN r.object IS NULL AND wfs_is_json(r.content_type) THEN r.payload ELSE ''::bytea END
    || {tail_bytes} END)"""


# What each record contributes to a chunk, and what separates two records, per form: our API's read
# body (``records``) and SSE events (``events``); the protocol's JSON messages (``messages``: a JSON
# payload as stored, anything else as our record object) and byte streams (``bytes``).
_FORMS: dict[str, tuple[str, str]] = {
    "records": (_record_json(), ","),
    "events": (_record_json("""'id: ' || r.sequence || E'\\nevent: record\\ndata: {"sequence":'""", "}\n\n"), ""),
    "messages": (
        f"(CASE WHEN r.object IS NULL AND wfs_is_json(r.content_type) THEN r.payload ELSE {_record_json()} END)",
        ",",
    ),
    "bytes": ("coalesce(r.payload, ''::bytea)", ""),
}


# The stream's row, the WAL timeline and where a page after cursor $3 ends: the last sequence within
# both budgets, $4 records and $5 bytes (at least one record). ``base`` is the stream's cumulative bytes
# through the cursor (its pruned bytes when the cursor's record is gone); cumulative bytes grow with the
# sequence, so the end is found by a binary search of point lookups (about twenty for a million records)
# rather than by reading the records. The search starts by probing its upper bound: a page that fits
# its byte budget whole (most pages: a record budget of 10 or 1,000 small records) is decided in one.
_SEARCH = f"""
WITH RECURSIVE s AS (
    SELECT w.stream_key, {streams.columns("w")}, {TIMELINE} AS timeline,
           coalesce((SELECT c.cumulative_bytes FROM wfs_records c
                     WHERE c.stream_key = w.stream_key AND c.sequence = $3), w.pruned_bytes) AS base
    FROM wfs_streams w WHERE w.run_id = $1 AND w.stream_id = $2
), search(lo, hi) AS (
    -- written not to overflow for any cursor (one past the latest is refused after this statement)
    SELECT CASE WHEN (SELECT c.cumulative_bytes FROM wfs_records c
                      WHERE c.stream_key = s.stream_key AND c.sequence = bound.hi) - s.base <= $5::bigint
                THEN bound.hi ELSE bound.lo END,
           bound.hi
    FROM s CROSS JOIN LATERAL (
        SELECT least($3, s.last_sequence) + 1 AS lo, $3 + least($4::bigint, s.last_sequence - $3) AS hi
    ) bound
    UNION ALL
    SELECT CASE WHEN probe.fits THEN half.mid ELSE search.lo END,
           CASE WHEN probe.fits THEN search.hi ELSE half.mid - 1 END
    FROM search CROSS JOIN s
    CROSS JOIN LATERAL (SELECT (search.lo + search.hi + 1) / 2 AS mid) half
    CROSS JOIN LATERAL (
        SELECT (SELECT c.cumulative_bytes FROM wfs_records c
                WHERE c.stream_key = s.stream_key AND c.sequence = half.mid) - s.base <= $5::bigint AS fits
    ) probe
    WHERE search.lo < search.hi
)
"""


def _aggregate(form: Form, stream_key: str, after: str, last: str) -> str:
    """The records (``after``, ``last``] of stream key ``stream_key`` (SQL expressions) in ``form`` as one
    value, joined by the form's separator in sequence order (``data``), and each record's length in that
    order (``lengths``). The records come from a fenced (OFFSET 0), ordered subquery: its rows reach the
    aggregates in its order, and each record is written once for both. One value a part, not a row a
    record: asyncpg's rows were most of the server's time a record (figures: bench/README.md, constants)."""
    expression, separator = _FORMS[form]
    return f"""SELECT string_agg(q.value, '\\x{separator.encode().hex()}'::bytea) AS data,
       array_agg(octet_length(q.value)) AS lengths
FROM (SELECT {expression} AS value FROM wfs_records r
      WHERE r.stream_key = {stream_key} AND r.sequence > {after} AND r.sequence <= {last}
      ORDER BY r.sequence OFFSET 0) q"""


def _plan(form: Form) -> str:
    """The plan (``_SEARCH``) and the page's first part in ``form``: at most $6 records from its start,
    as ``fetch_part`` reads them. A page of one part, which most reads are, is then one round trip, and
    a long one's first part is read while it is planned. The part's end is written not to overflow for
    any cursor, as the search's is; for a cursor that is refused it reads nothing or a few records that
    are never served."""
    return f"""{_SEARCH}
SELECT s.stream_key, {streams.columns("s")}, s.timeline, e.page_end, f.data, f.lengths
FROM s CROSS JOIN LATERAL (SELECT min(hi) AS page_end FROM search) e
CROSS JOIN LATERAL ({_aggregate(form, "s.stream_key", "$3", "$3 + least($6::bigint, e.page_end - $3)")}) f
"""


_PLANS: dict[str, str] = {form: _plan(form) for form in _FORMS}  # type: ignore[arg-type]


# a part of a planned page: the records ($2, $3] of stream key $1 (``fetch_part``)
_PARTS: dict[str, str] = {form: _aggregate(form, "$1", "$2", "$3") for form in _FORMS}  # type: ignore[arg-type]


@dataclass(frozen=True)
class Part:
    """Consecutive records in one form: their values joined by the form's separator, and each value's
    length, in sequence order."""

    data: bytes
    lengths: list[int]

    def prefix(self, count: int, separator: bytes) -> Part:
        """Its first ``count`` records (a slice of the joined data: nothing is copied twice)."""
        if count >= len(self.lengths):
            return self
        end = sum(self.lengths[:count]) + len(separator) * max(0, count - 1)
        return Part(self.data[:end], self.lengths[:count])


@dataclass(frozen=True)
class Body:
    """The records after ``after`` in one form (sequences ``after + 1`` on, with no gaps), in parts as
    Postgres joined them, and the stream's bounds and close as its plan saw them."""

    after: int
    parts: list[Part]
    bounds: Bounds
    closed: bool
    form: Form

    @property
    def count(self) -> int:
        return sum(len(part.lengths) for part in self.parts)

    @property
    def next_after(self) -> int:
        return self.after + self.count

    @property
    def separator(self) -> bytes:
        """What goes between two records' values in this form (and between two bodies of one page)."""
        return _FORMS_SEPARATOR[self.form]

    def chunks(self, budget: int) -> Iterator[tuple[int, bytes]]:
        """The records in runs of about ``budget`` bytes of values (at least one record each; a run ends
        with its part at the latest): the last sequence of each run and its values joined by the form's
        separator. Where each run ends is found in the part's running totals (bisect), not record by
        record: a part's data is already joined, so a run is one slice of it."""
        step = len(self.separator)
        last = self.after
        for part in self.parts:
            ends = list(itertools.accumulate(part.lengths))  # bytes of values through each record
            first, offset, before = 0, 0, 0
            while first < len(ends):
                i = min(bisect.bisect_left(ends, before + budget, lo=first), len(ends) - 1)
                end = ends[i] + step * i  # where record i's value ends in the part's data
                yield last + i + 1, part.data[offset:end]
                first, offset, before = i + 1, end + step, ends[i]
            last += len(ends)

    def joined(self, head: bytes = b"", tail: bytes = b"") -> bytes:
        """The values joined by the form's separator, between ``head`` and ``tail``, in one join: a page
        of many megabytes is copied once, and a single part with nothing around it not at all."""
        if len(self.parts) == 1 and not head and not tail:
            return self.parts[0].data
        pieces = [head]
        for part in self.parts:
            if len(pieces) > 1:
                pieces.append(self.separator)
            pieces.append(part.data)
        pieces.append(tail)
        return b"".join(pieces)


_FORMS_SEPARATOR: dict[str, bytes] = {form: separator.encode() for form, (_, separator) in _FORMS.items()}


@dataclass(frozen=True)
class Plan:
    """Where a page after ``after`` ends (``end``; ``after`` itself when nothing follows), and the stream
    as the planning statement saw it."""

    stream_key: int
    after: int
    end: int
    bounds: Bounds
    closed: bool
    pins: StreamPins
    pins_digest: str
    timeline: str
    # the page's first part (``plan`` reads it with the plan; a test's plan may leave it out), and its form
    first: Part | None = None
    form: Form = "records"

    @property
    def count(self) -> int:
        return self.end - self.after

    @property
    def last_sequence(self) -> int | None:
        return self.end if self.end > self.after else None

    def held_back(self, known: int) -> tuple[Plan, int]:
        """This page as far as ``known`` is durable (the head at most ``known``, never below the page's own
        start, and not closed: the close may lie beyond), and how many records were held back."""
        end = min(self.end, max(self.after, known))
        bounds = self.bounds.as_durable_as(known, end)
        first = self.first.prefix(end - self.after, _FORMS_SEPARATOR[self.form]) if self.first else None
        if first is not None and not first.lengths:
            first = None
        return dataclasses.replace(self, end=end, bounds=bounds, closed=False, first=first), self.end - end

    def read_whole(self, form: Form) -> Body | None:
        """The page as one body when its plan read all of it in ``form`` (or it holds no records), else None."""
        if self.count == 0:
            return self.body(form, [])
        if self.first is not None and self.form == form and len(self.first.lengths) == self.count:
            return self.body(form, [self.first])
        return None

    def body(self, form: Form, parts: list[Part], *, after: int | None = None) -> Body:
        """The page's records in ``parts``, those after ``after`` (the page's start unless said): closed
        only if they reach the page's end."""
        after = self.after if after is None else after
        count = sum(len(part.lengths) for part in parts)
        return Body(after, parts, self.bounds, self.closed and after + count == self.end, form)


class PageChanged(Exception):
    """Records of a planned page are gone (pruned, or the stream deleted) since it was planned: plan again."""


async def plan(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    after: int,
    form: Form,
    *,
    max_records: int,
    max_bytes: int,
    first_records: int,
    access: Access | None = None,
) -> Plan:
    """The page of records with sequence > after: at most ``max_records`` and ``max_bytes`` of their
    stored sizes (at least one record), with its first ``first_records`` in ``form`` (``Plan.first``).
    With ``access``, it is checked on the stream's row first, as ``reads.fetch_page`` does; a cursor
    past the latest or pruned is refused here."""
    head = await conn.fetchrow(_PLANS[form], run_id, stream_id, after, max_records, max_bytes, first_records)
    stream = streams.checked(head, access)
    assert head is not None  # checked raises for a missing stream
    check_cursor(after, stream.bounds)
    end = max(after, head["page_end"])
    lengths = head["lengths"]
    # short only if records went in the statement's own snapshot; then read_parts reads it as any part
    whole = end > after and lengths is not None and len(lengths) == min(first_records, end - after)
    first = Part(head["data"], lengths) if whole else None
    return Plan(
        head["stream_key"],
        after,
        end,
        stream.bounds,
        stream.closed,
        stream.pins,
        stream.pins_digest,
        head["timeline"],
        first,
        form,
    )


async def fetch_part(conn: asyncpg.Connection, page: Plan, form: Form, first: int, last: int) -> Part:
    """Records ``first``..``last`` of a planned page in ``form``, as one part. Records are never changed
    once written, only removed from a stream's start (or with the stream), so whatever statement reads
    them reads the same bytes; a record that is gone is ``PageChanged``."""
    data, lengths = await conn.fetchrow(_PARTS[form], page.stream_key, first - 1, last)
    if lengths is None or len(lengths) != last - first + 1:
        raise PageChanged(f"records {first}..{last} are no longer all there")
    return Part(data, lengths)
