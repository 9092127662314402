"""Appending records: credit is decided under the stream row locks from durable counters.

``append_batch`` takes append requests for any number of streams and, in the caller's transaction:

1. locks every stream row involved in one statement, in key order (so two processes locking
   overlapping sets of streams never deadlock), reading each stream's slowest ack and the bytes
   behind it in the same statement;
2. reads the Idempotency-Key receipts of the batch in one statement (only if any request has a key);
3. decides each request on its own, in arrival order per stream (rights, receipt, closed, credit)
   against counters it advances as it goes; a refused request writes nothing;
4. writes every accepted record, counter, receipt and delivery row in one statement.

Round trips do not grow with the number of requests. Nothing here notifies: the caller publishes the
returned wake signals after COMMIT (``runtime.group_commit``), so no append pays Postgres' notify lock.
The lock statement also reads whether each stream is marked as watched (``runtime.interest``): only
those streams' signals need to reach other processes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import asyncpg

from ..domain import credit
from ..domain.authz import Principal, require
from ..domain.delivery import event_id
from ..domain.durable import Lifetime, PlainAppendRefused, plain_append_fits
from ..domain.errors import (
    Backpressure,
    BatchExceedsCredit,
    IdempotencyKeyReused,
    QuotaExhausted,
    StreamClosed,
    StreamError,
    StreamNotFound,
)
from ..domain.pins import Credit, StreamPins
from ..domain.records import DEFAULT_CONTENT_TYPE, RecordIn, request_digest
from ..domain.wakes import INPUTS, RECORDS, Signal
from . import db, streams
from .wal import TIMELINE

RETRY_AFTER_SECONDS = 1

StreamKey = tuple[str, str]


@dataclass(frozen=True)
class AppendResult:
    first_sequence: int
    last_sequence: int
    replayed: bool


@dataclass
class AppendRequest:
    run_id: str
    stream_id: str
    records: list[RecordIn]
    principal: Principal
    idempotency_key: str | None = None
    # a Durable Streams append's Content-Type: its stream must also be of that media type, neither
    # deleted nor expired (``domain.durable.plain_append_fits``), and its sliding TTL is renewed
    durable: str | None = None

    @property
    def key(self) -> StreamKey:
        return (self.run_id, self.stream_id)

    @functools.cached_property
    def digest(self) -> str:
        """Only requests with an Idempotency-Key need it: not hashed on every append."""
        return request_digest(self.records)

    @functools.cached_property
    def size(self) -> int:
        return sum(r.size for r in self.records)


Outcome = AppendResult | StreamError


@dataclass
class Batch:
    """What ``append_batch`` decided: an outcome per request, in request order, and what was written."""

    outcomes: list[Outcome]
    # per appended-to stream: (first, last) sequence written, and whether it is an input stream
    written: dict[StreamKey, tuple[int, int, bool]] = field(default_factory=dict)
    # the appended-to streams some process watched when their rows were locked
    watched: set[StreamKey] = field(default_factory=set)
    # records appended, by kind, for metrics
    records_by_kind: dict[str, int] = field(default_factory=dict)
    # (run, stream, sequence, pins, record) for the payload log
    appended: list[tuple[str, str, int, StreamPins, RecordIn]] = field(default_factory=list)
    # the WAL timeline the writes ran on (store.wal), when there were any: the lock statement's (the
    # transaction runs on one server)
    timeline: str | None = None

    def signals(self) -> list[Signal]:
        """The wake signals to publish once the transaction committed."""
        out = []
        timeline = self.timeline or ""
        for (run_id, stream_id), (first, last, is_input) in self.written.items():
            out.append(Signal(RECORDS, run_id, stream_id, first, last, timeline))
            if is_input:
                out.append(Signal(INPUTS, run_id, stream_id, first, last, timeline))
        return out

    def remote_signals(self) -> list[Signal]:
        """Those of ``signals()`` that other processes need: records of the streams marked as watched (a
        watcher marks before its first read, under the row lock this batch held: ``runtime.interest``),
        and every input signal (any process's dispatcher may deliver)."""
        return [s for s in self.signals() if s.kind == INPUTS or (s.run_id, s.stream_id) in self.watched]


# The planner settings of the transactions that run this module's statements. Generic plans: with array
# parameters Postgres otherwise keeps custom plans and plans the batch statements again on every
# transaction. No sequential scans: a generic plan is made once per connection, from the statistics of
# that moment, and kept for the connection's life. Made while wfs_streams is small, the lock statement's
# plan can be a hash join over a sequential scan of every stream row (the array estimated at a few
# elements), and every transaction after it walks the table and its dead versions: at a million streams,
# a million rows a transaction. Every statement here is a keyed lookup per array element, right at any
# table size (figures: bench/README.md, constants).
TRANSACTION_SETTINGS = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off"}
# What begins the transactions that run this module's statements (and ``store.watched``'s marks): the
# settings are SET LOCAL, so they hold for the transaction only, which is all a transaction pooler allows
# (store.db); on a direct connection too, so that there is one way. The cached generic plans are made
# under them, in the first transaction that runs each statement.
BEGIN = "BEGIN; " + " ".join(f"SET LOCAL {name} = {value};" for name, value in TRANSACTION_SETTINGS.items())

# Every stream row of the batch, locked in key order (so lockers of overlapping sets never deadlock),
# with the slowest consumer's ack and the cumulative bytes through it, in one round trip: the lock and
# the credit inputs as two statements would add a round trip to every transaction, and a quiet process's
# transactions carry one append each (figures: bench/README.md, constants).
# Each stream row is found and locked by its key, one array element after the other, in the order of
# the arrays (``lock_streams`` sorts them): the locking sub-select cannot be flattened into a join, so
# no plan can walk the whole table. As a join, a generic plan made while the table was small (a merge
# join over a full scan of the primary key) is kept for the connection's life and walks every stream in
# every transaction as the table grows.
# The ack's record is retained whenever the ack is what decides the base (domain.credit.base_sequence);
# otherwise the pruned bytes are used. Both lookups are per key (a correlated subquery, an aggregate):
# written as a join, the plan cached for the prepared statement can be a hash join over a sequential
# scan of wfs_records, planned while the table was small, and every batch then reads the whole table
# (figures: bench/README.md, constants).
# The ack is read in the statement's snapshot, which may predate the lock's wait: acks only advance,
# so an older one can only refuse credit that a retry (woken by the ack's signal) then grants.
# The stream's columns are named, without the pins document (``streams.pins_by_digest``), with the WAL timeline
# the transaction runs on (store.wal: what its COMMIT confirms).
_LOCK = db.kept(f"""
SELECT s.stream_key, s.run_id, s.stream_id, s.pins_digest, s.created_by, s.last_sequence, s.appended_bytes,
       s.earliest_sequence, s.pruned_bytes, s.closed_at, m.min_ack, s.watched_until > now() AS watched,
       {TIMELINE} AS timeline,
       (SELECT r.cumulative_bytes FROM wfs_records r
        WHERE r.stream_key = s.stream_key AND r.sequence = m.min_ack) AS ack_bytes
       , d.content_type AS durable_content_type, d.deleted_at IS NOT NULL AS durable_deleted,
       d.ttl_seconds AS durable_ttl_seconds, d.expires_at AS durable_expires_at,
       d.accessed_at AS durable_accessed_at, clock_timestamp() AS db_now
FROM unnest($1::text[], $2::text[], $3::boolean[]) WITH ORDINALITY AS k(run_id, stream_id, durable, position)
CROSS JOIN LATERAL (
    SELECT * FROM wfs_streams w WHERE w.run_id = k.run_id AND w.stream_id = k.stream_id FOR UPDATE
) s
CROSS JOIN LATERAL (
    SELECT min(c.acked_sequence) AS min_ack FROM wfs_consumers c
    WHERE c.run_id = s.run_id AND c.stream_id = s.stream_id
) m
LEFT JOIN LATERAL (
    -- only for a Durable Streams append's stream: a filter on the outer row alone is decided before the
    -- lookup, so our API's appends do not pay for it
    SELECT * FROM wfs_durable_streams d WHERE k.durable AND d.run_id = s.run_id AND d.stream_id = s.stream_id
) d ON true
ORDER BY k.position
""")

# Durable Streams appends renew their streams' sliding TTLs in the transaction that writes them
_TOUCH = db.kept("""
WITH touched AS (
    UPDATE wfs_durable_streams d SET accessed_at = clock_timestamp()
    FROM unnest($1::text[], $2::text[]) AS k(run_id, stream_id)
    WHERE d.run_id = k.run_id AND d.stream_id = k.stream_id
)
SELECT 1
""")

# per key for the same reason (OFFSET 0 keeps the planner from flattening it into a join)
_RECEIPTS = db.kept("""
SELECT r.run_id, r.stream_id, r.idempotency_key, r.request_digest, r.first_sequence, r.last_sequence
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(run_id, stream_id, idempotency_key)
CROSS JOIN LATERAL (
    SELECT * FROM wfs_append_receipts r
    WHERE r.run_id = k.run_id AND r.stream_id = k.stream_id AND r.idempotency_key = k.idempotency_key
    OFFSET 0
) r
""")

# Every write of a batch in one statement: data-modifying CTEs all run, referenced or not. A record row
# holds the stream's surrogate key, not its names, and neither kind nor size (migration 482: both are
# computed where records are read, store.reads.RECORD_COLUMNS), nor the defaults (migration 483).
_RECORDS_AND_COUNTERS = """
WITH records AS (
    INSERT INTO wfs_records
        (stream_key, sequence, cumulative_bytes, appended_at, content_type, appended_by, payload, object)
    SELECT r.stream_key, r.sequence, r.cumulative_bytes, clock_timestamp(), r.content_type, r.appended_by,
           r.payload, r.object
    FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bytea[], $7::jsonb[])
         AS r(stream_key, sequence, cumulative_bytes, content_type, appended_by, payload, object)
), counters AS (
    UPDATE wfs_streams s SET last_sequence = c.last_sequence, appended_bytes = c.appended_bytes,
        -- retention due-ness (migration 479): due now once past max_records, else by when the oldest
        -- record ages out; least() keeps an earlier due time, so the value (an indexed column) only
        -- changes when the stream becomes due and the update stays HOT otherwise
        next_prune_at = least(s.next_prune_at,
                              CASE WHEN c.last_sequence - s.earliest_sequence >= s.retention_max_records
                                   THEN now() END,
                              now() + make_interval(secs => s.retention_max_age_seconds))
    FROM unnest($8::bigint[], $9::bigint[], $10::bigint[]) AS c(stream_key, last_sequence, appended_bytes)
    -- the ANY is an index condition: whatever join the generic plan picks, it reads only these rows (as a
    -- bare join, planned while the table held two rows, it walked the whole primary key every time)
    WHERE s.stream_key = c.stream_key AND s.stream_key = ANY($8::bigint[])
)"""

_WRITE_RECORDS = db.kept(_RECORDS_AND_COUNTERS + "\nSELECT 1\n")

# With Idempotency-Key receipts or input deliveries to write too. Most batches have neither and take the
# statement above: an empty INSERT still opens its table and indexes in Postgres, and its arrays are still
# encoded in Python (figures: bench/README.md, constants).
_WRITE = db.kept(
    _RECORDS_AND_COUNTERS
    + """, receipts AS (
    INSERT INTO wfs_append_receipts
        (run_id, stream_id, idempotency_key, request_digest, first_sequence, last_sequence, created_by)
    SELECT * FROM unnest($11::text[], $12::text[], $13::text[], $14::text[], $15::bigint[], $16::bigint[],
                         $17::text[])
), deliveries AS (
    INSERT INTO wfs_input_deliveries (run_id, stream_id, sequence, event_id)
    SELECT * FROM unnest($18::text[], $19::text[], $20::bigint[], $21::text[])
)
SELECT 1
"""
)


async def lock_streams(
    conn: asyncpg.Connection, keys: Sequence[StreamKey], durable: frozenset[StreamKey] = frozenset()
) -> dict[StreamKey, asyncpg.Record]:
    """The rows of the existing streams among ``keys``, locked for the rest of the transaction in key
    order (the order every multi-stream locker uses, so lockers never deadlock), each with its slowest
    ack (``min_ack``) and the cumulative bytes through it (``ack_bytes``), and for those in ``durable``
    their Durable Streams row (``durable_*``)."""
    unique = sorted(set(keys))
    rows = await conn.fetch(_LOCK, [k[0] for k in unique], [k[1] for k in unique], [k in durable for k in unique])
    return {(r["run_id"], r["stream_id"]): r for r in rows}


def _fits_durable(row: asyncpg.Record, request: AppendRequest) -> bool:
    """A Durable Streams append against its stream's protocol row (none: one of our own streams, JSON
    without a lifetime); its records take the stream's own content type, as the protocol stores them."""
    assert request.durable is not None
    stream_type = row["durable_content_type"] or DEFAULT_CONTENT_TYPE
    lifetime = Lifetime(row["durable_ttl_seconds"], row["durable_expires_at"])
    now = row["db_now"]
    accessed_at = row["durable_accessed_at"] or now
    if not plain_append_fits(request.durable, stream_type, bool(row["durable_deleted"]), lifetime, accessed_at, now):
        return False
    if request.durable != stream_type:
        request.records = [replace(r, content_type=stream_type) for r in request.records]
        request.durable = stream_type
    return True


def _usages(rows: dict[StreamKey, asyncpg.Record]) -> dict[StreamKey, credit.Usage]:
    usages = {}
    for key, row in rows.items():
        usages[key] = credit.Usage.of(
            row["last_sequence"],
            row["appended_bytes"],
            row["min_ack"],
            row["earliest_sequence"],
            row["pruned_bytes"],
            row["ack_bytes"],
        )
    return usages


async def _receipts(
    conn: asyncpg.Connection, requests: Sequence[AppendRequest]
) -> dict[tuple[str, str, str], tuple[str, AppendResult]]:
    keyed = {(q.run_id, q.stream_id, q.idempotency_key) for q in requests if q.idempotency_key is not None}
    if not keyed:
        return {}
    rows = await conn.fetch(_RECEIPTS, *(list(column) for column in zip(*keyed, strict=True)))
    return {
        (r["run_id"], r["stream_id"], r["idempotency_key"]): (
            r["request_digest"],
            AppendResult(r["first_sequence"], r["last_sequence"], False),
        )
        for r in rows
    }


def _check_credit(pins_credit: Credit, usage: credit.Usage, request: AppendRequest) -> None:
    verdict = credit.decide(pins_credit, usage, len(request.records), request.size)
    if verdict is credit.Verdict.QUOTA_EXHAUSTED:
        raise QuotaExhausted(
            "the stream's total quota is exhausted; nothing was appended",
            total_items=usage.last_sequence,
            total_bytes=usage.appended_bytes,
        )
    if verdict is credit.Verdict.BATCH_TOO_LARGE:
        raise BatchExceedsCredit("the batch alone exceeds the stream's unread ceiling; split it")
    if verdict is credit.Verdict.UNREAD_FULL:
        block = pins_credit.policy == "block"
        raise Backpressure(
            "unread ceiling reached; retry after consumers acknowledge",
            retry_after=RETRY_AFTER_SECONDS,
            block_seconds=pins_credit.block_timeout_ms / 1000 if block else 0.0,
            unread_items=usage.unread_items,
            unread_bytes=usage.unread_bytes,
        )


def _decide(
    row: asyncpg.Record,
    pins: StreamPins,
    usage: credit.Usage,
    request: AppendRequest,
    receipts: dict[tuple[str, str, str], tuple[str, AppendResult]],
) -> AppendResult:
    require(pins.authorization, request.principal, "append")
    key = request.idempotency_key
    if key is not None:
        earlier = receipts.get((request.run_id, request.stream_id, key))
        if earlier is not None:
            if earlier[0] != request.digest:
                raise IdempotencyKeyReused("this Idempotency-Key was used for different records")
            return AppendResult(earlier[1].first_sequence, earlier[1].last_sequence, replayed=True)
    if row["closed_at"] is not None:
        raise StreamClosed("the stream is closed; appends are rejected")
    if request.durable is not None and not _fits_durable(row, request):
        raise PlainAppendRefused("the stream refuses this append as the protocol sees it")
    _check_credit(pins.credit, usage, request)
    first = usage.last_sequence + 1
    return AppendResult(first, first + len(request.records) - 1, replayed=False)


def _push(columns: list[list[Any]], values: tuple[Any, ...]) -> None:
    for column, value in zip(columns, values, strict=True):
        column.append(value)


class _Columns:
    """The arrays of the one write statement, filled request by request."""

    def __init__(self) -> None:
        self.records: list[list[Any]] = [[] for _ in range(7)]
        self.receipts: list[list[Any]] = [[] for _ in range(7)]
        self.deliveries: list[list[Any]] = [[] for _ in range(4)]

    def add(self, request: AppendRequest, stream: asyncpg.Record, first: int, before: int, is_input: bool) -> None:
        run_id, stream_id, by = request.run_id, request.stream_id, request.principal.name
        stream_key = stream["stream_key"]
        # what the stream already says is not stored again in every row (migration 483): NULL is the
        # stream's creator, and the default content type (store.reads.RECORD_COLUMNS reads it back)
        appended_by = None if by == stream["created_by"] else by
        total = before  # the stream's bytes before this request
        # one column at a time: a tuple per record zipped into seven lists cost a third more, per record
        keys, sequences, totals, content_types, appenders, payloads, objects = self.records
        for offset, r in enumerate(request.records):
            total += r.size
            sequence = first + offset
            keys.append(stream_key)
            sequences.append(sequence)
            totals.append(total)
            content_types.append(None if r.content_type == DEFAULT_CONTENT_TYPE else r.content_type)
            appenders.append(appended_by)
            payloads.append(r.payload)
            objects.append(r.object)
            if is_input:
                _push(self.deliveries, (run_id, stream_id, sequence, event_id(run_id, stream_id, sequence)))
        if request.idempotency_key is not None:
            last = first + len(request.records) - 1
            _push(self.receipts, (run_id, stream_id, request.idempotency_key, request.digest, first, last, by))


async def append_batch(conn: asyncpg.Connection, requests: Sequence[AppendRequest]) -> Batch:
    """Decide and write ``requests`` (any streams) in the caller's transaction. Each request gets its
    result or the error that refused it; refusals write nothing and never fail the others."""
    rows = await lock_streams(conn, [q.key for q in requests], frozenset(q.key for q in requests if q.durable))
    digest_pins = await streams.pins_by_digest(conn, rows.values())
    usages = _usages(rows)
    receipts = await _receipts(conn, requests)
    batch = Batch(outcomes=[])
    columns = _Columns()
    for request in requests:
        key = request.key
        row = rows.get(key)
        if row is None:
            batch.outcomes.append(StreamNotFound("no such stream"))
            continue
        pins = digest_pins[row["pins_digest"]]
        usage = usages[key]
        try:
            result = _decide(row, pins, usage, request, receipts)
        except StreamError as exc:
            batch.outcomes.append(exc)
            continue
        batch.outcomes.append(result)
        if result.replayed:
            continue
        is_input = pins.direction == "input"
        columns.add(request, row, result.first_sequence, usage.appended_bytes, is_input)
        usages[key] = credit.Usage(
            result.last_sequence, usage.appended_bytes + request.size, usage.base_sequence, usage.base_bytes
        )
        if request.idempotency_key is not None:  # a retry within this batch replays this result
            receipts[(request.run_id, request.stream_id, request.idempotency_key)] = (request.digest, result)
        earlier = batch.written.get(key)
        batch.written[key] = (earlier[0] if earlier else result.first_sequence, result.last_sequence, is_input)
        if row["watched"]:
            batch.watched.add(key)
        for offset, record in enumerate(request.records):
            batch.records_by_kind[record.kind] = batch.records_by_kind.get(record.kind, 0) + 1
            batch.appended.append((request.run_id, request.stream_id, result.first_sequence + offset, pins, record))
    if batch.written:
        counters = [(rows[key]["stream_key"], usages[key]) for key in batch.written]
        arguments = [
            *columns.records,
            [stream_key for stream_key, _ in counters],
            [u.last_sequence for _, u in counters],
            [u.appended_bytes for _, u in counters],
        ]
        if columns.receipts[0] or columns.deliveries[0]:
            await conn.execute(_WRITE, *arguments, *columns.receipts, *columns.deliveries)
        else:
            await conn.execute(_WRITE_RECORDS, *arguments)
        renewed = [key for key in batch.written if rows[key]["durable_ttl_seconds"] is not None]
        if renewed:
            await conn.execute(_TOUCH, [k[0] for k in renewed], [k[1] for k in renewed])
        batch.timeline = next(iter(rows.values()))["timeline"]
    return batch


async def append_locked(
    conn: asyncpg.Connection, run_id: str, stream_id: str, records: list[RecordIn], principal: Principal
) -> tuple[AppendResult, Batch]:
    """One append in the caller's transaction, whose stream row it may already hold (object commits).
    The caller publishes ``batch.signals()`` after COMMIT."""
    batch = await append_batch(conn, [AppendRequest(run_id, stream_id, records, principal)])
    (outcome,) = batch.outcomes
    if isinstance(outcome, StreamError):
        raise outcome
    return outcome, batch
