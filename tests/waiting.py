"""The one way tests wait: poll a condition until it holds or a deadline passes.

Tests never sleep and then assert; they wait on an event, or poll here. The deadline is generous because
it only bounds a failure; a passing test returns as soon as the condition holds.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    condition: Callable[[], Awaitable[T] | T],
    *,
    within: float = 15.0,
    interval: float = 0.05,
    message: str = "condition not reached in time",
) -> T:
    """Return the first truthy value of ``condition()`` (sync or async); fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if loop.time() >= deadline:
            raise AssertionError(f"{message} (waited {within:g} s)")
        await asyncio.sleep(interval)
