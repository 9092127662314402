"""Background work never dies silently (runtime.supervisor): a task that raises is logged, counted,
restarted after a backoff, and while a critical one is down readiness says so. The head poller, which
poll-only mode depends on for every wake from another process, is made to fail (a statement that raises
a non-connection error, as PgBouncer's prepared-statement mix-ups did) and subscribers still get every
record."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import make_settings
from tests.support import SseReader, StreamsApi, metric
from tests.test_sse import subscribe
from tests.waiting import eventually
from workflow_streams.runtime import wakes
from workflow_streams.runtime.supervisor import Supervisor
from workflow_streams.shells.compose import create_app


async def test_a_task_that_raises_is_logged_counted_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor()
    runs = 0
    release = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            await release.wait()  # held up, so the test sees it down only after it fails
            raise RuntimeError("injected failure")
        await asyncio.Event().wait()  # the second run lives on

    restarts = metric("wfs_background_restarts_total", task="flaky")
    supervisor.start("flaky", flaky, critical=True)
    supervisor.start("quiet", lambda: asyncio.Event().wait())
    try:
        await eventually(lambda: runs == 1)
        assert supervisor.down() == []
        release.set()
        # down while it waits for its restart (at least 0.1 s), up again once restarted
        await eventually(lambda: supervisor.down() == ["flaky"], interval=0.01)
        assert metric("wfs_background_down", task="flaky") == 1
        await eventually(lambda: runs == 2)
        assert supervisor.down() == []
        assert metric("wfs_background_down", task="flaky") == 0
        assert metric("wfs_background_restarts_total", task="flaky") == restarts + 1
        failure = next(r for r in caplog.records if "flaky failed unexpectedly" in r.getMessage())
        assert failure.levelno == logging.ERROR and failure.exc_info is not None  # a bug: its traceback
    finally:
        await supervisor.stop()


async def test_a_task_that_returns_is_restarted_too() -> None:
    supervisor = Supervisor()
    runs = 0

    async def ends() -> None:
        nonlocal runs
        runs += 1
        if runs > 1:
            await asyncio.Event().wait()

    supervisor.start("ends", ends)
    try:
        await eventually(lambda: runs == 2)
    finally:
        await supervisor.stop()


async def test_subscribers_get_every_record_when_the_head_poller_fails(
    aiohttp_client: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Poll-only: B's subscriber hears of A's commits only through B's head poller. Its poll raises once;
    the supervisor restarts it and the subscriber still gets every record, once, in order."""
    settings = make_settings(database_url, wake_source="poll", wake_poll_seconds=0.1)
    a = StreamsApi(await aiohttp_client(create_app(settings)))
    b_client: TestClient = await aiohttp_client(create_app(settings))
    b = StreamsApi(b_client)
    assert (await a.create("r", "s")).status == 201
    assert (await a.append("r", "s", 1)).status == 201
    events = SseReader(await subscribe(b, "r", "s"))
    assert await events.records(1) == [1]

    real_fetch = wakes.heads.fetch
    failures = 0

    async def failing_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RuntimeError('prepared statement "__asyncpg_stmt_17__" does not exist (injected)')
        return await real_fetch(*args, **kwargs)

    restarts = metric("wfs_background_restarts_total", task="head-poller")
    monkeypatch.setattr(wakes.heads, "fetch", failing_once)
    assert (await a.append("r", "s", 2, 3)).status == 201
    await eventually(lambda: failures == 1)
    assert (await a.append("r", "s", 4)).status == 201
    assert await events.records(3) == [2, 3, 4]
    assert metric("wfs_background_restarts_total", task="head-poller") >= restarts + 1
    await eventually(lambda: _ready(b_client), message="readiness did not come back after the restart")


async def _ready(client: TestClient) -> bool:
    return (await client.get("/readyz")).status == 200
