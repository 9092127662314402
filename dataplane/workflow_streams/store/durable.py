"""The Durable Streams surface's state in Postgres: what the protocol adds to a stream (content type,
lifetime, Stream-Seq, producers, who closed it) next to the stream's own row.

Decisions that must be atomic with an append (producer sequences, Stream-Seq, close) are made under the
stream's row lock in the append's own transaction, through ``appends.append_locked``: the same credit
rules and records as every other append; the caller publishes the returned wake signals after COMMIT.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

import asyncpg

from ..domain.authz import Access, Caller, Principal, Trusted, may_see
from ..domain.durable import (
    ConfigConflict,
    ContentTypeMismatch,
    Fork,
    Lifetime,
    NotDeletableHere,
    NotVisible,
    Producer,
    ProducerGap,
    ProducerState,
    StaleProducerEpoch,
    StreamGone,
    Verdict,
    check_stream_seq,
    decide_producer,
    is_json_mode,
    media_type,
    records,
)
from ..domain.errors import InvalidInput, PinsConflict, StreamClosed, StreamHeld, StreamNotFound
from ..domain.pins import StreamPins
from ..domain.records import RecordIn
from ..domain.wakes import Changed, Signal, records_changed
from . import appends, db, definitions, streams
from .streams import StreamRow

OWN_CONTENT_TYPE = "application/json"
# who deletes expired streams: their lifetime, not a caller's right
EXPIRY = Trusted("durable-streams expiry")

# the stream's row (the one loader's columns) and what the protocol adds to it
_SELECT = f"""
SELECT {streams.columns("s")}, s.stream_key, d.content_type, d.ttl_seconds, d.expires_at, d.accessed_at,
       d.stream_seq, d.closed_by_producer, d.closed_by_epoch, d.closed_by_seq, d.adopted, d.forked_from_run,
       d.forked_from_stream, d.fork_offset, d.fork_sub_offset, coalesce(d.forks, 0) AS forks, d.deleted_at,
       clock_timestamp() AS db_now
FROM wfs_streams s LEFT JOIN wfs_durable_streams d ON d.run_id = s.run_id AND d.stream_id = s.stream_id
WHERE s.run_id = $1 AND s.stream_id = $2
"""


@dataclass(frozen=True)
class Origin:
    """Where a fork came from: its source and the point it copied through."""

    run_id: str
    stream_id: str
    offset: int
    sub_offset: int


@dataclass(frozen=True)
class Meta:
    """A stream as the protocol sees it: the stream's row (``store.streams``) and the protocol's own
    state. Streams of our own API (no protocol row, or one adopted for a producer or Stream-Seq) are
    JSON streams without a lifetime."""

    stream: StreamRow
    # the surrogate key its records are stored under (a fork copies them by it)
    stream_key: int
    content_type: str
    lifetime: Lifetime
    accessed_at: dt.datetime
    stream_seq: str | None
    closed_by: Producer | None
    # created through the protocol (PUT), as opposed to one of our own streams
    created_here: bool
    now: dt.datetime
    # a fork's source; and this stream's live forks, and whether it was deleted while they remain
    origin: Origin | None = None
    forks: int = 0
    deleted: bool = False

    @property
    def run_id(self) -> str:
        return self.stream.run_id

    @property
    def stream_id(self) -> str:
        return self.stream.stream_id

    @property
    def pins(self) -> StreamPins:
        return self.stream.pins

    @property
    def last_sequence(self) -> int:
        return self.stream.last_sequence

    @property
    def earliest_sequence(self) -> int:
        return self.stream.earliest_sequence

    @property
    def closed(self) -> bool:
        return self.stream.closed

    @property
    def expired(self) -> bool:
        return self.lifetime.expired(self.accessed_at, self.now)

    @property
    def incarnation(self) -> str:
        """Tells a re-created stream from the one deleted before it."""
        return f"{int(self.stream.created_at.timestamp() * 1_000_000):x}"

    def same_config(self, content_type: str, lifetime: Lifetime, closed: bool) -> bool:
        return (
            self.origin is None
            and media_type(self.content_type) == media_type(content_type)
            and self.lifetime == lifetime
            and self.closed == closed
        )

    def same_fork(self, source: tuple[str, str], fork: Fork, content_type: str | None, lifetime: Lifetime) -> bool:
        """A PUT repeating the fork that made this stream: the same source and, as far as the PUT names
        them, the same fork point, content type and lifetime."""
        origin = self.origin
        return (
            origin is not None
            and (origin.run_id, origin.stream_id) == source
            and (fork.offset is None or (fork.offset, fork.sub_offset) == (origin.offset, origin.sub_offset))
            and (content_type is None or media_type(self.content_type) == media_type(content_type))
            and (lifetime == Lifetime() or self.lifetime == lifetime)
        )


def _meta(row: asyncpg.Record, stream: StreamRow) -> Meta:
    has_row = row["content_type"] is not None
    closed_by = None
    if row["closed_by_producer"] is not None:
        closed_by = Producer(row["closed_by_producer"], row["closed_by_epoch"], row["closed_by_seq"])
    return Meta(
        stream=stream,
        stream_key=row["stream_key"],
        content_type=row["content_type"] if has_row else OWN_CONTENT_TYPE,
        lifetime=Lifetime(row["ttl_seconds"], row["expires_at"]) if has_row else Lifetime(),
        accessed_at=row["accessed_at"] or row["db_now"],
        stream_seq=row["stream_seq"],
        closed_by=closed_by,
        created_here=has_row and not row["adopted"],
        now=row["db_now"],
        origin=(
            Origin(row["forked_from_run"], row["forked_from_stream"], row["fork_offset"], row["fork_sub_offset"])
            if row["forked_from_run"] is not None
            else None
        ),
        forks=row["forks"],
        deleted=row["deleted_at"] is not None,
    )


async def find(conn: asyncpg.Connection, run_id: str, stream_id: str) -> Meta | None:
    """The stream as it is, deleted or expired included, or None: for the decisions that need to know
    (internal: no rights are checked; ``streams.find``'s counterpart)."""
    row = await conn.fetchrow(_SELECT, run_id, stream_id)
    return _meta(row, streams.row_of(row)) if row is not None else None


async def load(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    *,
    access: Access | None = None,
) -> Meta:
    """The stream for ``access`` (``streams.checked``: not found, then the right and the egress pins,
    before anything else is decided), or ``StreamGone`` for a deleted stream whose forks remain. An
    expired stream is deleted here (not inside a caller's transaction, which could roll the deletion
    back) and is not found either."""
    row = await conn.fetchrow(_SELECT, run_id, stream_id)
    meta = _meta(row, streams.checked(row, access)) if row is not None else None
    if meta is None:
        raise StreamNotFound("no such stream")
    if meta.deleted:
        raise StreamGone("the stream was deleted; forks of it remain")
    if meta.expired:
        if await _delete_expired(conn, meta) and meta.forks:
            raise StreamGone("the stream expired; forks of it remain")
        raise StreamNotFound("the stream expired")
    return meta


async def _delete_expired(conn: asyncpg.Connection, meta: Meta) -> bool:
    try:
        await remove(conn, meta, EXPIRY)
    except StreamHeld:
        return False  # a legal hold keeps the records; the protocol still sees no stream
    return True


async def touch(conn: asyncpg.Connection, meta: Meta) -> None:
    """A read or write renews a sliding TTL (HEAD does not)."""
    if meta.lifetime.ttl_seconds is not None:
        await conn.execute(
            """UPDATE wfs_durable_streams SET accessed_at = clock_timestamp()
               WHERE run_id = $1 AND stream_id = $2""",
            meta.run_id,
            meta.stream_id,
        )


@dataclass(frozen=True)
class Created:
    meta: Meta
    created: bool


def _found_again(existing: Meta, principal: Principal) -> Changed[Created]:
    """An existing stream answers a repeated PUT only to who may see it; to anyone else it is not
    visible (403, as on our own API's create), never a hint of what it holds."""
    if not may_see(existing.pins.authorization, principal):
        raise NotVisible()
    return Changed(Created(existing, False))


def _conflict(existing: Meta, principal: Principal, conflict: ConfigConflict) -> ConfigConflict | NotVisible:
    return conflict if may_see(existing.pins.authorization, principal) else NotVisible()


async def create(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    pins: StreamPins,
    principal: Principal,
    content_type: str,
    lifetime: Lifetime,
    closed: bool,
    initial: list[RecordIn],
) -> Changed[Created]:
    """Create the stream with its initial records (and closed if asked), or find the same one: the
    same content type, lifetime and closed flag answer it again, anything else is a conflict; both only
    to a caller who may see the existing stream."""
    async with db.transaction(conn):
        existing = await find(conn, run_id, stream_id)
        if existing is not None and not existing.deleted and existing.expired and await _delete_expired(conn, existing):
            existing = await find(conn, run_id, stream_id)  # gone, or kept deleted for its forks
        if existing is None:
            try:
                # Trusted: who may learn of an existing stream is decided on its Meta below
                _, created = await definitions.create_definition(conn, run_id, stream_id, pins, Trusted(principal.name))
            except PinsConflict:
                created = False  # created concurrently by someone else
            if created:
                await conn.execute(
                    """INSERT INTO wfs_durable_streams (run_id, stream_id, content_type, ttl_seconds, expires_at)
                       VALUES ($1, $2, $3, $4, $5)""",
                    run_id,
                    stream_id,
                    content_type,
                    lifetime.ttl_seconds,
                    lifetime.expires_at,
                )
                signals = await _initial(conn, run_id, stream_id, principal, initial, closed)
                return Changed(Created(await _find_existing(conn, run_id, stream_id), True), signals)
            existing = await _find_existing(conn, run_id, stream_id)
        if existing.deleted or not existing.same_config(content_type, lifetime, closed):
            detail = "the stream exists with another content type, lifetime or closed state"
            if existing.deleted:
                detail = "a stream of this name was deleted while forks of it remain"
            raise _conflict(existing, principal, ConfigConflict(detail))
        return _found_again(existing, principal)


async def _initial(
    conn: asyncpg.Connection, run_id: str, stream_id: str, principal: Principal, initial: list[RecordIn], closed: bool
) -> tuple[Signal, ...]:
    """A new stream's records from its PUT's body, and its close if the PUT asked; what they changed."""
    signals: list[Signal] = []
    if initial:
        _, batch = await appends.append_locked(conn, run_id, stream_id, initial, principal)
        signals += batch.signals()
    if closed:
        signals += (await definitions.close_stream(conn, run_id, stream_id, principal)).signals
    return tuple(signals)


class ForkConflict(ConfigConflict):
    """A fork that cannot be made from this source: deleted, or of another content type."""

    code = "fork_conflict"


# the source's records through the fork point, copied into the fork as they are (same sequences and
# cumulative bytes: a fork shares its source's offsets up to the fork point)
_COPY = """
INSERT INTO wfs_records
    (stream_key, sequence, cumulative_bytes, appended_at, content_type, appended_by, payload, object)
SELECT $1, r.sequence, r.cumulative_bytes, r.appended_at, r.content_type, r.appended_by, r.payload, r.object
FROM wfs_records r WHERE r.stream_key = $2 AND r.sequence <= $3
"""


async def fork(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    source_key: tuple[str, str],
    spec: Fork,
    pins: StreamPins,
    principal: Principal,
    client_region: str | None,
    content_type: str | None,
    lifetime: Lifetime,
    closed: bool,
    body: bytes,
) -> Changed[Created]:
    """Create the stream as a fork of ``source_key`` (copy-on-fork, PROTOCOL.md's stream forking): the
    source's records through the fork point are copied, with a sub-offset the first bytes (byte stream)
    or messages (JSON) after it; then ``initial``. The fork takes the source's content type and lifetime
    unless the PUT names its own, starts open, and has no producer state. Or find the same fork again.
    Made under the source's row lock, so its fork count and tail hold for the whole decision. A fork
    copies the source: who may not read it (here) may not fork it."""
    async with db.transaction(conn):
        await streams.load(conn, *source_key, lock=True)
        source = await find(conn, *source_key)
        if source is None or (source.expired and not source.deleted):
            raise StreamNotFound("the fork's source does not exist")
        source.stream.authorize(Access(principal, "read", client_region))
        if source.deleted:
            raise ForkConflict("the fork's source was deleted")
        existing = await find(conn, run_id, stream_id)
        if existing is not None:
            if not existing.deleted and existing.same_fork(source_key, spec, content_type, lifetime):
                return _found_again(existing, principal)
            raise _conflict(existing, principal, ConfigConflict("the stream exists as another stream, or another fork"))
        if content_type is not None and media_type(content_type) != media_type(source.content_type):
            raise ForkConflict(f"the source's content type is {source.content_type}")
        initial = records(source.content_type, body, allow_empty=True) if body else []
        through, prefix = _fork_point(source, spec, await _next_payload(conn, source, spec))
        if await conn.fetchval(
            "SELECT EXISTS (SELECT FROM wfs_records WHERE stream_key = $1 AND sequence <= $2 AND object IS NOT NULL)",
            source.stream_key,
            through + (1 if prefix else 0),
        ):
            raise InvalidInput("a stream with large objects cannot be forked", field="Stream-Forked-From")
        fork_lifetime = lifetime if lifetime != Lifetime() else source.lifetime
        _, created = await definitions.create_definition(conn, run_id, stream_id, pins, Trusted(principal.name))
        if not created:
            raise ConfigConflict("the stream was created meanwhile")
        offset = spec.offset if spec.offset is not None else source.last_sequence
        await conn.execute(
            """INSERT INTO wfs_durable_streams (run_id, stream_id, content_type, ttl_seconds, expires_at,
                   forked_from_run, forked_from_stream, fork_offset, fork_sub_offset)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)""",
            run_id,
            stream_id,
            source.content_type,
            fork_lifetime.ttl_seconds,
            fork_lifetime.expires_at,
            *source_key,
            offset,
            spec.sub_offset,
        )
        forked = await _find_existing(conn, run_id, stream_id)
        await conn.execute(_COPY, forked.stream_key, source.stream_key, through)
        last, cumulative = through, await _cumulative(conn, source, through)
        if prefix:
            last, cumulative = through + 1, cumulative + len(prefix)
            await conn.execute(
                """INSERT INTO wfs_records (stream_key, sequence, cumulative_bytes, appended_at, content_type,
                       appended_by, payload)
                   SELECT $1, $2, $3, r.appended_at, r.content_type, r.appended_by, $4
                   FROM wfs_records r WHERE r.stream_key = $5 AND r.sequence = $2""",
                forked.stream_key,
                last,
                cumulative,
                prefix,
                source.stream_key,
            )
        await conn.execute(
            """UPDATE wfs_streams SET last_sequence = $2::bigint, appended_bytes = $3,
                   earliest_sequence = least($4::bigint, $2::bigint + 1), pruned_bytes = $5,
                   next_prune_at = CASE WHEN $2::bigint > 0 THEN now() END
               WHERE stream_key = $1""",
            forked.stream_key,
            last,
            cumulative,
            source.earliest_sequence,
            source.stream.pruned_bytes,
        )
        await conn.execute(
            "UPDATE wfs_durable_streams SET forks = forks + 1 WHERE run_id = $1 AND stream_id = $2", *source_key
        )
        signals = await _initial(conn, run_id, stream_id, principal, initial, closed)
        return Changed(Created(await _find_existing(conn, run_id, stream_id), True), signals)


async def _next_payload(conn: asyncpg.Connection, source: Meta, spec: Fork) -> bytes | None:
    """The payload of the record after the fork offset, which a binary sub-offset cuts."""
    if not spec.sub_offset or spec.offset is None or is_json_mode(source.content_type):
        return None
    payload: bytes | None = await conn.fetchval(
        "SELECT payload FROM wfs_records WHERE stream_key = $1 AND sequence = $2", source.stream_key, spec.offset + 1
    )
    return payload


_SUB = "Stream-Fork-Sub-Offset"


def _fork_point(source: Meta, spec: Fork, next_payload: bytes | None) -> tuple[int, bytes]:
    """The last whole record the fork copies, and the bytes it takes of the next (binary sub-offset)."""
    offset = source.last_sequence if spec.offset is None else spec.offset
    if offset > source.last_sequence:
        raise InvalidInput("Stream-Fork-Offset is beyond the source's tail", field="Stream-Fork-Offset")
    if offset < source.earliest_sequence - 1:
        raise InvalidInput("Stream-Fork-Offset is before what the source still holds", field="Stream-Fork-Offset")
    if not spec.sub_offset:
        return offset, b""
    if is_json_mode(source.content_type):  # messages: whole records
        if offset + spec.sub_offset > source.last_sequence:
            raise InvalidInput(
                "Stream-Fork-Sub-Offset counts more messages than follow the offset", field="Stream-Fork-Sub-Offset"
            )
        return offset + spec.sub_offset, b""
    if next_payload is None:
        raise InvalidInput(
            "no record follows Stream-Fork-Offset for a sub-offset to cut", field="Stream-Fork-Sub-Offset"
        )
    if spec.sub_offset > len(next_payload):
        raise InvalidInput("Stream-Fork-Sub-Offset is beyond the next record's bytes", field=_SUB)
    if spec.sub_offset == len(next_payload):
        return offset + 1, b""
    return offset, next_payload[: spec.sub_offset]


async def _cumulative(conn: asyncpg.Connection, source: Meta, through: int) -> int:
    """The source's cumulative bytes through ``through`` (its pruned bytes when nothing is left there)."""
    value: int | None = await conn.fetchval(
        "SELECT cumulative_bytes FROM wfs_records WHERE stream_key = $1 AND sequence = $2", source.stream_key, through
    )
    return value if value is not None else source.stream.pruned_bytes


async def _find_existing(conn: asyncpg.Connection, run_id: str, stream_id: str) -> Meta:
    meta = await find(conn, run_id, stream_id)
    if meta is None:  # deleted between two statements: the caller may retry
        raise StreamNotFound("the stream was deleted while being created")
    return meta


@dataclass(frozen=True)
class AppendPlan:
    records: list[RecordIn]
    content_type: str | None
    producer: Producer | None
    stream_seq: str | None
    close: bool


@dataclass(frozen=True)
class AppendOutcome:
    # the sequence of the stream's last record after this request
    last_sequence: int
    duplicate: bool
    closed: bool
    producer: ProducerState | None


def closes_again(plan: AppendPlan) -> bool:
    """Closing a closed stream again, without records or a producer, is idempotent success."""
    return plan.close and not plan.records and plan.producer is None


class ClosedStream(StreamClosed):
    """An append to a closed stream; carries the final tail for the Stream-Next-Offset header."""

    def __init__(self, last_sequence: int) -> None:
        super().__init__("the stream is closed; appends are rejected")
        self.last_sequence = last_sequence


async def append_guarded(
    conn: asyncpg.Connection, run_id: str, stream_id: str, plan: AppendPlan, principal: Principal
) -> Changed[AppendOutcome]:
    """An append (and/or close) whose protocol checks must hold at the moment it is written: the
    closed state, the producer's epoch and sequence, Stream-Seq. All under the stream row lock in one
    transaction, so a producer's state can never disagree with the records (PROTOCOL.md 5.2.1)."""
    async with db.transaction(conn):
        await streams.load(conn, run_id, stream_id, lock=True)
        meta = await find(conn, run_id, stream_id)
        if meta is None or meta.expired:  # the next load outside this transaction deletes it
            raise StreamNotFound("no such stream")
        if meta.closed:
            if plan.producer is not None and meta.closed_by == plan.producer:
                state = await _producer_state(conn, run_id, stream_id, plan.producer.id)
                return Changed(AppendOutcome(meta.last_sequence, True, True, state))
            if closes_again(plan):
                return Changed(AppendOutcome(meta.last_sequence, False, True, None))
            raise ClosedStream(meta.last_sequence)
        mismatch = plan.content_type is not None and media_type(plan.content_type) != media_type(meta.content_type)
        if plan.records and mismatch:
            raise ContentTypeMismatch(
                f"the stream's content type is {meta.content_type}, not {plan.content_type}",
                stream_content_type=meta.content_type,
            )
        accepted: ProducerState | None = None
        if plan.producer is not None:
            current = await _producer_state(conn, run_id, stream_id, plan.producer.id)
            decision = decide_producer(current, plan.producer)
            if decision.verdict is Verdict.DUPLICATE:
                return Changed(AppendOutcome(meta.last_sequence, True, False, decision.state))
            if decision.verdict is Verdict.STALE_EPOCH:
                assert decision.state is not None
                raise StaleProducerEpoch("a newer producer epoch exists", current_epoch=decision.state.epoch)
            if decision.verdict is Verdict.BAD_EPOCH_START:
                raise InvalidInput("a new producer epoch starts at Producer-Seq 0", field="Producer-Seq")
            if decision.verdict is Verdict.GAP:
                raise ProducerGap(
                    f"producer sequence {plan.producer.seq} skips {decision.expected_seq}",
                    expected_seq=decision.expected_seq,
                    received_seq=plan.producer.seq,
                )
            accepted = decision.state
        check_stream_seq(plan.stream_seq, meta.stream_seq)
        last, signals = meta.last_sequence, []
        if plan.records:
            result, batch = await appends.append_locked(conn, run_id, stream_id, plan.records, principal)
            last, signals = result.last_sequence, batch.signals()
        if plan.close:
            signals += (await definitions.close_stream(conn, run_id, stream_id, principal)).signals
        elif not plan.records:
            meta.stream.authorize(Access(principal, "append"))
        await _remember(conn, meta, plan, accepted)
        return Changed(AppendOutcome(last, False, plan.close, accepted), tuple(signals))


async def _producer_state(
    conn: asyncpg.Connection, run_id: str, stream_id: str, producer_id: str
) -> ProducerState | None:
    row = await conn.fetchrow(
        """SELECT epoch, last_seq FROM wfs_durable_producers
           WHERE run_id = $1 AND stream_id = $2 AND producer_id = $3""",
        run_id,
        stream_id,
        producer_id,
    )
    return ProducerState(row["epoch"], row["last_seq"]) if row is not None else None


async def _remember(conn: asyncpg.Connection, meta: Meta, plan: AppendPlan, accepted: ProducerState | None) -> None:
    """Producer state, Stream-Seq, the closing producer and the TTL's renewal, in the append's transaction.
    One of our own streams gets an (adopted) protocol row the first time it needs one."""
    run_id, stream_id = meta.run_id, meta.stream_id
    await conn.execute(
        """INSERT INTO wfs_durable_streams (run_id, stream_id, content_type, adopted)
           VALUES ($1, $2, $3, true) ON CONFLICT (run_id, stream_id) DO NOTHING""",
        run_id,
        stream_id,
        OWN_CONTENT_TYPE,
    )
    closer = plan.producer if plan.close else None
    await conn.execute(
        """UPDATE wfs_durable_streams
           SET accessed_at = clock_timestamp(),
               stream_seq = coalesce($3, stream_seq),
               closed_by_producer = coalesce($4, closed_by_producer),
               closed_by_epoch = coalesce($5, closed_by_epoch),
               closed_by_seq = coalesce($6, closed_by_seq)
           WHERE run_id = $1 AND stream_id = $2""",
        run_id,
        stream_id,
        plan.stream_seq,
        closer.id if closer else None,
        closer.epoch if closer else None,
        closer.seq if closer else None,
    )
    if plan.producer is not None and accepted is not None:
        await conn.execute(
            """INSERT INTO wfs_durable_producers (run_id, stream_id, producer_id, epoch, last_seq)
               VALUES ($1, $2, $3, $4, $5)
               ON CONFLICT (run_id, stream_id, producer_id)
               DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq, updated_at = now()""",
            run_id,
            stream_id,
            plan.producer.id,
            accepted.epoch,
            accepted.last_seq,
        )


async def delete(conn: asyncpg.Connection, run_id: str, stream_id: str, caller: Caller) -> Changed[None]:
    """DELETE: the right that ends streams for everyone (``close``), and only for streams created
    through the protocol: our own streams' definitions are not the protocol's to remove (their deletion
    goes through the operator)."""
    meta = await load(conn, run_id, stream_id, access=Access(caller, "close"))
    if not meta.created_here:
        raise NotDeletableHere("streams of our own API are not deleted here")
    return await remove(conn, meta, Trusted("durable-streams delete"))


async def remove(conn: asyncpg.Connection, meta: Meta, caller: Trusted) -> Changed[None]:
    """Delete the stream, or, while forks of it remain, only mark it deleted; deleting a fork frees its
    source, which goes too if it was marked deleted and this was its last fork (and so on up the chain).
    Refused, as any deletion, while a legal hold exists."""
    async with db.transaction(conn):
        # gone already (a concurrent sweep of the same expired stream): nothing to do
        if await streams.find(conn, meta.run_id, meta.stream_id, lock=True) is None:
            return Changed(None)
        current = await find(conn, meta.run_id, meta.stream_id)
        if current is None:
            return Changed(None)
        if current.forks:
            await conn.execute(
                """UPDATE wfs_durable_streams SET deleted_at = coalesce(deleted_at, clock_timestamp())
                   WHERE run_id = $1 AND stream_id = $2""",
                current.run_id,
                current.stream_id,
            )
            return Changed(None, (records_changed(current.run_id, current.stream_id),))
        deleted = (await definitions.delete_stream(conn, current.run_id, current.stream_id, caller)).signals
        origin = current.origin
        if origin is None:
            return Changed(None, deleted)
        if await streams.find(conn, origin.run_id, origin.stream_id, lock=True) is None:
            return Changed(None, deleted)
        source = await find(conn, origin.run_id, origin.stream_id)
        if source is None:
            return Changed(None, deleted)
        left = await conn.fetchval(
            """UPDATE wfs_durable_streams SET forks = greatest(forks - 1, 0)
               WHERE run_id = $1 AND stream_id = $2 RETURNING forks""",
            source.run_id,
            source.stream_id,
        )
        if left == 0 and (source.deleted or source.expired):
            freed = await remove(conn, dataclasses.replace(source, forks=0), caller)
            return Changed(None, deleted + freed.signals)
        return Changed(None, deleted)


async def sweep_expired(conn: asyncpg.Connection, limit: int = 20) -> int:
    """Delete up to ``limit`` expired streams that nobody touched since they expired (access deletes
    the others). Run opportunistically on create, so no worker is needed."""
    rows = await conn.fetch(
        """SELECT run_id, stream_id FROM wfs_durable_streams
           WHERE deleted_at IS NULL
             AND ((expires_at IS NOT NULL AND expires_at <= clock_timestamp())
                  OR (ttl_seconds IS NOT NULL
                      AND accessed_at + make_interval(secs => ttl_seconds) <= clock_timestamp()))
           LIMIT $1""",
        limit,
    )
    removed = 0
    for row in rows:
        meta = await find(conn, row["run_id"], row["stream_id"])
        if meta is not None and await _delete_expired(conn, meta):
            removed += 1
    return removed
