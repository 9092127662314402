"""A workflow wait service for tests: records every event it is sent, on loopback."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tests.waiting import eventually
from workflow_streams.local.postgres import free_port

Behaviour = Callable[[dict[str, Any], int], Awaitable[int]]


async def accept(event: dict[str, Any], attempt: int) -> int:
    return 200


class WaitService:
    def __init__(self, behaviour: Behaviour = accept) -> None:
        self.behaviour = behaviour
        self.events: list[dict[str, Any]] = []  # every request, in arrival order, duplicates included
        self.attempts = 0
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/events"

    async def _handle(self, request: web.Request) -> web.Response:
        event = await request.json()
        assert request.headers["Idempotency-Key"] == event["event_id"]
        self.attempts += 1
        status = await self.behaviour(event, self.attempts)
        if 200 <= status < 300 or status == 409:
            self.events.append(event)
        return web.json_response({"ok": status < 300}, status=status)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/events", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    def sequences(self, run: str, stream: str) -> list[int]:
        return [e["sequence"] for e in self.events if (e["run_id"], e["stream_id"]) == (run, stream)]

    async def wait_for(self, predicate: Callable[[], bool], seconds: float = 60.0) -> None:
        await eventually(predicate, within=seconds, message=f"not reached; {len(self.events)} events so far")


def first_occurrences(sequences: list[int]) -> list[int]:
    seen: set[int] = set()
    return [s for s in sequences if not (s in seen or seen.add(s))]  # type: ignore[func-returns-value]
