"""Shared reads for subscribers: one query and one encoding per wake, whatever the audience.

Subscribers of one stream woken together at the same cursor share one read (single flight), and the
page's SSE bytes are encoded once, on first use, and written to every subscriber as they are.

A subscriber joins an in-flight read only if that read started after the wake it is answering: a read
that began before a commit was announced may not contain it, and a subscriber handed such a read would
sleep until the *next* append. Reads remember the wake generation (``WakeHub.generation``) at which
they started; a subscriber woken at generation ``g`` joins only reads started at ``g`` or later.
"""

from __future__ import annotations

import asyncio
import bisect
import functools

import asyncpg

from .. import wire
from ..store.reads import Page, fetch_page
from .wakes import WakeHub


class SharedPage:
    """A page and its SSE encoding, computed once for every subscriber that reads it."""

    def __init__(self, page: Page) -> None:
        self.page = page

    @functools.cached_property
    def _sequences(self) -> list[int]:
        return [r.sequence for r in self.page.records]

    @functools.cached_property
    def _events(self) -> list[bytes]:
        return [wire.sse_event(r) for r in self.page.records]

    @functools.cached_property
    def _all_events(self) -> bytes:
        return b"".join(self._events)

    def events_after(self, last: int) -> tuple[bytes, int, int]:
        """The SSE bytes of the records after ``last`` (boundary duplicates dropped), how many, and the
        new last sequence."""
        start = bisect.bisect_right(self._sequences, last)
        count = len(self._sequences) - start
        if count == 0:
            return b"", 0, last
        chunk = self._all_events if start == 0 else b"".join(self._events[start:])
        return chunk, count, self._sequences[-1]


class _Flight:
    __slots__ = ("future", "generation")

    def __init__(self, generation: int, future: asyncio.Future[SharedPage]) -> None:
        self.generation = generation
        self.future = future


class SharedReads:
    def __init__(self, pool: asyncpg.Pool, hub: WakeHub) -> None:
        self._pool = pool
        self._hub = hub
        self._inflight: dict[tuple[str, str, int, int], _Flight] = {}

    async def page(self, run_id: str, stream_id: str, after: int, limit: int, woken_at: int) -> SharedPage:
        """Records after ``after``, from a read that started no earlier than wake generation ``woken_at``."""
        key = (run_id, stream_id, after, limit)
        flight = self._inflight.get(key)
        if flight is not None and flight.generation >= woken_at:
            try:
                return await asyncio.shield(flight.future)
            except asyncio.CancelledError:
                if not flight.future.cancelled():
                    raise  # we were cancelled ourselves
                # the reader we joined was cancelled: read for ourselves
        future: asyncio.Future[SharedPage] = asyncio.get_running_loop().create_future()
        flight = _Flight(self._hub.clock, future)
        self._inflight[key] = flight  # newer than any flight it replaces: later joiners take this one
        try:
            async with self._pool.acquire() as conn:
                shared = SharedPage(await fetch_page(conn, run_id, stream_id, after, limit))
            future.set_result(shared)
            return shared
        except asyncio.CancelledError:
            future.cancel()  # joiners see it and read for themselves; never left pending
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: others may or may not be waiting
            raise
        finally:
            if self._inflight.get(key) is flight:
                del self._inflight[key]
