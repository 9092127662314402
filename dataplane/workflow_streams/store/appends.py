"""Appending records: credit is decided under the stream row lock from durable counters."""

from __future__ import annotations

import asyncio
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
)
from ..domain.pins import Credit
from ..domain.records import RecordIn, request_digest
from ..payloadlog import log_payload
from . import wakes
from .definitions import lock_stream, pins_of

T = TypeVar("T")

RETRY_AFTER_SECONDS = 1
# an ack notification may be lost (reconnect); blocked appenders re-check at least this often
_ACK_POLL_SECONDS = 1.0


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


_INSERT_RECORDS = """
INSERT INTO wfs_records
    (run_id, stream_id, sequence, kind, content_type, payload, size_bytes, cumulative_bytes, object,
     appended_by, appended_at)
SELECT $1, $2, r.sequence, r.kind, r.content_type, r.payload, r.size_bytes, r.cumulative_bytes, r.object,
       $3, clock_timestamp()
FROM unnest($4::bigint[], $5::text[], $6::text[], $7::bytea[], $8::bigint[], $9::bigint[], $10::jsonb[])
     AS r(sequence, kind, content_type, payload, size_bytes, cumulative_bytes, object)
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


async def append_once(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    records: list[RecordIn],
    principal: Principal,
    idempotency_key: str | None = None,
) -> AppendResult:
    """One attempt, in one transaction: all records are appended, or none."""
    digest = request_digest(records)
    async with conn.transaction():
        row = await lock_stream(conn, run_id, stream_id)
        require(pins_of(row).authorization, principal, "append")
        if idempotency_key is not None:
            receipt = await conn.fetchrow(
                """SELECT request_digest, first_sequence, last_sequence FROM wfs_append_receipts
                   WHERE run_id = $1 AND stream_id = $2 AND idempotency_key = $3""",
                run_id,
                stream_id,
                idempotency_key,
            )
            if receipt is not None:
                if receipt["request_digest"] != digest:
                    raise IdempotencyKeyReused("this Idempotency-Key was used for different records")
                return AppendResult(receipt["first_sequence"], receipt["last_sequence"], replayed=True)
        result = await append_locked(conn, row, records, principal)
        if idempotency_key is not None:
            await conn.execute(
                """INSERT INTO wfs_append_receipts
                   (run_id, stream_id, idempotency_key, request_digest, first_sequence, last_sequence,
                    created_by)
                   VALUES ($1, $2, $3, $4, $5, $6, $7)""",
                run_id,
                stream_id,
                idempotency_key,
                digest,
                result.first_sequence,
                result.last_sequence,
                principal.name,
            )
        return result


async def append_locked(
    conn: asyncpg.Connection, row: asyncpg.Record, records: list[RecordIn], principal: Principal
) -> AppendResult:
    """Append under the stream row lock ``row`` (already taken in this transaction): closed check,
    credit, records, counters, input outbox rows and the wake notification."""
    run_id, stream_id = row["run_id"], row["stream_id"]
    pins = pins_of(row)
    if row["closed_at"] is not None:
        raise StreamClosed("the stream is closed; appends are rejected")
    usage = await _usage(conn, row)
    _check_credit(pins.credit, usage, records)

    first = usage.last_sequence + 1
    sequences = list(range(first, first + len(records)))
    cumulative, total = [], usage.appended_bytes
    for record in records:
        total += record.size
        cumulative.append(total)
    last = sequences[-1]
    await conn.execute(
        _INSERT_RECORDS,
        run_id,
        stream_id,
        principal.name,
        sequences,
        [r.kind for r in records],
        [r.content_type for r in records],
        [r.payload for r in records],
        [r.size for r in records],
        cumulative,
        [r.object for r in records],
    )
    await conn.execute(
        "UPDATE wfs_streams SET last_sequence = $3, appended_bytes = $4 WHERE run_id = $1 AND stream_id = $2",
        run_id,
        stream_id,
        last,
        total,
    )
    if pins.direction == "input":
        await conn.execute(
            _INSERT_DELIVERIES, run_id, stream_id, sequences, [event_id(run_id, stream_id, s) for s in sequences]
        )
    # delivered by Postgres only after COMMIT: a wake never precedes the durable records
    await conn.execute("SELECT pg_notify($1, $2)", wakes.RECORDS, wakes.payload(run_id, stream_id, first, last))
    for record in records:
        metrics.APPENDED_RECORDS.labels(record.kind).inc()
    for sequence, record in zip(sequences, records, strict=True):
        log_payload(f"appended {run_id}/{stream_id}/{sequence}", pins, record.payload, record.content_type)
    return AppendResult(first, last, replayed=False)


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
    pool: asyncpg.Pool,
    hub: wakes.WakeHub,
    run_id: str,
    stream_id: str,
    records: list[RecordIn],
    principal: Principal,
    idempotency_key: str | None = None,
) -> AppendResult:
    async def attempt() -> AppendResult:
        async with pool.acquire() as conn:
            return await append_once(conn, run_id, stream_id, records, principal, idempotency_key)

    return await with_credit_wait(hub, run_id, stream_id, attempt)
