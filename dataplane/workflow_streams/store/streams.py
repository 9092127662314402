"""The one stream loader: a ``wfs_streams`` row as a typed value, found (and locked, and authorized) one way.

Every store entry point that acts on one stream starts here, so "no such stream" is one error
(``StreamNotFound``), rights are checked on the row the entry loads anyway (``caller``/``right``), and
no ``asyncpg.Record`` of a stream leaves the store.

One function per question: ``load`` reads a stream by its ids, missing being ``StreamNotFound`` (and,
given a caller, the caller's right checked on the row); ``find`` reads it where a missing stream is not
an error (None; internal work, no rights); ``checked`` applies ``load``'s rules to a row that a caller's
own statement selected along with more; ``row_of`` maps a row known to exist, unchecked.
``store.durable`` answers the same questions for the protocol's streams with its own ``load`` and
``find``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..domain import authz
from ..domain.authz import Access
from ..domain.cursor import Bounds
from ..domain.errors import StreamNotFound
from ..domain.pins import StreamPins
from ..domain.placement import check_egress

# The columns a StreamRow holds, named rather than ``*`` so columns added by later migrations (retention
# due-ness, generated pin columns) neither travel nor change what a load costs.
COLUMNS = (
    "run_id, stream_id, pins, pins_digest, created_at, created_by, last_sequence, appended_bytes,"
    " earliest_sequence, pruned_bytes, closed_at, closed_by"
)


def columns(alias: str) -> str:
    """``COLUMNS`` qualified by a table alias, for queries that join the stream's row with others."""
    return ", ".join(f"{alias}.{name.strip()}" for name in COLUMNS.split(","))


_LOAD = f"SELECT {COLUMNS} FROM wfs_streams WHERE run_id = $1 AND stream_id = $2"
_LOAD_LOCKED = _LOAD + " FOR UPDATE"


@dataclass(frozen=True, slots=True)
class StreamRow:
    """A stream's definition and durable counters as one snapshot of its row."""

    run_id: str
    stream_id: str
    pins: StreamPins
    pins_digest: str
    created_at: dt.datetime
    created_by: str
    last_sequence: int
    appended_bytes: int
    earliest_sequence: int
    pruned_bytes: int
    closed_at: dt.datetime | None
    closed_by: str | None

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    @property
    def bounds(self) -> Bounds:
        return Bounds(earliest=self.earliest_sequence, latest=self.last_sequence)

    def authorize(self, access: Access) -> None:
        authorize(self.pins, access)


def authorize(pins: StreamPins, access: Access) -> None:
    """What every entry point checks on the stream it acts on, before anything else is decided: the
    caller's right (``Forbidden``), then, for a caller that takes data out, its region against the
    egress pins (``PlacementViolation``)."""
    authz.authorize(pins.authorization, access.caller, access.right)
    if access.client_region is not None:
        check_egress(pins, access.client_region)


_PINS_CACHE: dict[str, StreamPins] = {}
_PINS_CACHE_LIMIT = 10_000


def row_pins(row: Mapping[str, Any]) -> StreamPins:
    """The pins of a row selected with its document (``pins`` and ``pins_digest``). Pins are immutable
    and ``pins_digest`` is the content address of the stored document, so the pins read from it
    (upgraded to this release's model) are cached by digest."""
    digest = row["pins_digest"]
    pins = _PINS_CACHE.get(digest)
    if pins is None:
        if len(_PINS_CACHE) >= _PINS_CACHE_LIMIT:
            _PINS_CACHE.clear()
        # a dict through our pool's jsonb codec, text through a plain connection
        pins = StreamPins.read_stored(row["pins"])
        _PINS_CACHE[digest] = pins
    return pins


# by stream key, the document of each digest among them (DISTINCT ON: one row per digest)
_PINS_BY_KEY = """
SELECT DISTINCT ON (pins_digest) pins_digest, pins FROM wfs_streams WHERE stream_key = ANY($1::bigint[])
"""


async def pins_by_digest(conn: asyncpg.Connection, rows: Iterable[Mapping[str, Any]]) -> dict[str, StreamPins]:
    """The pins of rows selected without their document (``stream_key`` and ``pins_digest`` only), by
    digest: from the cache, and what it lacks in one query. For hot statements: the document is the
    row's largest column, and selected with the row it would be decoded in every transaction although
    the cache already holds its pins, so they select the digest and the cache supplies the pins (figures:
    bench/README.md, constants)."""
    found: dict[str, StreamPins] = {}
    missing: list[int] = []
    for row in rows:
        digest = row["pins_digest"]
        pins = _PINS_CACHE.get(digest)
        if pins is not None:
            found[digest] = pins
        elif digest not in found:
            missing.append(row["stream_key"])
    if missing:
        for row in await conn.fetch(_PINS_BY_KEY, missing):
            found[row["pins_digest"]] = row_pins(row)
    return found


def row_of(row: Mapping[str, Any]) -> StreamRow:
    """The row → value mapping, for every query that selects the stream's ``COLUMNS`` (maybe among others)."""
    return StreamRow(
        run_id=row["run_id"],
        stream_id=row["stream_id"],
        pins=row_pins(row),
        pins_digest=row["pins_digest"],
        created_at=row["created_at"],
        created_by=row["created_by"],
        last_sequence=row["last_sequence"],
        appended_bytes=row["appended_bytes"],
        earliest_sequence=row["earliest_sequence"],
        pruned_bytes=row["pruned_bytes"],
        closed_at=row["closed_at"],
        closed_by=row["closed_by"],
    )


async def find(conn: asyncpg.Connection, run_id: str, stream_id: str, *, lock: bool = False) -> StreamRow | None:
    """The stream, or None: for the few callers to whom a missing stream is not an error."""
    row = await conn.fetchrow(_LOAD_LOCKED if lock else _LOAD, run_id, stream_id)
    return row_of(row) if row is not None else None


async def load(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    *,
    lock: bool = False,
    access: Access | None = None,
) -> StreamRow:
    """The stream, or ``StreamNotFound``. ``lock`` takes its row lock (``FOR UPDATE``) for the rest of the
    transaction. With ``access``, it is checked on the loaded row before anything else is decided;
    ``access=None`` is for internal work and for callers that authorized this very stream earlier in the
    same request (a subscription's later pages)."""
    row = await conn.fetchrow(_LOAD_LOCKED if lock else _LOAD, run_id, stream_id)
    return checked(row, access)


def checked(row: Mapping[str, Any] | None, access: Access | None) -> StreamRow:
    """How a fetched row (``COLUMNS``, maybe among others) becomes a stream for a caller: missing is
    ``StreamNotFound``, then ``authorize``. For queries that read the row with more in one statement
    (``reads.fetch_page``, ``durable.load``)."""
    if row is None:
        raise StreamNotFound("no such stream")
    stream = row_of(row)
    if access is not None:
        stream.authorize(access)
    return stream
