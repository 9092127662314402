"""Stream definitions, their state, close and legal holds.

Every entry point takes its caller and checks the right it needs on the stream row it loads
(``streams.load``); handlers never check rights themselves.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..domain import credit
from ..domain.authz import Access, Caller, Principal, Trusted, caller_subjects, permits, seen_by
from ..domain.errors import Forbidden, InvalidDefinition, OwnedElsewhere, PinsConflict, StreamHeld, StreamNotFound
from ..domain.ownership import Owner, check_claim, check_run
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


@dataclass(frozen=True)
class StreamDetail:
    """What a person asks when a producer is blocked or a consumer lags: the stream's unread window
    against its ceilings (the very numbers credit is decided from), each consumer's position, input
    deliveries by state, objects being uploaded, and who owns the stream."""

    state: StreamState
    usage: credit.Usage
    pins: StreamPins
    consumers: list[dict[str, Any]]
    deliveries: dict[str, int] | None  # input streams only
    objects_in_flight: dict[str, int]
    owner: Owner | None

    def to_json(self) -> dict[str, Any]:
        ceilings = self.pins.credit
        usage = self.usage
        last = self.state.last_sequence
        return {
            **self.state.to_json(),
            "unread": {
                "items": usage.unread_items,
                "bytes": usage.unread_bytes,
                "max_items": ceilings.max_unread_items,
                "max_bytes": ceilings.max_unread_bytes,
                # unread starts after the slowest consumer's ack (or what retention pruned)
                "after_sequence": usage.base_sequence,
                "full": usage.unread_items >= ceilings.max_unread_items
                or usage.unread_bytes >= ceilings.max_unread_bytes,
            },
            "total": {
                "items": last,
                "bytes": usage.appended_bytes,
                "max_items": ceilings.max_total_items,
                "max_bytes": ceilings.max_total_bytes,
            },
            "consumers": [{**c, "lag": last - c["acked_sequence"]} for c in self.consumers],
            "deliveries": self.deliveries,
            "objects_in_flight": self.objects_in_flight,
            "owner": self.owner.to_json() if self.owner is not None else None,
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


# THE active-hold predicate (the view of migrations 479 and 481, which retention and the object janitor
# ask too): every question about active holds, whether a stream is held or which holds, reads it.
_HELD = "SELECT EXISTS (SELECT 1 FROM wfs_active_holds WHERE run_id = $1 AND stream_id = $2)"


_INSERT = f"""
INSERT INTO wfs_streams
    (run_id, stream_id, pins, pins_digest, created_by, owner_namespace, owner_name, owner_uid, seen_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (run_id, stream_id) DO NOTHING
RETURNING {COLUMNS}"""
_EXISTING = (
    f"SELECT {COLUMNS}, owner_namespace, owner_name, owner_uid FROM wfs_streams WHERE run_id = $1 AND stream_id = $2"
)
_EXISTING_LOCKED = _EXISTING + " FOR UPDATE"
# the namespace a run belongs to (domain.ownership): any other namespace owning one of its streams
_RUN_OWNER = """SELECT owner_namespace FROM wfs_streams
WHERE run_id = $1 AND owner_namespace IS NOT NULL AND owner_namespace <> $2 LIMIT 1"""
# a transaction-level lock on one run: two namespaces defining a run's first streams at once are
# decided one after the other, so a run never ends up with two owning namespaces
_LOCK_RUN = "SELECT pg_advisory_xact_lock(hashtextextended('wfs-run:' || $1, 0))"


def _owner(row: Mapping[str, Any] | None) -> Owner | None:
    if row is None or row["owner_uid"] is None:
        return None
    return Owner(row["owner_namespace"], row["owner_name"], row["owner_uid"])


def _claimant(caller: Caller) -> Owner | None:
    return caller.owner if isinstance(caller, Trusted) else None


async def create_definition(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    pins: StreamPins,
    caller: Caller,
    *,
    refusal: InvalidDefinition | None = None,
    adopt: bool = False,
) -> tuple[Definition, bool]:
    """Create a definition, or return the existing one if its pins mean the same. True if created.

    Only a caller who may see an existing stream learns of it (``Forbidden`` otherwise, also for a
    conflict): the very answer a stream that does not exist would give. ``refusal`` (``domain.admission``)
    refuses a new stream but still answers an identical existing one, which an earlier release may have
    stored. A caller acting for a WorkflowStream (``Trusted.owner``) first passes the ownership rules
    (``domain.ownership``): its namespace owns the run, and the stream is its own, or new, or adopted
    (``adopt``) from the HTTP API."""
    claimant = _claimant(caller)
    async with db.transaction(conn):
        if claimant is not None:
            await conn.execute(_LOCK_RUN, run_id)
            check_run(run_id, await conn.fetchval(_RUN_OWNER, run_id, claimant.namespace), claimant)
        digest = pins.digest()
        if refusal is None:
            owner = (claimant.namespace, claimant.name, claimant.uid) if claimant is not None else (None, None, None)
            row = await conn.fetchrow(
                _INSERT, run_id, stream_id, pins.stored(), digest, caller.name, *owner, seen_by(pins.authorization)
            )
            if row is not None:
                return _definition(streams.row_of(row)), True
        # a claimant may record itself as owner below: it holds the row meanwhile (others only read it)
        existing = await conn.fetchrow(_EXISTING_LOCKED if claimant is not None else _EXISTING, run_id, stream_id)
        if existing is None:
            if refusal is not None:
                raise refusal
            raise PinsConflict("the stream was deleted while being created; retry")  # the caller may retry
        stream = streams.row_of(existing)
        adopting = False
        if claimant is not None:
            # a stream this same caller made before owners were recorded (the operator of an earlier
            # release) is its own to claim: the first of its objects to reconcile records itself
            made_by_it = stream.created_by == caller.name
            adopting = check_claim(f"{run_id}/{stream_id}", _owner(existing), claimant, adopt=adopt or made_by_it)
        elif not permits(stream.pins.authorization, caller, "see"):
            raise Forbidden("not visible")
        definition = _definition(stream)
        # Compare meaning: the stored pins read (upgraded, defaults filled in) by the requested pins' model,
        # so a release that adds a pin with a default still finds every older stream's pins the same.
        stored = definition.pins if type(pins) is StreamPins else type(pins).read_stored(existing["pins"])
        if stored.digest() != digest:
            differing = differences(stored.canonical(), pins.canonical())
            conflict = PinsConflict(
                f"a stream with this id exists with different pins ({', '.join(differing)}); pins are immutable",
                existing_pins_digest=stream.pins_digest,
                requested_pins_digest=digest,
                differing_fields=differing,
            )
            conflict.existing = definition
            raise conflict
        if adopting and claimant is not None:
            await conn.execute(
                """UPDATE wfs_streams SET owner_namespace = $3, owner_name = $4, owner_uid = $5
                   WHERE run_id = $1 AND stream_id = $2""",
                run_id,
                stream_id,
                claimant.namespace,
                claimant.name,
                claimant.uid,
            )
        return definition, False


@dataclass(frozen=True)
class Ownership:
    """Whether a stream exists, who owns it and whether it is held: what the operator mirrors into an
    object's conditions between reconciles."""

    exists: bool
    owner: Owner | None = None
    held: bool = False


_OWNERSHIP = f"""SELECT owner_namespace, owner_name, owner_uid, ({_HELD}) AS held
FROM wfs_streams WHERE run_id = $1 AND stream_id = $2"""


async def ownership(conn: asyncpg.Connection, run_id: str, stream_id: str) -> Ownership:
    row = await conn.fetchrow(_OWNERSHIP, run_id, stream_id)
    if row is None:
        return Ownership(False)
    return Ownership(True, _owner(row), row["held"])


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    """The paths (``credit/max_unread_items``) at which two canonical pins documents differ."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            found += differences(before.get(key), after.get(key), f"{path}/{key}" if path else key)
        return found
    return [] if before == after else [path or "/"]


# The active holds of the stream aliased ``s`` as arrays (``_holds`` reads them), oldest first.
_HOLDS = """LEFT JOIN LATERAL (
    SELECT array_agg(l.hold_id ORDER BY l.held_at, l.hold_id) AS hold_ids,
           array_agg(l.reason ORDER BY l.held_at, l.hold_id) AS reasons,
           array_agg(l.held_by ORDER BY l.held_at, l.hold_id) AS held_bys,
           array_agg(l.held_at ORDER BY l.held_at, l.hold_id) AS held_ats
    FROM wfs_active_holds l
    WHERE l.run_id = s.run_id AND l.stream_id = s.stream_id
) h ON true"""

# A stream's row with everything its page shows, in one statement: its holds, its consumers (slowest
# first), the cumulative bytes through the slowest ack (what credit subtracts), its input deliveries and
# object intents by state, and its owner.
_DETAIL = f"""
SELECT {streams.columns("s")}, s.owner_namespace, s.owner_name, s.owner_uid,
    h.hold_ids, h.reasons, h.held_bys, h.held_ats,
    (SELECT coalesce(jsonb_agg(jsonb_build_object('consumer_id', c.consumer_id, 'acked_sequence', c.acked_sequence,
                                                  'updated_at', c.updated_at, 'updated_by', c.updated_by)
                               ORDER BY c.acked_sequence, c.consumer_id), '[]')
     FROM wfs_consumers c WHERE c.run_id = s.run_id AND c.stream_id = s.stream_id) AS consumers,
    m.min_ack,
    (SELECT r.cumulative_bytes FROM wfs_records r
     WHERE r.stream_key = s.stream_key AND r.sequence = m.min_ack) AS ack_bytes,
    (SELECT coalesce(jsonb_object_agg(d.state, d.n), '{{}}')
     FROM (SELECT state, count(*) AS n FROM wfs_input_deliveries
           WHERE run_id = s.run_id AND stream_id = s.stream_id GROUP BY state) d) AS deliveries,
    (SELECT coalesce(jsonb_object_agg(o.state, o.n), '{{}}')
     FROM (SELECT state, count(*) AS n FROM wfs_object_intents
           WHERE run_id = s.run_id AND stream_id = s.stream_id AND state IN ('prepared', 'uploaded')
           GROUP BY state) o) AS objects
FROM wfs_streams s
{_HOLDS}
LEFT JOIN LATERAL (
    SELECT min(acked_sequence) AS min_ack FROM wfs_consumers WHERE run_id = s.run_id AND stream_id = s.stream_id
) m ON true
WHERE s.run_id = $1 AND s.stream_id = $2
"""


def _json(value: Any) -> Any:
    """A jsonb value from our pool (decoded by its codec) or a plain connection (text)."""
    return json.loads(value) if isinstance(value, str) else value


async def get_stream(
    conn: asyncpg.Connection, run_id: str, stream_id: str, caller: Caller
) -> tuple[Definition, StreamDetail]:
    row = await conn.fetchrow(_DETAIL, run_id, stream_id)
    stream = streams.checked(row, Access(caller))
    holds = _holds(row)
    usage = credit.Usage.of(
        stream.last_sequence,
        stream.appended_bytes,
        row["min_ack"],
        stream.earliest_sequence,
        stream.pruned_bytes,
        row["ack_bytes"],
    )
    deliveries = _json(row["deliveries"])
    detail = StreamDetail(
        state=_state_of(stream, holds),
        usage=usage,
        pins=stream.pins,
        consumers=_json(row["consumers"]),
        deliveries={state: deliveries.get(state, 0) for state in ("pending", "delivered", "failed")}
        if stream.pins.direction == "input"
        else None,
        objects_in_flight={state: _json(row["objects"]).get(state, 0) for state in ("prepared", "uploaded")},
        owner=_owner(row),
    )
    return _definition(stream), detail


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
    on StreamLegalHold objects authorized it, for the WorkflowStream it names, which must own the
    stream)."""
    async with db.transaction(conn):
        row = await conn.fetchrow(_EXISTING_LOCKED, run_id, stream_id)
        stream = streams.checked(row, Access(caller, "legal_hold"))
        claimant = _claimant(caller)
        if claimant is not None:  # a StreamLegalHold reaches only the stream its WorkflowStream owns
            check_claim(f"{run_id}/{stream_id}", _owner(row), claimant, adopt=False)
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
    subscriptions see the stream end once this commits. ``caller`` needs the ``delete`` right; acting
    for a WorkflowStream, the stream must be that object's (``OwnedElsewhere`` otherwise), and a
    principal cannot delete a stream an object owns (the object would stay, claiming nothing). A stream
    that is not there is nothing to do for the operator, and ``StreamNotFound`` for a principal."""
    async with db.transaction(conn):
        row = await conn.fetchrow(_EXISTING_LOCKED, run_id, stream_id)
        if row is None:
            if isinstance(caller, Principal):
                raise StreamNotFound("no such stream")
            return Changed([])
        streams.checked(row, Access(caller, "delete"))
        owner = _owner(row)
        claimant = _claimant(caller)
        if claimant is not None:
            check_claim(f"{run_id}/{stream_id}", owner, claimant, adopt=False)
        elif owner is not None and isinstance(caller, Principal):
            raise OwnedElsewhere(
                f"stream {run_id}/{stream_id} belongs to {owner.describe()}: delete that object"
                f" (kubectl delete wfs {owner.name} -n {owner.namespace})",
                owner=owner.to_json(),
            )
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


def _subjects(caller: Caller) -> list[str] | None:
    """What ``seen_by`` must share with a caller's subjects for it to see a stream; None: sees all."""
    return caller_subjects(caller) if isinstance(caller, Principal) else None


async def list_streams(conn: asyncpg.Connection, run_id: str, after: str, limit: int, caller: Caller) -> Listing:
    """The run's streams ``caller`` may see, in stream id order, ``limit`` at a time after ``after``.

    Streams it may not see are skipped without a trace: the statement selects visible streams only
    (``seen_by``, migration 489: the subjects that may see each stream) and ``next_after`` is the last
    stream on the page, so the cursor never names a stream the caller cannot see.
    """
    rows = await conn.fetch(_LIST, run_id, after, limit + 1, _subjects(caller))
    listed = [(streams.row_of(row), row) for row in rows]
    # the rows passed the SQL writing of the rule; the domain's has the last word
    visible = [
        (_definition(stream), _state_of(stream, _holds(row)))
        for stream, row in listed
        if permits(stream.pins.authorization, caller, "see")
    ]
    page = visible[:limit]
    return Listing(page, page[-1][0].stream_id if len(rows) > limit else None)


# A run's streams with ``stream_id > $2`` in ``stream_id`` order (keyset pagination on the primary key),
# each with its active holds, only those whose ``seen_by`` meets the caller's subjects ($4; NULL: all).
_LIST = f"""
SELECT {streams.columns("s")}, h.hold_ids, h.reasons, h.held_bys, h.held_ats
FROM wfs_streams s
{_HOLDS}
WHERE s.run_id = $1 AND s.stream_id > $2 AND ($4::text[] IS NULL OR s.seen_by && $4::text[])
ORDER BY s.stream_id
LIMIT $3
"""


def _holds(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    columns = (row["hold_ids"], row["reasons"], row["held_bys"], row["held_ats"])
    return [
        {"hold_id": hold_id, "reason": reason, "held_by": held_by, "held_at": held_at.isoformat()}
        for hold_id, reason, held_by, held_at in zip(*(column or () for column in columns), strict=True)
    ]


@dataclass(frozen=True)
class RunListing:
    # (run_id, streams the caller may see in it, when the newest of them was created)
    runs: list[dict[str, Any]]
    next_after: str | None


# The runs in which the caller may see a stream, in run id order after $1, with how many streams it sees.
_RUNS = """
SELECT run_id, count(*) AS streams, max(created_at) AS latest_created_at
FROM wfs_streams
WHERE run_id > $1 AND ($3::text[] IS NULL OR seen_by && $3::text[])
GROUP BY run_id
ORDER BY run_id
LIMIT $2
"""


async def list_runs(conn: asyncpg.Connection, after: str, limit: int, caller: Caller) -> RunListing:
    """The runs ``caller`` may see something in, ``limit`` at a time after run ``after``."""
    rows = await conn.fetch(_RUNS, after, limit + 1, _subjects(caller))
    runs = [
        {"run_id": r["run_id"], "streams": r["streams"], "latest_created_at": r["latest_created_at"].isoformat()}
        for r in rows[:limit]
    ]
    return RunListing(runs, runs[-1]["run_id"] if len(rows) > limit else None)
