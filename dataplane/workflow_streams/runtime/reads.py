"""Shared reads for live connections: one query and one encoding per wake, whatever the audience.

Subscribers of one stream woken together at the same cursor share one read (single flight), reads of
many streams go to Postgres together in one statement, and each surface's encoding of the page is
made once, on first use, and written to every connection as it is.

A subscriber joins an in-flight read only if that read started after the wake it is answering: a read
that began before a commit was announced may not contain it, and a subscriber handed such a read would
sleep until the *next* append. Reads remember the wake generation (``WakeHub.generation``) at which
they started; a subscriber woken at generation ``g`` joins only reads started at ``g`` or later.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncGenerator, Callable, Hashable
from typing import TypeVar

from ..domain.authz import Access
from ..domain.errors import StreamError
from ..store import bodies, reads
from ..store.bodies import Body, Form, Part, Plan
from ..store.db import DB_UNAVAILABLE, Pool
from ..store.reads import Page, PageKey, fetch_pages
from .batches import Batches
from .durability import Durability
from .wakes import WakeHub

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R", Page, Plan)


class SharedPage:
    """A page and its encodings, each computed once for every connection that reads it: a surface's
    encoder keeps what it made of the page here (``memo``), so a fan-out to 1,000 subscribers encodes a
    record once, not 1,000 times."""

    __slots__ = ("_memo", "_sequences", "page")

    def __init__(self, page: Page) -> None:
        self.page = page
        self._sequences: list[int] | None = None
        self._memo: dict[Hashable, object] = {}

    def start_after(self, last: int) -> int:
        """The index of the page's first record after ``last``: what a connection at ``last`` has not
        been given (boundary duplicates are dropped here)."""
        if self._sequences is None:
            self._sequences = [r.sequence for r in self.page.records]
        return bisect.bisect_right(self._sequences, last)

    def memo(self, key: Hashable, make: Callable[..., T], *args: object) -> T:
        """``make(self, *args)``, computed on first use and kept with the page under ``key``: a fan-out
        to 1,000 followers at one position encodes the page for them once."""
        try:
            return self._memo[key]  # type: ignore[return-value]
        except KeyError:
            value = self._memo[key] = make(self, *args)
            return value


class _Flight:
    __slots__ = ("future", "generation", "until")

    def __init__(self, generation: int, future: asyncio.Future[SharedPage], until: float) -> None:
        self.generation = generation
        self.future = future
        self.until = until  # the deadline of its first reader (store.db.Pool.acquire)

    @property
    def records(self) -> int:
        """Records of its page (an ended read's: only those are kept)."""
        return len(self.future.result().page.records)


class SharedReads:
    """Page reads for subscribers, shared per key and batched across streams.

    A read of a key (stream, cursor, limit) already queued or in flight is joined if it started at or
    after the caller's wake; otherwise the key queues. While fewer than ``max_inflight`` reads run, the
    next takes every queued key (up to ``max_batch``) and reads them all in one statement
    (``store.reads.fetch_pages``), as the group commit writes many streams in one transaction: a burst
    of subscribers over many streams, or a wake of many streams' fan-outs, is a few round trips, not
    one per stream. The batching is the group commit's (``runtime.batches``): the keys queued in the
    same turn of the event loop, or while the statement before ran, go together.
    """

    # Statements in flight at once: one, as for the group commit, so that a burst's keys queue while a
    # statement runs and go in the next together. With more, uvloop's evenly served burst sends most keys
    # alone (figures: bench/README.md, constants). The price: a batch of long catch-up pages delays the
    # live reads queued behind it, which is why a batch is bounded (MAX_BATCH).
    MAX_INFLIGHT = 1
    # Keys per statement: each brings up to a page of records, so a batch is bounded in rows too.
    MAX_BATCH = 64
    # Ended reads kept for joiners while no signal has ticked the clock since they started (see
    # ``_keep``), at most this many keys and records.
    MAX_KEPT = 4096
    MAX_KEPT_RECORDS = 16_384

    def __init__(
        self,
        pool: Pool,
        hub: WakeHub,
        durability: Durability,
        *,
        max_inflight: int = MAX_INFLIGHT,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._pool = pool
        self._hub = hub
        self._durability = durability
        self._confirming: set[asyncio.Task[None]] = set()
        self._flights: dict[PageKey, _Flight] = {}  # the newest read of each key, queued or running
        # the newest ended read of each key, oldest first, kept while the clock stays where it was
        self._kept: dict[PageKey, _Flight] = {}
        self._kept_records = 0
        self._kept_at = 0  # the clock when the kept reads were kept
        self._batches: Batches[tuple[PageKey, _Flight]] = Batches(
            self._read, max_batch=max_batch, max_inflight=max_inflight, name="wfs-shared-reads"
        )

    async def page(self, run_id: str, stream_id: str, after: int, limit: int, woken_at: int) -> SharedPage:
        """Records after ``after``, from a read that started no earlier than wake generation ``woken_at``."""
        key = (run_id, stream_id, after, limit)
        flight = self._flights.get(key) or self._kept_read(key)
        if flight is None or flight.generation < woken_at:
            # The generation is taken now, before the statement is sent: the read sees at least every
            # commit announced by then. Newer than any flight it replaces, so later joiners take it.
            flight = _Flight(self._hub.clock, asyncio.get_running_loop().create_future(), self._pool.deadline())
            self._flights[key] = flight
            self._batches.add((key, flight))
        # the read is the batch task's: a caller that goes away cancels only its own wait
        return await asyncio.shield(flight.future)

    async def _read(self, batch: list[tuple[PageKey, _Flight]]) -> None:
        until = min(flight.until for _, flight in batch)
        try:
            async with self._pool.acquire(until=until) as conn:
                outcomes = await fetch_pages(conn, [key for key, _ in batch])
            read_at = self._durability.tick()
        except BaseException as exc:  # the statement failed: every reader of the batch learns why
            for key, flight in batch:
                self._settle(key, flight, exc)
            if not isinstance(exc, Exception):
                raise
            return
        pages = [((key[0], key[1]), outcome) for (key, _), outcome in zip(batch, outcomes, strict=True)]
        if self._durability.unconfirmed(pages):
            # confirmed outside this batch's slot: the next statement need not wait for a barrier
            task = asyncio.create_task(self._confirm(batch, pages, read_at, until), name="wfs-shared-reads-confirm")
            self._confirming.add(task)
            task.add_done_callback(self._confirming.discard)
            return
        self._settle_all(batch, outcomes)

    async def _confirm(
        self,
        batch: list[tuple[PageKey, _Flight]],
        pages: list[tuple[tuple[str, str], Page | StreamError]],
        read_at: int,
        until: float,
    ) -> None:
        try:
            served = await self._durability.confirmed(pages, read_at, until)
        except BaseException as exc:
            for key, flight in batch:
                self._settle(key, flight, exc)
            raise
        self._settle_all(batch, served)

    def _settle_all(self, batch: list[tuple[PageKey, _Flight]], outcomes: list[Page | StreamError]) -> None:
        for (key, flight), outcome in zip(batch, outcomes, strict=True):
            self._settle(key, flight, SharedPage(outcome) if isinstance(outcome, Page) else outcome)

    def _kept_read(self, key: PageKey) -> _Flight | None:
        self._drop_kept_if_signalled()
        return self._kept.get(key)

    def _drop_kept_if_signalled(self) -> None:
        if self._kept_at != self._hub.clock:
            self._kept.clear()  # a signal since: every kept read is older than a reader woken now
            self._kept_records = 0
            self._kept_at = self._hub.clock

    def _keep(self, key: PageKey, flight: _Flight) -> None:
        """An ended read stays joinable while the clock has not moved since it was kept. A joiner's rule
        is the in-flight one (the read started at or after the wake it answers), so a read that ended
        is as good as one still running. It matters for bursts: subscribers spread over many streams
        arrive round robin, a stream's next subscriber many connections after the one before, and on
        uvloop the read it could have joined has usually ended by then (figures: bench/README.md,
        constants)."""
        self._drop_kept_if_signalled()
        if flight.generation != self._kept_at:
            return  # started before a signal: no reader woken from now on may join it
        earlier = self._kept.pop(key, None)
        if earlier is not None:
            self._kept_records -= earlier.records
        self._kept[key] = flight
        self._kept_records += flight.records
        while len(self._kept) > self.MAX_KEPT or self._kept_records > self.MAX_KEPT_RECORDS:
            oldest = next(iter(self._kept))
            self._kept_records -= self._kept.pop(oldest).records

    def _settle(self, key: PageKey, flight: _Flight, outcome: SharedPage | BaseException) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if flight.future.done():
            return
        if isinstance(outcome, SharedPage):
            flight.future.set_result(outcome)
            self._keep(key, flight)
        elif isinstance(outcome, asyncio.CancelledError):
            flight.future.cancel()
        else:
            flight.future.set_exception(outcome)
            flight.future.exception()  # retrieved here: its readers may all have gone


async def read_page(
    pool: Pool,
    durability: Durability,
    run_id: str,
    stream_id: str,
    after: int,
    limit: int,
    *,
    access: Access | None = None,
) -> Page:
    """One caller's page (``store.reads.fetch_page``: with ``access``, checked first), as it may be
    served: only what is as durable as an acknowledged append (``runtime.durability``)."""
    until = pool.deadline()  # the read and its confirmation, together
    async with pool.acquire(until=until) as conn:
        page = await reads.fetch_page(conn, run_id, stream_id, after, limit, access=access)
    return await _served(durability, run_id, stream_id, page, until)


async def plan_read(
    pool: Pool,
    durability: Durability,
    run_id: str,
    stream_id: str,
    after: int,
    form: Form,
    *,
    max_records: int,
    max_bytes: int,
    access: Access | None = None,
) -> Plan:
    """A catch-up page planned (``store.bodies.plan``: rights, the cursor, where the page ends) with its
    first part, ending where what it holds may be served: the records it names exist when it is planned,
    so a durability barrier after the plan covers them, however late they are read."""
    until = pool.deadline()
    async with pool.acquire(until=until) as conn:
        page = await bodies.plan(
            conn,
            run_id,
            stream_id,
            after,
            form,
            max_records=max_records,
            max_bytes=max_bytes,
            first_records=PART_RECORDS,
            access=access,
        )
    return await _served(durability, run_id, stream_id, page, until)


# records of one part of a catch-up page (Postgres joins a part into one value, and larger values cost
# it more a record), and the connections that read a page's parts: up to three, so that Postgres writes
# parts on both cores while this process takes in and hands on the ones before (figures: bench/README.md,
# constants). Only the first is waited for: the others are taken only from what the pool has to spare
# beyond PART_SPARE_KEPT, which a catch-up leaves to appends and live reads. Parts are read at most
# PART_LOOKAHEAD ahead of the one being handed on: a reader slower than Postgres (a client across a slow
# link, with pages of 16 MiB) holds a few megabytes in this process, not its whole page, and no
# connection while it catches up.
PART_RECORDS = 2048
PART_CONNECTIONS = 3
PART_SPARE_KEPT = 4
PART_LOOKAHEAD = 8


async def read_parts(pool: Pool, page: Plan, form: Form) -> AsyncGenerator[Part, None]:
    """The planned page's records in ``form``, part by part (``PART_RECORDS`` each) in sequence order, read
    on up to ``PART_CONNECTIONS`` connections taking turns while the parts before are handed on, at most
    ``PART_LOOKAHEAD`` parts ahead. Records, once written, never change, so the parts need no common
    snapshot; a part whose records are gone (pruned since the plan) raises ``PageChanged``. Close it
    (``contextlib.aclosing``) to stop the reading early."""
    firsts = range(page.after + 1, page.end + 1, PART_RECORDS)  # the plan's first part is the first range
    ranges = [(first, min(first + PART_RECORDS - 1, page.end)) for first in firsts]
    loop = asyncio.get_running_loop()
    parts: list[asyncio.Future[Part]] = [loop.create_future() for _ in ranges]
    read = 0  # parts the plan read with it: the first, in its form
    if parts and page.first is not None and page.form == form:
        parts[0].set_result(page.first)
        read = 1
    width = min(len(ranges) - read, max(1, min(PART_CONNECTIONS, 1 + pool.spare() - PART_SPARE_KEPT)))
    handed = 0  # parts handed on so far
    moved = asyncio.Condition()

    def in_reach(i: int) -> bool:
        return i < handed + PART_LOOKAHEAD

    async def take_turns(lane: int) -> None:
        mine = range(read + lane, len(ranges), width)
        k = 0  # mine[k] is the lane's next part
        try:
            while k < len(mine):
                async with moved:
                    await moved.wait_for(functools.partial(in_reach, mine[k]))
                # a connection only while there is work in reach, each stretch under its own deadline
                async with pool.acquire() as conn:
                    while k < len(mine) and in_reach(mine[k]):
                        i = mine[k]
                        parts[i].set_result(await bodies.fetch_part(conn, page, form, *ranges[i]))
                        k += 1
        except Exception as exc:
            for i in mine[k:]:  # whoever waits for one of this lane's parts learns why it will not come
                if not parts[i].done():
                    parts[i].set_exception(exc)

    lanes = [asyncio.create_task(take_turns(lane)) for lane in range(width)]
    try:
        for part in parts:
            yield await part
            handed += 1
            async with moved:
                moved.notify_all()
    finally:
        for lane in lanes:
            lane.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        for part in parts:  # an error nobody waited for is not an unretrieved one
            if part.done() and not part.cancelled():
                part.exception()


# what ends a catch-up page early once some of it is given out: its records pruned, the database lost
ENDS_A_PAGE: tuple[type[BaseException], ...] = (bodies.PageChanged, *DB_UNAVAILABLE)


async def planned_bodies(pool: Pool, page: Plan, form: Form) -> AsyncGenerator[Body, None]:
    """A planned page as it is read (``read_parts``): a body a part, in order (one empty body when the
    page holds no records), each ending where the next begins, so a reader writes one while Postgres
    writes the next. Its first part's failure is raised, as nothing is given out yet; after that, records
    pruned or the database lost end the page early, and the last body's ``next_after`` is where its reader
    goes on. Close it (``contextlib.aclosing``) to stop the reading early."""
    whole = page.read_whole(form)
    if whole is not None:  # most pages: no lane, task or second connection
        yield whole
        return
    async with contextlib.aclosing(read_parts(pool, page, form)) as parts:
        part = await anext(parts, None)
        body = page.body(form, [] if part is None else [part])
        yield body
        while part is not None:
            try:
                part = await anext(parts, None)
            except ENDS_A_PAGE as exc:
                log.info("catch-up page of stream %d ended early at %d (%r)", page.stream_key, body.next_after, exc)
                return
            if part is not None:
                body = page.body(form, [part], after=body.next_after)
                yield body


async def read_bodies(
    pool: Pool,
    durability: Durability,
    run_id: str,
    stream_id: str,
    after: int,
    form: Form,
    *,
    max_records: int,
    max_bytes: int,
    access: Access | None = None,
) -> AsyncGenerator[Body, None]:
    """A catch-up page assembled by Postgres (``store.bodies``), planned (``plan_read``) and given out as it
    is read (``planned_bodies``). A page whose records were pruned before its first part was read is
    planned again, which answers with the stream as it is now (410 for a pruned cursor). Close it
    (``contextlib.aclosing``) to stop the reading early; ``whole`` takes a page's bodies together."""
    for attempt in range(2):
        page = await plan_read(
            pool,
            durability,
            run_id,
            stream_id,
            after,
            form,
            max_records=max_records,
            max_bytes=max_bytes,
            access=access,
        )
        async with contextlib.aclosing(planned_bodies(pool, page, form)) as each:
            try:
                body = await anext(each)
            except bodies.PageChanged:
                if attempt:
                    raise
                continue
            yield body
            async for body in each:
                yield body
            return


async def whole(each: AsyncGenerator[Body, None]) -> Body:
    """A page's bodies (``read_bodies``) taken together, for a response that states where the page ends
    before its records."""
    async with contextlib.aclosing(each):
        got = [body async for body in each]
    return dataclasses.replace(got[-1], after=got[0].after, parts=[part for body in got for part in body.parts])


async def _served(durability: Durability, run_id: str, stream_id: str, read: R, until: float) -> R:
    read_at = durability.tick()
    [served] = await durability.confirmed([((run_id, stream_id), read)], read_at, until)
    assert not isinstance(served, StreamError)
    return served
