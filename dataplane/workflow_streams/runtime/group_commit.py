"""Group commit across streams: concurrent appends in a process share transactions.

Appends to any streams queue here (``runtime.batches``). While fewer than ``max_inflight`` transactions
are running, the next one takes everything queued (up to ``max_batch`` requests) and
``store.appends.append_batch`` decides each request on its own under the stream row locks. A quiet
process therefore commits each append at once, and a busy one pays a transaction, its row locks and its
WAL flush once per batch instead of once per request: with 1,000 streams that is the difference between
1,000 transactions and a handful.

A transaction is three round trips under load: the lock statement, the write, and a COMMIT that also
begins the next transaction on the same connection (its BEGIN would be a round trip of its own, and
under load a round trip is mostly the wait for a turn of the busy event loop, not work in Postgres).

After COMMIT returns, the batch's wake signals are published (this process's subscribers wake at once;
other processes hear through the wake source, of the streams some process watches: ``runtime.interest``).
Nothing is announced before it is durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from ..adapters import metrics
from ..adapters.payloadlog import log_payload
from ..domain.errors import Backpressure, BatchExceedsCredit, QuotaExhausted, StreamError
from ..store import db
from ..store.appends import BEGIN, AppendRequest, AppendResult, Batch, append_batch
from ..store.db import DB_UNAVAILABLE
from .batches import Batches
from .durability import Durability
from .retries import lost_connection
from .wakes import ACKS, WakeHub

log = logging.getLogger(__name__)

T = TypeVar("T")

# tries of one batch: deadlocks with lockers outside our key order, connections lost before COMMIT
_ATTEMPTS = 3

# a blocked appender re-checks its credit at least this often, in case an ack's signal was lost
_ACK_POLL_SECONDS = 1.0

# a request, its caller's future, and the loop time by which it must be answered (its deadline counts
# from its arrival: one queued behind a transaction that hangs has spent part of it already)
_Waiter = tuple[AppendRequest, "asyncio.Future[AppendResult]", float]

_REJECTION_REASONS: dict[type[StreamError], str] = {
    Backpressure: "unread_full",
    QuotaExhausted: "quota_exhausted",
    BatchExceedsCredit: "batch_too_large",
}


class GroupCommit:
    # Transactions in flight at once: while one commits, the next batch gathers. One, not two: under
    # load the event loop is the bottleneck and requests reach the queue one at a time, so a second
    # free slot takes each alone, and every append then pays a transaction's fixed cost (in the server
    # and in Postgres) that a batch would share (figures: bench/README.md, constants).
    MAX_INFLIGHT = 1

    # How long a transaction gathers more requests when the one before it carried several: turns of the
    # event loop. With one transaction in flight, a worker's connections otherwise split into two
    # cohorts that take turns: the requests a commit answers come back (a client round trip later) while
    # the other cohort's transaction runs, so every batch is half of what is in flight. Gathering lets
    # them meet. Counted in turns, not time: uvloop rounds a delay to whole milliseconds, so a window
    # shorter than that is no wait at all or a much longer one. A real millisecond gathers more but
    # answers later, none at all halves the batches, and a few turns more or fewer do as well as two
    # (figures: bench/README.md, constants). A lone appender never gathers.
    GATHER_TURNS = 2

    # How long a connection whose COMMIT began the next transaction waits for that transaction before it
    # is rolled back and given back: the last commit of a burst keeps one, and nothing should be left
    # idle inside a transaction after the burst (nor meet an idle_in_transaction_session_timeout).
    KEEP_SECONDS = 0.1

    def __init__(
        self,
        pool: db.Pool,
        hub: WakeHub,
        durability: Durability,
        *,
        max_batch: int = 512,
        max_inflight: int = MAX_INFLIGHT,
        gather: Callable[[], Awaitable[None]] | None = None,
        keep_seconds: float = KEEP_SECONDS,
    ) -> None:
        self._pool = pool
        self._hub = hub
        self._durability = durability
        self._max_batch = max_batch
        # what a transaction awaits to gather more requests: GATHER_TURNS turns of the loop, unless given
        self._gather = gather or _gather_turns(self.GATHER_TURNS)
        self._last_batch = 0  # requests in the batch taken last
        # A connection whose COMMIT began the next transaction, kept for it: under load every transaction
        # would otherwise open with a BEGIN round trip of its own (see _transaction).
        self._keep_seconds = keep_seconds
        self._begun: asyncpg.Connection | None = None
        self._give_back: asyncio.TimerHandle | None = None
        self._giving_back: set[asyncio.Task[None]] = set()
        self._closed = False
        self._batches: Batches[_Waiter] = Batches(
            self._commit_batch,
            max_batch=max_batch,
            max_inflight=max_inflight,
            name="wfs-group-commit",
            gather=self._gather_if_busy,
        )

    def append(self, request: AppendRequest) -> asyncio.Future[AppendResult]:
        """One attempt, queued: its future is the request's result, or the error that refused it."""
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._batches.add((request, future, self._pool.deadline()))
        # A caller that goes away cancels only its own future: the commit is a task of its own, and
        # it skips the outcomes nobody awaits any more. (No shield: it cost a future per append. The
        # future itself, not a coroutine awaiting it: one frame less per append.)
        return future

    async def _gather_if_busy(self, queued: int) -> None:
        # after a batch of several, a transaction first gathers more (GATHER_TURNS)
        if self._last_batch > 1 and queued < self._max_batch:
            await self._gather()

    async def _commit_batch(self, waiters: list[_Waiter]) -> None:
        self._last_batch = len(waiters)
        await self._commit(waiters)

    async def _commit(self, waiters: list[_Waiter]) -> None:
        requests = [request for request, _, _ in waiters]
        try:
            batch = await self._transaction(requests, min(until for _, _, until in waiters))
        except asyncpg.PostgresError as exc:
            if len(waiters) == 1 or isinstance(exc, DB_UNAVAILABLE):
                _fail(waiters, exc)
                return
            # one request Postgres refuses must not fail the others: each again, alone
            log.warning("group commit of %d appends failed (%s); retrying each alone", len(waiters), exc)
            await asyncio.gather(*(self._commit([waiter]) for waiter in waiters))
            return
        except BaseException as exc:  # the transaction failed: every caller learns why
            _fail(waiters, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._hub.publish(batch.signals(), remote=batch.remote_signals())
        _account(batch)
        for (_, future, _), outcome in zip(waiters, batch.outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, StreamError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def _transaction(self, requests: list[AppendRequest], until: float) -> Batch:
        """The batch in one transaction, tried again (at once, at most ``_ATTEMPTS`` times in all) after a
        deadlock or a connection lost before its COMMIT was sent; every try by loop time ``until``."""
        retryable = (asyncpg.DeadlockDetectedError, _Unsent)
        try:
            try:
                # the first try runs outside the retry loop: every transaction makes it, and only a retry
                # should pay for tenacity's machinery (figures: bench/README.md, constants)
                return await self._attempt(requests, until)
            except retryable:
                pass
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(_ATTEMPTS - 1), retry=retry_if_exception_type(retryable), reraise=True
            ):
                with attempt:
                    return await self._attempt(requests, until)
        except _Unsent as exc:
            assert exc.__cause__ is not None
            raise exc.__cause__ from None
        raise AssertionError("unreachable")

    async def _attempt(self, requests: list[AppendRequest], until: float) -> Batch:
        committing = False
        conn = self._take_begun()
        try:
            if conn is None:  # inside the try: a connection that cannot be had is retried like a lost one
                conn = await self._pool.take(until)
            with db.deadline(conn, until):
                if not conn.is_in_transaction():
                    await conn.execute(BEGIN)
                batch = await append_batch(conn, requests)
                committing = True
                sent_at = self._durability.tick()
                if (self._batches.queued or len(requests) > 1) and not self._closed:
                    # Busy (requests wait, or this batch carried several): the next transaction is
                    # likely to follow at once, so this COMMIT begins it in the same round trip, and it
                    # opens with its lock statement. Not only when requests are queued at COMMIT: the
                    # next requests are often still on their way from the clients this commit answers
                    # (figures: bench/README.md, constants). An unused one is given back after KEEP_SECONDS.
                    await conn.execute("COMMIT; " + BEGIN)
                    self._keep_begun(conn)
                    conn = None
                else:
                    await conn.execute("COMMIT")
            if batch.timeline is not None:  # it wrote WAL, so its COMMIT waited for what replication requires
                self._durability.commit_returned(sent_at, batch.timeline)
                self._durability.note_written(batch.written, batch.timeline)
            return batch
        except DB_UNAVAILABLE as exc:
            # A connection lost before its COMMIT was sent committed nothing, so the batch is tried
            # again on another (after a failover every pooled connection is dead, and each would
            # otherwise cost its batch a 503). asyncpg's InternalClientError refuses a statement before
            # sending it, so a COMMIT refused with it was not sent either (store.db). Lost during the
            # COMMIT, or out of time, the callers get the 503, and their Idempotency-Keys make their
            # retries safe.
            unsent = not committing or isinstance(exc, asyncpg.InternalClientError)
            if unsent and lost_connection(exc):
                log.info("group commit lost its connection before COMMIT was sent (%s); trying again", exc)
                raise _Unsent() from exc
            raise
        finally:
            if conn is not None:
                await self._release(conn)

    async def _release(self, conn: asyncpg.Connection) -> None:
        # a transaction that failed is rolled back here: the pool would too, but log it as a leak
        try:
            if not conn.is_closed() and conn.is_in_transaction():
                await conn.execute("ROLLBACK")
        except DB_UNAVAILABLE:
            pass  # a dead connection: the pool replaces it
        finally:
            await self._pool.release(conn)

    def _keep_begun(self, conn: asyncpg.Connection) -> None:
        # Transactions can run at once (a refused batch is retried request by request), and each may begin
        # the next: one is kept, the one it replaces goes back (dropped, it stayed in its transaction).
        self._give_back_soon(self._take_begun())
        self._begun = conn
        self._give_back = asyncio.get_running_loop().call_later(self._keep_seconds, self._give_back_unused, conn)

    def _take_begun(self) -> asyncpg.Connection | None:
        conn, self._begun = self._begun, None
        if self._give_back is not None:
            self._give_back.cancel()
            self._give_back = None
        return conn

    def _give_back_unused(self, conn: asyncpg.Connection) -> None:
        if self._begun is conn:  # not taken meanwhile
            self._give_back_soon(self._take_begun())

    def _give_back_soon(self, conn: asyncpg.Connection | None) -> None:
        if conn is not None:
            task = asyncio.create_task(self._release(conn), name="wfs-group-commit-give-back")
            self._giving_back.add(task)
            task.add_done_callback(self._giving_back.discard)

    async def close(self) -> None:
        """Let the transactions in flight end (each within its deadline), then give back the connection a
        busy moment left begun (the pool's close waits for it). A COMMIT is never cancelled: its task
        is this object's, and it ends before the event loop's own shutdown would cancel it (a cancelled
        COMMIT waiting for a synchronous standby stays committed unreplicated: store.db)."""
        self._closed = True
        await self._batches.drain()
        conn = self._take_begun()
        if conn is not None:
            await self._release(conn)
        await asyncio.gather(*self._giving_back)


class _Unsent(Exception):
    """The batch's connection was lost before its COMMIT was sent: nothing was committed (the cause)."""


def _gather_turns(count: int) -> Callable[[], Awaitable[None]]:
    async def gather() -> None:
        for _ in range(count):
            await asyncio.sleep(0)  # asyncio's own "let everything ready run first"

    return gather


def _fail(waiters: list[_Waiter], exc: BaseException) -> None:
    for _, future, _ in waiters:
        if not future.done():
            future.set_exception(exc)


def _account(batch: Batch) -> None:
    metrics.GROUP_COMMIT_REQUESTS.observe(len(batch.outcomes))
    for kind, count in batch.records_by_kind.items():
        metrics.APPENDED_RECORDS.labels(kind).inc(count)
    for outcome in batch.outcomes:
        reason = _REJECTION_REASONS.get(type(outcome)) if isinstance(outcome, StreamError) else None
        if reason is not None:
            metrics.CREDIT_REJECTIONS.labels(reason).inc()
    for run_id, stream_id, sequence, pins, record in batch.appended:
        log_payload(f"appended {run_id}/{stream_id}/{sequence}", pins, record.payload, record.content_type)


async def with_credit_wait(hub: WakeHub, run_id: str, stream_id: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """Run ``attempt``; under the ``block`` policy, on backpressure wait for an ack (bounded by the
    pinned timeout) and try again. Every try decides credit afresh under the row lock."""
    loop = asyncio.get_running_loop()
    started = loop.time()  # the pinned timeout counts from the first attempt
    try:
        return await attempt()  # most appends have credit: no watch to set up and take down
    except Backpressure as exc:
        if exc.block_seconds <= 0:
            raise
    while True:
        # watch before trying again, so an ack that lands between the attempt and the wait still
        # wakes us (an ack before the watch is seen by the attempt, which reads acks afresh)
        with hub.watch(ACKS, run_id, stream_id) as acked:
            try:
                return await attempt()
            except Backpressure as exc:
                remaining = started + exc.block_seconds - loop.time()
                if remaining <= 0:
                    raise
                metrics.CREDIT_WAITS.inc()
                await acked.wait(min(remaining, _ACK_POLL_SECONDS))


async def append_records(group: GroupCommit, hub: WakeHub, request: AppendRequest) -> AppendResult:
    """An append as the HTTP API makes it: group-committed, waiting for credit when the pins say block."""
    return await with_credit_wait(hub, request.run_id, request.stream_id, lambda: group.append(request))
