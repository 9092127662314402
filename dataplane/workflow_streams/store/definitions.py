"""Stream definitions, their state, close and legal holds."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..domain.authz import Principal, require
from ..domain.errors import PinsConflict, StreamHeld, StreamNotFound
from ..domain.pins import StreamPins
from ..domain.wakes import RECORDS, Signal
from . import notify


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


_PINS_CACHE: dict[str, StreamPins] = {}
_PINS_CACHE_LIMIT = 10_000


def pins_of(row: asyncpg.Record) -> StreamPins:
    """Pins are immutable and ``pins_digest`` is the content address of the stored document, so the
    pins read from it (upgraded to this release's model) are cached by digest."""
    digest = row["pins_digest"]
    pins = _PINS_CACHE.get(digest)
    if pins is None:
        if len(_PINS_CACHE) >= _PINS_CACHE_LIMIT:
            _PINS_CACHE.clear()
        # a dict through our pool's jsonb codec, text through a plain connection
        pins = StreamPins.read_stored(row["pins"])
        _PINS_CACHE[digest] = pins
    return pins


def _definition(row: asyncpg.Record) -> Definition:
    return Definition(
        run_id=row["run_id"],
        stream_id=row["stream_id"],
        pins=pins_of(row),
        pins_digest=row["pins_digest"],
        created_at=row["created_at"],
        created_by=row["created_by"],
    )


async def create_definition(
    conn: asyncpg.Connection, run_id: str, stream_id: str, pins: StreamPins, creator: str
) -> tuple[Definition, bool]:
    """Create a definition, or return the existing one if its pins mean the same. True if created.
    Callers decide who may see an existing definition."""
    digest = pins.digest()
    row = await conn.fetchrow(
        """INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (run_id, stream_id) DO NOTHING
           RETURNING *""",
        run_id,
        stream_id,
        pins.stored(),
        digest,
        creator,
    )
    if row is not None:
        return _definition(row), True
    existing = await conn.fetchrow("SELECT * FROM wfs_streams WHERE run_id = $1 AND stream_id = $2", run_id, stream_id)
    if existing is None:  # deleted between the two statements; the caller may retry
        raise PinsConflict("the stream was deleted while being created; retry")
    definition = _definition(existing)
    # Compare meaning: the stored pins read (upgraded, defaults filled in) by the requested pins' model,
    # so a release that adds a pin with a default still finds every older stream's pins the same.
    stored = definition.pins if type(pins) is StreamPins else type(pins).read_stored(existing["pins"])
    if stored.digest() != digest:
        conflict = PinsConflict(
            "a stream with this id exists with different pins; pins are immutable",
            existing_pins_digest=existing["pins_digest"],
            requested_pins_digest=digest,
        )
        conflict.existing = definition  # so callers can decide who may learn of it
        raise conflict
    return definition, False


async def get_stream(conn: asyncpg.Connection, run_id: str, stream_id: str) -> tuple[Definition, StreamState]:
    row = await conn.fetchrow("SELECT * FROM wfs_streams WHERE run_id = $1 AND stream_id = $2", run_id, stream_id)
    if row is None:
        raise StreamNotFound("no such stream")
    return _definition(row), await _state(conn, row)


async def _state(conn: asyncpg.Connection, row: asyncpg.Record) -> StreamState:
    holds = await conn.fetch(
        """SELECT hold_id, reason, held_by, held_at FROM wfs_legal_holds
           WHERE run_id = $1 AND stream_id = $2 AND released_at IS NULL ORDER BY held_at, hold_id""",
        row["run_id"],
        row["stream_id"],
    )
    return StreamState(
        last_sequence=row["last_sequence"],
        earliest_sequence=row["earliest_sequence"],
        appended_bytes=row["appended_bytes"],
        closed_at=row["closed_at"],
        closed_by=row["closed_by"],
        holds=[{**dict(h), "held_at": h["held_at"].isoformat()} for h in holds],
    )


async def lock_stream(conn: asyncpg.Connection, run_id: str, stream_id: str) -> asyncpg.Record:
    """The stream row, locked for the rest of the transaction."""
    row = await conn.fetchrow(
        "SELECT * FROM wfs_streams WHERE run_id = $1 AND stream_id = $2 FOR UPDATE", run_id, stream_id
    )
    if row is None:
        raise StreamNotFound("no such stream")
    return row


async def close_stream(conn: asyncpg.Connection, run_id: str, stream_id: str, principal: Principal) -> StreamState:
    async with conn.transaction():
        row = await lock_stream(conn, run_id, stream_id)
        require(pins_of(row).authorization, principal, "close")
        if row["closed_at"] is None:
            row = await conn.fetchrow(
                """UPDATE wfs_streams SET closed_at = now(), closed_by = $3
                   WHERE run_id = $1 AND stream_id = $2 RETURNING *""",
                run_id,
                stream_id,
                principal.name,
            )
            # the caller wakes subscribers after COMMIT: they drain and then see the close
        return await _state(conn, row)


async def set_legal_hold(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    hold_id: str,
    enabled: bool,
    reason: str,
    actor: str,
) -> StreamState:
    """Place or release one hold, recording who and when. Holds stack; the stream is held while any is
    active. Callers authorize ``actor`` (the HTTP layer by the pins, the operator by Kubernetes RBAC)."""
    async with conn.transaction():
        row = await lock_stream(conn, run_id, stream_id)
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
                actor,
            )
        else:
            await conn.execute(
                """UPDATE wfs_legal_holds SET released_by = $4, released_at = now()
                   WHERE run_id = $1 AND stream_id = $2 AND hold_id = $3 AND released_at IS NULL""",
                run_id,
                stream_id,
                hold_id,
                actor,
            )
        return await _state(conn, row)


async def delete_stream(conn: asyncpg.Connection, run_id: str, stream_id: str) -> list[tuple[str, str, str]]:
    """Close and delete a stream; its objects go to the deletion outbox (which outlives the stream).
    Refused while a legal hold exists. Returns the (region, bucket, key) queued for deletion."""
    async with conn.transaction():
        row = await conn.fetchrow(
            "SELECT * FROM wfs_streams WHERE run_id = $1 AND stream_id = $2 FOR UPDATE", run_id, stream_id
        )
        if row is None:
            return []
        holds = await conn.fetchval(
            """SELECT count(*) FROM wfs_legal_holds
               WHERE run_id = $1 AND stream_id = $2 AND released_at IS NULL""",
            run_id,
            stream_id,
        )
        if holds:
            raise StreamHeld(f"{holds} legal hold(s) exist; the stream cannot be deleted", holds=holds)
        queued = await conn.fetch(
            """INSERT INTO wfs_deletion_outbox (run_id, stream_id, region, bucket, object_key, reason)
               SELECT $1, $2, region, bucket, object_key, 'stream_deleted' FROM wfs_object_intents
               WHERE run_id = $1 AND stream_id = $2 AND state IN ('prepared', 'uploaded', 'committed')
               RETURNING region, bucket, object_key""",
            run_id,
            stream_id,
        )
        await conn.execute("DELETE FROM wfs_streams WHERE run_id = $1 AND stream_id = $2", run_id, stream_id)
        # open subscriptions see the stream end (delivered by Postgres after COMMIT; deletes are rare,
        # so paying the notify lock here is fine)
        await notify.send(conn, [Signal(RECORDS, run_id, stream_id)], sender="delete")
        return [(r["region"], r["bucket"], r["object_key"]) for r in queued]


async def list_streams(
    conn: asyncpg.Connection, run_id: str, after: str, limit: int
) -> list[tuple[Definition, StreamState]]:
    """A run's streams with ``stream_id > after`` in ``stream_id`` order (keyset pagination on the primary
    key), each with its state and active holds. Callers decide who may see which."""
    rows = await conn.fetch(
        """SELECT s.*, h.hold_ids, h.reasons, h.held_bys, h.held_ats
           FROM wfs_streams s
           LEFT JOIN LATERAL (
               SELECT array_agg(l.hold_id ORDER BY l.held_at, l.hold_id) AS hold_ids,
                      array_agg(l.reason ORDER BY l.held_at, l.hold_id) AS reasons,
                      array_agg(l.held_by ORDER BY l.held_at, l.hold_id) AS held_bys,
                      array_agg(l.held_at ORDER BY l.held_at, l.hold_id) AS held_ats
               FROM wfs_legal_holds l
               WHERE l.run_id = s.run_id AND l.stream_id = s.stream_id AND l.released_at IS NULL
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
        state = StreamState(
            last_sequence=row["last_sequence"],
            earliest_sequence=row["earliest_sequence"],
            appended_bytes=row["appended_bytes"],
            closed_at=row["closed_at"],
            closed_by=row["closed_by"],
            holds=[
                {"hold_id": hold_id, "reason": reason, "held_by": held_by, "held_at": held_at.isoformat()}
                for hold_id, reason, held_by, held_at in holds
            ],
        )
        out.append((_definition(row), state))
    return out
