"""Stream definitions, their state, close and legal holds.

Every entry point takes its caller and checks the right it needs on the stream row it loads
(``streams.load``); handlers never check rights themselves.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..domain.authz import Access, Caller, permits
from ..domain.errors import Forbidden, PinsConflict, StreamHeld
from ..domain.pins import StreamPins
from ..domain.wakes import Changed, records_changed
from . import db, streams
from .streams import COLUMNS, StreamRow


@dataclass(frozen=True)
class Definition:
    run_id: str
    stream_id: str
    pins: StreamPins
    pins_digest: str
    created_at: dt.datetime
    created_by: str

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "stream_id": self.stream_id,
            "pins": self.pins.canonical(),
            "pins_digest": self.pins_digest,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
        }


@dataclass(frozen=True)
class StreamState:
    last_sequence: int
    earliest_sequence: int
    appended_bytes: int
    closed_at: dt.datetime | None
    closed_by: str | None
    holds: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "last_sequence": self.last_sequence,
            "earliest_sequence": self.earliest_sequence,
            "appended_bytes": self.appended_bytes,
            "closed": self.closed_at is not None,
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
            "closed_by": self.closed_by,
            "legal_hold": bool(self.holds),
            "legal_holds": self.holds,
        }


def _definition(row: StreamRow) -> Definition:
    return Definition(
        run_id=row.run_id,
        stream_id=row.stream_id,
        pins=row.pins,
        pins_digest=row.pins_digest,
        created_at=row.created_at,
        created_by=row.created_by,
    )


async def create_definition(
    conn: asyncpg.Connection, run_id: str, stream_id: str, pins: StreamPins, caller: Caller
) -> tuple[Definition, bool]:
    """Create a definition, or return the existing one if its pins mean the same. True if created.
    Only a caller who may see an existing stream learns of it (``Forbidden`` otherwise, also for a
    conflict): the very answer a stream that does not exist would give."""
    digest = pins.digest()
    row = await conn.fetchrow(
        f"""INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (run_id, stream_id) DO NOTHING
            RETURNING {COLUMNS}""",
        run_id,
        stream_id,
        pins.stored(),
        digest,
        caller.name,
    )
    if row is not None:
        return _definition(streams.row_of(row)), True
    existing = await conn.fetchrow(
        f"SELECT {COLUMNS} FROM wfs_streams WHERE run_id = $1 AND stream_id = $2", run_id, stream_id
    )
    if existing is None:  # deleted between the two statements; the caller may retry
        raise PinsConflict("the stream was deleted while being created; retry")
    stream = streams.row_of(existing)
    if not permits(stream.pins.authorization, caller, "see"):
        raise Forbidden("not visible")
    definition = _definition(stream)
    # Compare meaning: the stored pins read (upgraded, defaults filled in) by the requested pins' model,
    # so a release that adds a pin with a default still finds every older stream's pins the same.
    stored = definition.pins if type(pins) is StreamPins else type(pins).read_stored(existing["pins"])
    if stored.digest() != digest:
        conflict = PinsConflict(
            "a stream with this id exists with different pins; pins are immutable",
            existing_pins_digest=stream.pins_digest,
            requested_pins_digest=digest,
        )
        conflict.existing = definition
        raise conflict
    return definition, False


async def get_stream(
    conn: asyncpg.Connection, run_id: str, stream_id: str, caller: Caller
) -> tuple[Definition, StreamState]:
    stream = await streams.load(conn, run_id, stream_id, access=Access(caller))
    return _definition(stream), await _state(conn, stream)


# THE active-hold predicate (the view of migrations 479 and 481, which retention and the object janitor
# ask too): every question about active holds, whether a stream is held or which holds, reads it.
_HELD = "SELECT EXISTS (SELECT 1 FROM wfs_active_holds WHERE run_id = $1 AND stream_id = $2)"


async def _active_holds(conn: asyncpg.Connection, run_id: str, stream_id: str) -> list[dict[str, Any]]:
    """The stream's active holds with who placed them and why."""
    holds = await conn.fetch(
        """SELECT hold_id, reason, held_by, held_at FROM wfs_active_holds
           WHERE run_id = $1 AND stream_id = $2 ORDER BY held_at, hold_id""",
        run_id,
        stream_id,
    )
    return [{**dict(h), "held_at": h["held_at"].isoformat()} for h in holds]


def _state_of(stream: StreamRow, holds: list[dict[str, Any]]) -> StreamState:
    return StreamState(
        last_sequence=stream.last_sequence,
        earliest_sequence=stream.earliest_sequence,
        appended_bytes=stream.appended_bytes,
        closed_at=stream.closed_at,
        closed_by=stream.closed_by,
        holds=holds,
    )


async def _state(conn: asyncpg.Connection, stream: StreamRow) -> StreamState:
    return _state_of(stream, await _active_holds(conn, stream.run_id, stream.stream_id))


async def close_stream(conn: asyncpg.Connection, run_id: str, stream_id: str, caller: Caller) -> Changed[StreamState]:
    """Close the stream (idempotent): appends are refused from now on, and followers drain what it
    holds and then see the close, once this commits."""
    async with db.transaction(conn):
        stream = await streams.load(conn, run_id, stream_id, lock=True, access=Access(caller, "close"))
        if stream.closed_at is None:
            row = await conn.fetchrow(
                f"""UPDATE wfs_streams SET closed_at = now(), closed_by = $3
                    WHERE run_id = $1 AND stream_id = $2 RETURNING {COLUMNS}""",
                run_id,
                stream_id,
                caller.name,
            )
            stream = streams.row_of(row)
        return Changed(await _state(conn, stream), (records_changed(run_id, stream_id, stream.last_sequence),))


async def set_legal_hold(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    hold_id: str,
    enabled: bool,
    reason: str,
    caller: Caller,
) -> StreamState:
    """Place or release one hold, recording who and when. Holds stack; the stream is held while any is
    active. ``caller`` needs the ``legal_hold`` right (the operator passes ``Trusted``: Kubernetes RBAC
    on StreamLegalHold objects authorized it)."""
    async with db.transaction(conn):
        stream = await streams.load(conn, run_id, stream_id, lock=True, access=Access(caller, "legal_hold"))
        if enabled:
            await conn.execute(
                """INSERT INTO wfs_legal_holds (run_id, stream_id, hold_id, reason, held_by)
                   VALUES ($1, $2, $3, $4, $5)
                   ON CONFLICT (run_id, stream_id, hold_id) DO UPDATE
                   SET reason = excluded.reason, held_by = excluded.held_by, held_at = now(),
                       released_by = NULL, released_at = NULL
                   WHERE wfs_legal_holds.released_at IS NOT NULL OR wfs_legal_holds.reason <> excluded.reason""",
                run_id,
                stream_id,
                hold_id,
                reason,
                caller.name,
            )
        else:
            await conn.execute(
                """UPDATE wfs_legal_holds SET released_by = $4, released_at = now()
                   WHERE run_id = $1 AND stream_id = $2 AND hold_id = $3 AND released_at IS NULL""",
                run_id,
                stream_id,
                hold_id,
                caller.name,
            )
        return await _state(conn, stream)


# The stream row and its records in one statement: records hold no foreign key to their stream (migration
# 484), so this is the one place that removes a stream's records with it. The row is locked already, so
# no append commits a record for it after this statement's snapshot.
_DELETE = """
WITH stream AS (DELETE FROM wfs_streams WHERE run_id = $1 AND stream_id = $2 RETURNING stream_key)
DELETE FROM wfs_records r USING stream s WHERE r.stream_key = s.stream_key
"""


async def delete_stream(
    conn: asyncpg.Connection, run_id: str, stream_id: str, caller: Caller
) -> Changed[list[tuple[str, str, str]]]:
    """Close and delete a stream; its objects go to the deletion outbox (which outlives the stream).
    Refused while a legal hold exists. Answers the (region, bucket, key) queued for deletion; open
    subscriptions see the stream end once this commits. Deleting ends the stream for everyone:
    ``caller`` needs the right that ends streams (``close``)."""
    async with db.transaction(conn):
        stream = await streams.find(conn, run_id, stream_id, lock=True)
        if stream is None:
            return Changed([])
        stream.authorize(Access(caller, "close"))
        if await conn.fetchval(_HELD, run_id, stream_id):
            holds = len(await _active_holds(conn, run_id, stream_id))  # for the answer only
            raise StreamHeld(f"{holds} legal hold(s) exist; the stream cannot be deleted", holds=holds)
        queued = await conn.fetch(
            """INSERT INTO wfs_deletion_outbox (run_id, stream_id, region, bucket, object_key, reason)
               SELECT $1, $2, region, bucket, object_key, 'stream_deleted' FROM wfs_object_intents
               WHERE run_id = $1 AND stream_id = $2 AND state IN ('prepared', 'uploaded', 'committed')
               RETURNING region, bucket, object_key""",
            run_id,
            stream_id,
        )
        await conn.execute(_DELETE, run_id, stream_id)
        queued_keys = [(r["region"], r["bucket"], r["object_key"]) for r in queued]
        return Changed(queued_keys, (records_changed(run_id, stream_id),))


@dataclass(frozen=True)
class Listing:
    streams: list[tuple[Definition, StreamState]]
    # the last stream of this page when a visible stream follows it; None on the last page
    next_after: str | None


# stream rows read per statement while filling a listing page
LIST_SCAN = 100


async def list_streams(conn: asyncpg.Connection, run_id: str, after: str, limit: int, caller: Caller) -> Listing:
    """The run's streams ``caller`` may see, in stream id order, ``limit`` at a time after ``after``.

    Streams it may not see are skipped without a trace: a page is filled from visible streams only and
    ``next_after`` is the last stream on it, so the cursor never names a stream the caller cannot see
    and every page but the last holds at least one stream (pagination always makes progress).
    """
    scan = max(limit + 1, LIST_SCAN)
    visible: list[tuple[Definition, StreamState]] = []
    cursor, exhausted = after, False
    while len(visible) <= limit and not exhausted:
        rows = await _list_page(conn, run_id, cursor, scan)
        visible += [(d, s) for d, s in rows if permits(d.pins.authorization, caller, "see")]
        exhausted = len(rows) < scan
        if rows:
            cursor = rows[-1][0].stream_id
    page = visible[:limit]
    # one visible stream past the page proves there is a next page
    return Listing(page, page[-1][0].stream_id if len(visible) > limit else None)


async def _list_page(
    conn: asyncpg.Connection, run_id: str, after: str, limit: int
) -> list[tuple[Definition, StreamState]]:
    """A run's streams with ``stream_id > after`` in ``stream_id`` order (keyset pagination on the primary
    key), each with its state and active holds."""
    rows = await conn.fetch(
        """SELECT s.*, h.hold_ids, h.reasons, h.held_bys, h.held_ats
           FROM wfs_streams s
           LEFT JOIN LATERAL (
               SELECT array_agg(l.hold_id ORDER BY l.held_at, l.hold_id) AS hold_ids,
                      array_agg(l.reason ORDER BY l.held_at, l.hold_id) AS reasons,
                      array_agg(l.held_by ORDER BY l.held_at, l.hold_id) AS held_bys,
                      array_agg(l.held_at ORDER BY l.held_at, l.hold_id) AS held_ats
               FROM wfs_active_holds l
               WHERE l.run_id = s.run_id AND l.stream_id = s.stream_id
           ) h ON true
           WHERE s.run_id = $1 AND s.stream_id > $2
           ORDER BY s.stream_id
           LIMIT $3""",
        run_id,
        after,
        limit,
    )
    out = []
    for row in rows:
        columns = (row["hold_ids"], row["reasons"], row["held_bys"], row["held_ats"])
        holds = zip(*(column or () for column in columns), strict=True)
        stream = streams.row_of(row)
        state = _state_of(
            stream,
            [
                {"hold_id": hold_id, "reason": reason, "held_by": held_by, "held_at": held_at.isoformat()}
                for hold_id, reason, held_by, held_at in holds
            ],
        )
        out.append((_definition(stream), state))
    return out
