"""Object intents (prepare -> upload -> commit, or abort / expiry) and the deletion outbox."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..domain.authz import Access, Principal, authorize, matching_subject
from ..domain.credit import check_object
from ..domain.errors import (
    IdempotencyKeyReused,
    IntentExpired,
    IntentState,
    NotFound,
    ObjectEvidenceMismatch,
    StreamClosed,
)
from ..domain.objects import ObjectPins, Prepared, can_move, choose_region, object_json, object_key
from ..domain.records import RecordIn
from ..domain.wakes import Changed
from . import db, streams
from .appends import AppendResult, append_locked


@dataclass(frozen=True, slots=True)
class Intent:
    """An object intent as the store hands it out (never a raw row)."""

    intent_id: str
    state: str
    run_id: str
    stream_id: str
    idempotency_key: str
    region: str
    bucket: str
    object_key: str
    sha256: str
    size: int
    content_type: str
    schema_ref: str | None
    authorization_receipt: dict[str, Any]
    expires_at: dt.datetime
    committed_sequence: int | None
    s3_checksum: str | None

    @property
    def prepared(self) -> Prepared:
        return Prepared(self.sha256, self.size, self.content_type, self.schema_ref, self.region)

    def to_json(self) -> dict[str, Any]:
        return {
            "intent_id": self.intent_id,
            "state": self.state,
            "run_id": self.run_id,
            "stream_id": self.stream_id,
            "idempotency_key": self.idempotency_key,
            "region": self.region,
            "bucket": self.bucket,
            "object_key": self.object_key,
            "sha256": self.sha256,
            "size": self.size,
            "content_type": self.content_type,
            "schema_ref": self.schema_ref,
            "authorization_receipt": self.authorization_receipt,
            "expires_at": self.expires_at.isoformat(),
            "committed_sequence": self.committed_sequence,
        }


def _intent(row: asyncpg.Record) -> Intent:
    """The row → value mapping of ``wfs_object_intents``: the only place that knows its column names."""
    return Intent(
        intent_id=str(row["intent_id"]),
        state=row["state"],
        run_id=row["run_id"],
        stream_id=row["stream_id"],
        idempotency_key=row["idempotency_key"],
        region=row["region"],
        bucket=row["bucket"],
        object_key=row["object_key"],
        sha256=row["sha256"],
        size=row["size_bytes"],
        content_type=row["content_type"],
        schema_ref=row["schema_ref"],
        authorization_receipt=row["authorization_receipt"],
        expires_at=row["expires_at"],
        committed_sequence=row["committed_sequence"],
        s3_checksum=row["s3_checksum"],
    )


async def prepare(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    pins: ObjectPins,
    principal: Principal,
    bucket_of: Any,
) -> tuple[Intent, bool]:
    """Create the intent, or return the one this idempotency key already made. True if created."""
    async with db.transaction(conn):
        stream = await streams.load(conn, run_id, stream_id, access=Access(principal, "append"))
        if stream.closed:
            raise StreamClosed("the stream is closed; appends are rejected")
        found = await conn.fetchrow(_INTENT_BY_KEY, run_id, stream_id, pins.idempotency_key)
        if found is not None:
            return _same_intent(found, pins), False
        # a new intent: refused now if its object could never be committed, before its bytes are sent
        check_object(stream.pins.credit, pins.size, stream.last_sequence, stream.appended_bytes)
        region = choose_region(pins.region, stream.pins.placement.object_regions)
        intent_id = uuid.uuid4()
        receipt = {
            "principal": principal.name,
            "groups": sorted(principal.groups),
            "action": "append",
            "granted_by": f"authorization.append: {matching_subject(stream.pins.authorization, principal, 'append')}",
            "decided_at": dt.datetime.now(dt.UTC).isoformat(),
            "pins_digest": stream.pins_digest,
        }
        row = await conn.fetchrow(
            """INSERT INTO wfs_object_intents
               (intent_id, run_id, stream_id, idempotency_key, state, region, bucket, object_key, sha256,
                size_bytes, content_type, schema_ref, authorization_receipt, expires_at)
               VALUES ($1, $2, $3, $4, 'prepared', $5, $6, $7, $8, $9, $10, $11, $12,
                       now() + $13::interval)
               ON CONFLICT (run_id, stream_id, idempotency_key) DO NOTHING
               RETURNING *""",
            intent_id,
            run_id,
            stream_id,
            pins.idempotency_key,
            region,
            bucket_of(region),
            object_key(run_id, stream_id, str(intent_id)),
            pins.sha256,
            pins.size,
            pins.content_type,
            pins.schema_ref,
            receipt,
            dt.timedelta(seconds=pins.expires_in_seconds),
        )
        if row is not None:
            return _intent(row), True
        # a concurrent prepare with this key inserted first
        return _same_intent(await conn.fetchrow(_INTENT_BY_KEY, run_id, stream_id, pins.idempotency_key), pins), False


_INTENT_BY_KEY = "SELECT * FROM wfs_object_intents WHERE run_id = $1 AND stream_id = $2 AND idempotency_key = $3"


def _same_intent(row: asyncpg.Record, pins: ObjectPins) -> Intent:
    """The intent an idempotency key already made, if these pins ask for the same object."""
    existing = _intent(row)
    if not pins.same_as(existing.prepared):
        raise IdempotencyKeyReused("this idempotency key prepared a different object")
    return existing


async def get_intent(
    conn: asyncpg.Connection, run_id: str, stream_id: str, intent_id: str, principal: Principal
) -> Intent:
    """The intent, for a caller with the ``append`` right on its stream (the right that made it)."""
    row = await conn.fetchrow(
        f"""SELECT i.*, {_STREAM_PINS} FROM wfs_object_intents i
            JOIN wfs_streams s USING (run_id, stream_id)
            WHERE i.intent_id = $1 AND i.run_id = $2 AND i.stream_id = $3""",
        uuid.UUID(intent_id),
        run_id,
        stream_id,
    )
    if row is None:
        raise NotFound("no such object intent")
    authorize(streams.row_pins(row).authorization, principal, "append")
    return _intent(row)


# the stream's pins beside an intent's columns (the join above), named so they do not clash
_STREAM_PINS = "s.pins, s.pins_digest"


def check_uploadable(intent: Intent, now: dt.datetime) -> None:
    if intent.state not in ("prepared", "uploaded"):
        raise IntentState(f"the intent is {intent.state}; it takes no upload", state=intent.state)
    if intent.expires_at <= now:
        raise IntentExpired("the intent expired; prepare again", expires_at=intent.expires_at.isoformat())


async def mark_uploaded(conn: asyncpg.Connection, intent_id: str, checksum: str) -> Intent:
    """Record S3's checksum; the intent as it now is (an intent aborted or expired meanwhile is left so)."""
    row = await conn.fetchrow(
        """WITH moved AS (
               UPDATE wfs_object_intents SET state = 'uploaded', s3_checksum = $2, updated_at = now()
               WHERE intent_id = $1 AND state IN ('prepared', 'uploaded')
               RETURNING *)
           SELECT * FROM moved
           UNION ALL
           SELECT * FROM wfs_object_intents WHERE intent_id = $1 AND NOT EXISTS (SELECT 1 FROM moved)""",
        uuid.UUID(intent_id),
        checksum,
    )
    if row is None:
        raise NotFound("no such object intent")
    return _intent(row)


async def commit(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    intent_id: str,
    principal: Principal,
    evidence_size: int | None,
    evidence_checksum: str | None,
) -> Changed[AppendResult]:
    """Append the object record if S3's evidence agrees with the intent. A duplicate commit returns the
    original sequence (and changes nothing)."""
    async with db.transaction(conn):
        await streams.load(conn, run_id, stream_id, lock=True, access=Access(principal, "append"))
        intent = await conn.fetchrow(
            "SELECT * FROM wfs_object_intents WHERE intent_id = $1 AND run_id = $2 AND stream_id = $3 FOR UPDATE",
            uuid.UUID(intent_id),
            run_id,
            stream_id,
        )
        if intent is None:
            raise NotFound("no such object intent")
        if intent["state"] == "committed":
            return Changed(AppendResult(intent["committed_sequence"], intent["committed_sequence"], replayed=True))
        if not can_move(intent["state"], "committed"):
            raise IntentState(f"the intent is {intent['state']}; upload before commit", state=intent["state"])
        if intent["expires_at"] <= await conn.fetchval("SELECT now()"):
            raise IntentExpired("the intent expired before commit; prepare again")
        if (evidence_size, evidence_checksum) != (intent["size_bytes"], intent["s3_checksum"]):
            raise ObjectEvidenceMismatch(
                "the object in S3 does not match the intent; nothing was appended",
                expected={"size": intent["size_bytes"], "checksum": intent["s3_checksum"]},
                found={"size": evidence_size, "checksum": evidence_checksum},
            )
        meta = object_json(
            intent["region"],
            intent["bucket"],
            intent["object_key"],
            intent["size_bytes"],
            intent["sha256"],
            intent["content_type"],
            str(intent["intent_id"]),
        )
        result, batch = await append_locked(
            conn, run_id, stream_id, [RecordIn(intent["content_type"], None, meta)], principal
        )
        await conn.execute(
            """UPDATE wfs_object_intents SET state = 'committed', committed_sequence = $2, updated_at = now()
               WHERE intent_id = $1""",
            intent["intent_id"],
            result.first_sequence,
        )
        return Changed(result, tuple(batch.signals()))


async def abort(conn: asyncpg.Connection, run_id: str, stream_id: str, intent_id: str, principal: Principal) -> str:
    """Abort an uncommitted intent; its object goes to the deletion outbox. Returns the final state."""
    async with db.transaction(conn):
        intent = await get_intent(conn, run_id, stream_id, intent_id, principal)
        locked = await conn.fetchrow(
            "SELECT state FROM wfs_object_intents WHERE intent_id = $1 FOR UPDATE", uuid.UUID(intent.intent_id)
        )
        if locked["state"] == "aborted":
            return "aborted"
        if not can_move(locked["state"], "aborted"):
            raise IntentState(f"the intent is {locked['state']}; it cannot be aborted", state=locked["state"])
        await conn.execute(
            "UPDATE wfs_object_intents SET state = 'aborted', updated_at = now() WHERE intent_id = $1",
            uuid.UUID(intent.intent_id),
        )
        await _outbox(conn, run_id, stream_id, intent.region, intent.bucket, intent.object_key, "abort")
        return "aborted"


async def _outbox(
    conn: asyncpg.Connection, run_id: str, stream_id: str, region: str, bucket: str, key: str, reason: str
) -> None:
    await conn.execute(
        """INSERT INTO wfs_deletion_outbox (run_id, stream_id, region, bucket, object_key, reason)
           VALUES ($1, $2, $3, $4, $5, $6)""",
        run_id,
        stream_id,
        region,
        bucket,
        key,
        reason,
    )


async def expire_orphans(conn: asyncpg.Connection, limit: int = 100) -> int:
    """Uncommitted intents past their expiry: mark expired and queue their objects for deletion.
    SKIP LOCKED lets every replica run this without waiting on another."""
    return int(
        await conn.fetchval(
            """WITH expired AS (
                   UPDATE wfs_object_intents SET state = 'expired', updated_at = now()
                   WHERE intent_id IN (
                       SELECT intent_id FROM wfs_object_intents
                       WHERE state IN ('prepared', 'uploaded') AND expires_at < now()
                       ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
                   RETURNING run_id, stream_id, region, bucket, object_key),
               queued AS (
                   INSERT INTO wfs_deletion_outbox (run_id, stream_id, region, bucket, object_key, reason)
                   SELECT run_id, stream_id, region, bucket, object_key, 'expired' FROM expired
                   RETURNING 1)
               SELECT count(*) FROM queued""",
            limit,
        )
    )


# how far ahead the deletions of a held stream are parked: a hold's release brings them back at once
# (the trigger of migration 479); the park only bounds how long a missed release could delay them
HELD_PARK = dt.timedelta(hours=1)

# Due rows in due order through the partial index wfs_deletion_outbox_due (finished rows are not in it).
# Rows of held streams are parked instead of being skipped, so they are not rescanned every interval.
_CLAIM_DELETIONS = """
WITH due AS (
    SELECT o.id, EXISTS (SELECT 1 FROM wfs_active_holds h
                         WHERE h.run_id = o.run_id AND h.stream_id = o.stream_id) AS held
    FROM wfs_deletion_outbox o
    WHERE o.deleted_at IS NULL AND o.next_attempt_at <= now()
    ORDER BY o.next_attempt_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), parked AS (
    UPDATE wfs_deletion_outbox o SET next_attempt_at = now() + $3::interval
    FROM due WHERE o.id = due.id AND due.held
)
UPDATE wfs_deletion_outbox o SET attempts = o.attempts + 1, next_attempt_at = now() + $1::interval
FROM due WHERE o.id = due.id AND NOT due.held
RETURNING o.id, o.run_id, o.stream_id, o.region, o.bucket, o.object_key, o.attempts
"""


async def claim_deletions(conn: asyncpg.Connection, lease: dt.timedelta, limit: int = 50) -> list[asyncpg.Record]:
    """Take up to ``limit`` due deletions of streams with no active legal hold; the claim is a lease on
    next_attempt_at (FOR UPDATE SKIP LOCKED: replicas share the work without waiting on each other).
    Due rows of held streams are parked until the hold's release (and count towards ``limit``)."""
    return list(await conn.fetch(_CLAIM_DELETIONS, lease, limit, HELD_PARK))


async def mark_deleted(conn: asyncpg.Connection, outbox_id: int) -> None:
    await conn.execute("UPDATE wfs_deletion_outbox SET deleted_at = now(), last_error = NULL WHERE id = $1", outbox_id)


async def mark_deletion_failed(conn: asyncpg.Connection, outbox_id: int, delay: dt.timedelta, error: str) -> None:
    await conn.execute(
        "UPDATE wfs_deletion_outbox SET next_attempt_at = now() + $2::interval, last_error = $3 WHERE id = $1",
        outbox_id,
        delay,
        error[:2000],
    )


# Finished rows, oldest first, through the partial index wfs_deletion_outbox_finished. SKIP LOCKED: the
# janitors of all replicas purge at once without waiting on each other. The ids go in as an array, so
# the delete looks them up by primary key (with "id IN (SELECT ...)" the planner may hash-join against
# a scan of the whole table, which is what the purge exists to keep small).
_PURGE_FINISHED = """
WITH gone AS (
    DELETE FROM wfs_deletion_outbox WHERE id = ANY (ARRAY(
        SELECT id FROM wfs_deletion_outbox
        WHERE deleted_at IS NOT NULL AND deleted_at < now() - $1::interval
        ORDER BY deleted_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING 1)
SELECT count(*) FROM gone
"""


async def purge_finished_deletions(conn: asyncpg.Connection, retention: dt.timedelta, limit: int) -> int:
    """Remove up to ``limit`` outbox rows whose object was deleted longer than ``retention`` ago; how many.
    Unfinished rows (still to delete, failing, or parked under a hold) are never touched."""
    return int(await conn.fetchval(_PURGE_FINISHED, retention, limit))


async def stream_objects(conn: asyncpg.Connection, run_id: str, stream_id: str) -> list[tuple[str, str]]:
    """Every object of the stream that may still exist in S3: (region, key)."""
    rows = await conn.fetch(
        """SELECT region, object_key FROM wfs_object_intents
           WHERE run_id = $1 AND stream_id = $2 AND state IN ('uploaded', 'committed')
           UNION
           SELECT region, object_key FROM wfs_deletion_outbox
           WHERE run_id = $1 AND stream_id = $2 AND deleted_at IS NULL""",
        run_id,
        stream_id,
    )
    return [(r["region"], r["object_key"]) for r in rows]
