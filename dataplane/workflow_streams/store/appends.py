"""Appending records: credit is decided under the stream row lock from durable counters.

Every append goes through ``_append_requests``: under the stream's row lock it takes one or more
append requests in order, decides each (rights, idempotency receipt, closed, credit) against counters
it advances as it goes, and writes the accepted ones with one INSERT, one counter UPDATE and one
NOTIFY. ``AppendCoalescer`` uses that to group-commit concurrent appends to the same stream: a hot
stream's row lock and fsync are paid once per batch instead of once per request.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from .. import metrics
from ..domain import credit
from ..domain.authz import Principal, require
from ..domain.delivery import event_id
from ..domain.errors import (
    Backpressure,
    BatchExceedsCredit,
    IdempotencyKeyReused,
    QuotaExhausted,
    StreamClosed,
    StreamError,
)
from ..domain.pins import Credit, StreamPins
from ..domain.records import RecordIn, request_digest
from ..payloadlog import log_payload
from . import wakes
from .definitions import lock_stream, pins_of

T = TypeVar("T")

RETRY_AFTER_SECONDS = 1
# an ack notification may be lost (reconnect); blocked appenders re-check at least this often
_ACK_POLL_SECONDS = 1.0
# requests one group commit takes at most
_MAX_GROUP = 256


@dataclass(frozen=True)
class AppendResult:
    first_sequence: int
    last_sequence: int
    replayed: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "first_sequence": self.first_sequence,
            "last_sequence": self.last_sequence,
            "sequences": list(range(self.first_sequence, self.last_sequence + 1)),
        }


@dataclass
class AppendRequest:
    records: list[RecordIn]
    principal: Principal
    idempotency_key: str | None = None

    @functools.cached_property
    def digest(self) -> str:
        """Only requests with an Idempotency-Key need it: not hashed on every append."""
        return request_digest(self.records)


_INSERT_RECORDS = """
INSERT INTO wfs_records
    (run_id, stream_id, sequence, kind, content_type, payload, size_bytes, cumulative_bytes, object,
     appended_by, appended_at)
SELECT $1, $2, r.sequence, r.kind, r.content_type, r.payload, r.size_bytes, r.cumulative_bytes, r.object,
       r.appended_by, clock_timestamp()
FROM unnest($3::bigint[], $4::text[], $5::text[], $6::bytea[], $7::bigint[], $8::bigint[], $9::jsonb[],
            $10::text[])
     AS r(sequence, kind, content_type, payload, size_bytes, cumulative_bytes, object, appended_by)
"""

_INSERT_RECEIPTS = """
INSERT INTO wfs_append_receipts
    (run_id, stream_id, idempotency_key, request_digest, first_sequence, last_sequence, created_by)
SELECT $1, $2, r.key, r.digest, r.first, r.last, r.created_by
FROM unnest($3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::text[]) AS r(key, digest, first, last, created_by)
"""

_INSERT_DELIVERIES = """
INSERT INTO wfs_input_deliveries (run_id, stream_id, sequence, event_id)
SELECT $1, $2, d.sequence, d.event_id FROM unnest($3::bigint[], $4::text[]) AS d(sequence, event_id)
"""


async def _usage(conn: asyncpg.Connection, row: asyncpg.Record) -> credit.Usage:
    min_ack = await conn.fetchval(
        "SELECT min(acked_sequence) FROM wfs_consumers WHERE run_id = $1 AND stream_id = $2",
        row["run_id"],
        row["stream_id"],
    )
    base = credit.base_sequence(min_ack, row["earliest_sequence"])
    if base == row["earliest_sequence"] - 1:
        base_bytes = row["pruned_bytes"]
    else:
        base_bytes = await conn.fetchval(
            """SELECT cumulative_bytes FROM wfs_records
               WHERE run_id = $1 AND stream_id = $2 AND sequence = $3""",
            row["run_id"],
            row["stream_id"],
            base,
        )
    return credit.Usage(row["last_sequence"], row["appended_bytes"], base, base_bytes)


def _check_credit(pins_credit: Credit, usage: credit.Usage, records: list[RecordIn]) -> None:
    verdict = credit.decide(pins_credit, usage, len(records), sum(r.size for r in records))
    if verdict is not credit.Verdict.ALLOW:
        metrics.CREDIT_REJECTIONS.labels(verdict.value).inc()
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


async def _append_requests(
    conn: asyncpg.Connection, row: asyncpg.Record, requests: list[AppendRequest]
) -> list[AppendResult | StreamError]:
    """Decide and write ``requests`` in order under the stream row lock ``row`` (taken by the caller in
    this transaction). Each gets its result or the error that refused it; refusals write nothing."""
    run_id, stream_id = row["run_id"], row["stream_id"]
    pins = pins_of(row)
    usage = await _usage(conn, row)
    outcomes: list[AppendResult | StreamError] = []
    accepted: list[tuple[AppendRequest, int]] = []  # (request, its first sequence)
    in_batch: dict[str, tuple[str, AppendResult]] = {}
    for request in requests:
        try:
            outcomes.append(await _decide(conn, row, pins, usage, request, in_batch))
        except StreamError as exc:
            outcomes.append(exc)
            continue
        result = outcomes[-1]
        assert isinstance(result, AppendResult)
        if not result.replayed:
            accepted.append((request, result.first_sequence))
            usage = credit.Usage(
                result.last_sequence,
                usage.appended_bytes + sum(r.size for r in request.records),
                usage.base_sequence,
                usage.base_bytes,
            )
            if request.idempotency_key is not None:
                in_batch[request.idempotency_key] = (request.digest, result)
    if accepted:
        await _write(conn, run_id, stream_id, pins.direction, row["appended_bytes"], accepted, usage)
        for request, first in accepted:
            for offset, record in enumerate(request.records):
                metrics.APPENDED_RECORDS.labels(record.kind).inc()
                log_payload(
                    f"appended {run_id}/{stream_id}/{first + offset}", pins, record.payload, record.content_type
                )
    return outcomes


async def _decide(
    conn: asyncpg.Connection,
    row: asyncpg.Record,
    pins: StreamPins,
    usage: credit.Usage,
    request: AppendRequest,
    in_batch: dict[str, tuple[str, AppendResult]],
) -> AppendResult:
    require(pins.authorization, request.principal, "append")
    key = request.idempotency_key
    if key is not None:
        earlier = in_batch.get(key)
        if earlier is None:
            receipt = await conn.fetchrow(
                """SELECT request_digest, first_sequence, last_sequence FROM wfs_append_receipts
                   WHERE run_id = $1 AND stream_id = $2 AND idempotency_key = $3""",
                row["run_id"],
                row["stream_id"],
                key,
            )
            if receipt is not None:
                earlier = (
                    receipt["request_digest"],
                    AppendResult(receipt["first_sequence"], receipt["last_sequence"], False),
                )
        if earlier is not None:
            if earlier[0] != request.digest:
                raise IdempotencyKeyReused("this Idempotency-Key was used for different records")
            return AppendResult(earlier[1].first_sequence, earlier[1].last_sequence, replayed=True)
    if row["closed_at"] is not None:
        raise StreamClosed("the stream is closed; appends are rejected")
    _check_credit(pins.credit, usage, request.records)
    first = usage.last_sequence + 1
    return AppendResult(first, first + len(request.records) - 1, replayed=False)


async def _write(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    direction: str,
    bytes_before: int,
    accepted: list[tuple[AppendRequest, int]],
    usage: credit.Usage,
) -> None:
    records = [(first + i, record, request) for request, first in accepted for i, record in enumerate(request.records)]
    cumulative, total = [], bytes_before
    for _, record, _ in records:
        total += record.size
        cumulative.append(total)
    sequences = [sequence for sequence, _, _ in records]
    await conn.execute(
        _INSERT_RECORDS,
        run_id,
        stream_id,
        sequences,
        [r.kind for _, r, _ in records],
        [r.content_type for _, r, _ in records],
        [r.payload for _, r, _ in records],
        [r.size for _, r, _ in records],
        cumulative,
        [r.object for _, r, _ in records],
        [q.principal.name for _, _, q in records],
    )
    await conn.execute(
        "UPDATE wfs_streams SET last_sequence = $3, appended_bytes = $4 WHERE run_id = $1 AND stream_id = $2",
        run_id,
        stream_id,
        usage.last_sequence,
        usage.appended_bytes,
    )
    keyed = [(q, first) for q, first in accepted if q.idempotency_key is not None]
    if keyed:
        await conn.execute(
            _INSERT_RECEIPTS,
            run_id,
            stream_id,
            [q.idempotency_key for q, _ in keyed],
            [q.digest for q, _ in keyed],
            [first for _, first in keyed],
            [first + len(q.records) - 1 for q, first in keyed],
            [q.principal.name for q, _ in keyed],
        )
    if direction == "input":
        await conn.execute(
            _INSERT_DELIVERIES, run_id, stream_id, sequences, [event_id(run_id, stream_id, s) for s in sequences]
        )
    # delivered by Postgres only after COMMIT: a wake never precedes the durable records
    await conn.execute(
        "SELECT pg_notify($1, $2)", wakes.RECORDS, wakes.payload(run_id, stream_id, sequences[0], sequences[-1])
    )


def _one(outcome: AppendResult | StreamError) -> AppendResult:
    if isinstance(outcome, StreamError):
        raise outcome
    return outcome


async def append_locked(
    conn: asyncpg.Connection, row: asyncpg.Record, records: list[RecordIn], principal: Principal
) -> AppendResult:
    """Append under the stream row lock ``row``, already taken in this transaction (object commits)."""
    (outcome,) = await _append_requests(conn, row, [AppendRequest(records, principal)])
    return _one(outcome)


async def append_once(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    records: list[RecordIn],
    principal: Principal,
    idempotency_key: str | None = None,
) -> AppendResult:
    """One attempt, in one transaction of its own: all records are appended, or none."""
    async with conn.transaction():
        row = await lock_stream(conn, run_id, stream_id)
        (outcome,) = await _append_requests(conn, row, [AppendRequest(records, principal, idempotency_key)])
    return _one(outcome)


class AppendCoalescer:
    """Group commit per stream within this process: while one transaction for a stream is in flight,
    appends to that stream queue up, and the next transaction takes them all. Each caller still gets
    exactly its own result or error; ordering follows arrival."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._queues: dict[tuple[str, str], list[tuple[AppendRequest, asyncio.Future[AppendResult]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def append(self, run_id: str, stream_id: str, request: AppendRequest) -> AppendResult:
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        key = (run_id, stream_id)
        queue = self._queues.get(key)
        if queue is None:
            self._queues[key] = [(request, future)]
            # a task of its own: a caller that goes away must not take the others' commit with it
            task = asyncio.create_task(self._drain(key), name=f"wfs-append-{run_id}/{stream_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            queue.append((request, future))
        return await asyncio.shield(future)

    async def _drain(self, key: tuple[str, str]) -> None:
        queue = self._queues[key]
        try:
            while queue:
                batch = queue[:_MAX_GROUP]
                del queue[:_MAX_GROUP]
                await self._commit(key, batch)
        finally:
            del self._queues[key]

    async def _commit(
        self, key: tuple[str, str], batch: list[tuple[AppendRequest, asyncio.Future[AppendResult]]]
    ) -> None:
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                row = await lock_stream(conn, *key)
                outcomes = await _append_requests(conn, row, [request for request, _ in batch])
        except Exception as exc:  # the whole transaction failed: every caller learns why
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, StreamError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


async def with_credit_wait(hub: wakes.WakeHub, run_id: str, stream_id: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """Run ``attempt``; under the ``block`` policy, on backpressure wait for an ack (bounded by the
    pinned timeout) and try again."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        # watch before trying, so an ack that lands between the attempt and the wait still wakes us
        with hub.watch(wakes.ACKS, run_id, stream_id) as acked:
            try:
                return await attempt()
            except Backpressure as exc:
                remaining = started + exc.block_seconds - loop.time()
                if remaining <= 0:
                    raise
                metrics.CREDIT_WAITS.inc()
                await acked.wait(min(remaining, _ACK_POLL_SECONDS))


async def append_records(
    coalescer: AppendCoalescer,
    hub: wakes.WakeHub,
    run_id: str,
    stream_id: str,
    records: list[RecordIn],
    principal: Principal,
    idempotency_key: str | None = None,
) -> AppendResult:
    request = AppendRequest(records, principal, idempotency_key)
    return await with_credit_wait(hub, run_id, stream_id, lambda: coalescer.append(run_id, stream_id, request))
