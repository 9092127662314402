"""The one place where what a store entry point changed is announced.

Store entry points that change what others watch return ``Changed``: their answer and the wake signals
of the change, made inside their own transaction. ``committed`` runs such an entry point on a connection
of its own, so that its transaction has committed when the entry returns, and only then publishes:
to this process's watchers at once and to the other processes through the wake source. (The operator,
a process without a wake hub, sends what its entry points changed through ``store.notify`` itself.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from ..domain.wakes import Changed
from ..store.db import Pool
from .wakes import WakeHub

T = TypeVar("T")

Entry = Callable[[asyncpg.Connection], Awaitable[Changed[T]]]


async def committed(pool: Pool, hub: WakeHub, entry: Entry[T]) -> T:
    """Run ``entry`` (which commits its own transaction) and publish what it changed."""
    async with pool.acquire() as conn:
        changed = await entry(conn)
    if changed.signals:
        hub.publish(changed.signals)
    return changed.value
