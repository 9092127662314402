"""Which streams this process watches, told to the appenders of every process through Postgres.

A NOTIFY costs Postgres a transaction of its own, one more in every listening backend, and every other
process the decoding of its payload, so announcing every commit to every process costs more with every
process that listens, and most announcements are of streams no other process watches (figures:
bench/README.md, constants). So a process marks a stream it starts watching (``wfs_streams.watched_until``,
``store.watched``) before the watcher's first read, and an append passes on to other processes only the
signals of streams marked then (``store.appends``: ``Batch.remote_signals``); its own process's watchers
are woken in memory whatever the mark says.

Why nothing is missed: the mark takes the stream's row lock, which an append holds from the statement
that reads the mark until its COMMIT. An append that committed before the mark is seen by the watcher's
first read, which follows the mark; one that locked the row after the mark reads it and announces.

A mark lasts ``ttl`` seconds and is renewed while the stream is watched here, once less than half of it
is left (the head poller calls ``renew``). If a renewal fails, or a process dies between commit and
NOTIFY, the head poller still finds the commit: latency, never a record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import asyncpg

from ..store import db, watched
from ..store.appends import BEGIN
from ..store.db import DB_UNAVAILABLE
from .batches import Batches

log = logging.getLogger(__name__)

StreamKey = tuple[str, str]

# how long a mark lasts; renewed once less than half is left
TTL_SECONDS = 60.0


class Interest:
    def __init__(self, pool: db.Pool, ttl: float = TTL_SECONDS) -> None:
        self._pool = pool
        self._ttl = ttl
        # per marked stream, until when (this process's monotonic clock) its mark certainly lasts
        self._until: dict[StreamKey, float] = {}
        self._queued: set[StreamKey] = set()  # queued or being written
        # what watchers wait for: the next mark of their stream to commit
        self._waiters: dict[StreamKey, asyncio.Future[None]] = {}
        self._batches: Batches[StreamKey] = Batches(
            self._mark, max_batch=watched.CHUNK, max_inflight=1, name="wfs-interest"
        )

    def _fresh(self, key: StreamKey, now: float) -> bool:
        return self._until.get(key, 0.0) - now > self._ttl / 2

    async def ensure(self, run_id: str, stream_id: str) -> None:
        """Return once the stream is marked as watched (at once if it already is, for long enough)."""
        key = (run_id, stream_id)
        loop = asyncio.get_running_loop()
        if self._fresh(key, loop.time()):
            return
        future = self._waiters.get(key)
        if future is None:
            future = self._waiters[key] = loop.create_future()
        # a mark already queued or being written still commits after this call began: it will do
        self._queue(key)
        # shielded: a watcher that goes away must not cancel the mark the others wait for
        await asyncio.shield(future)

    def renew(self, keys: Iterable[StreamKey]) -> None:
        """Mark again, in the background, those of ``keys`` (the streams watched here now) whose mark has
        less than half its time left. Marks of streams nobody here watches any more are kept until they
        expire, so that a reader that comes back at once (a long poll, a reconnect) writes nothing."""
        now = asyncio.get_running_loop().time()
        for key in keys:
            if not self._fresh(key, now):
                self._queue(key)
        for key in [key for key, until in self._until.items() if until <= now]:
            del self._until[key]

    def forget(self, run_id: str, stream_id: str) -> None:
        """The stream is gone: a stream made again under its name starts unmarked, and its next watcher
        marks it afresh."""
        self._until.pop((run_id, stream_id), None)

    def _queue(self, key: StreamKey) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._batches.add(key)

    async def _mark(self, keys: list[StreamKey]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()  # before Postgres' now(): the mark lasts at least ttl from here
        marked: set[StreamKey] = set()
        try:
            # the append statements' planner settings: the mark's array statement is planned like theirs
            async with self._pool.acquire() as conn, db.transaction(conn, BEGIN):
                marked = await watched.mark(conn, keys, self._ttl)
        except Exception as exc:
            # the watchers go on: their first read says what is wrong with Postgres, if anything, and
            # without the mark their wakes from other processes come from the head poller
            level = logging.WARNING if isinstance(exc, (*DB_UNAVAILABLE, asyncpg.PostgresError)) else logging.ERROR
            log.log(level, "marking %d streams as watched failed (%s); the head poller covers them", len(keys), exc)
        finally:
            for key in marked:  # a stream that does not exist is not remembered: its watchers end anyway
                self._until[key] = started + self._ttl
            self._queued.difference_update(keys)
            for key in keys:
                future = self._waiters.pop(key, None)
                if future is not None and not future.done():
                    future.set_result(None)
