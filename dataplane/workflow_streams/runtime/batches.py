"""Work from many requests, run in batches: how the group commit writes and shared reads read.

Items queue here. While fewer than ``max_inflight`` batches run, a task is started that takes everything
queued (up to ``max_batch`` items) and runs it as one batch. The task takes its batch when it first
runs, not when it is created: the items queued by the handlers that run in the same turn of the event
loop as the first one join it, so what arrives together is run together (figures: bench/README.md,
constants). So a second task starts only once the first has taken its batch; else a free slot would
start a task that finds the queue already taken. With one batch in flight, what arrives while it runs
goes in the next together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Batches(Generic[T]):
    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[None]],
        *,
        max_batch: int,
        max_inflight: int,
        name: str,
        gather: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        """``run`` gets each batch; it settles its items itself. ``gather``, if given, is awaited by a task
        before it takes its batch, with the number of items queued then (the group commit gathers more
        requests there)."""
        self._run = run
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._name = name
        self._gather = gather
        self._queue: list[T] = []
        self._running: set[asyncio.Task[None]] = set()
        self._gathering = False  # a task has been started and has not taken its batch yet

    @property
    def queued(self) -> int:
        """Items waiting for a batch (those taken are not counted)."""
        return len(self._queue)

    def add(self, item: T) -> None:
        self._queue.append(item)
        self._start()

    def _start(self) -> None:
        if self._queue and not self._gathering and len(self._running) < self._max_inflight:
            self._gathering = True
            task = asyncio.create_task(self._take_and_run(), name=self._name)
            self._running.add(task)
            task.add_done_callback(self._finished)

    async def drain(self) -> None:
        """Until every batch queued or running has been run (nothing more may be added)."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start()

    async def _take_and_run(self) -> None:
        if self._gather is not None:
            await self._gather(len(self._queue))
        self._gathering = False
        batch = self._queue[: self._max_batch]
        del self._queue[: self._max_batch]
        self._start()  # what did not fit in this batch, if another may start
        await self._run(batch)
