"""Input streams: outbox rows with their records, deterministic events, retries, permanent failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from tests.support import StreamsApi, problem
from tests.waiting import eventually
from tests.waitservice import WaitService, first_occurrences
from workflow_streams.domain.delivery import event_id
from workflow_streams.shells.compose import create_app


@pytest.fixture
async def wait_service() -> AsyncIterator[WaitService]:
    service = WaitService()
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def api(aiohttp_client: Any, database_url: str, settings_for: Any, wait_service: WaitService) -> StreamsApi:
    settings = settings_for(
        database_url,
        wait_service_url=wait_service.url,
        worker_lease_seconds=2.0,
        delivery_timeout_seconds=0.5,
        delivery_backoff_base_seconds=0.05,
    )
    return StreamsApi(await aiohttp_client(create_app(settings)))


async def test_input_records_are_delivered_in_order_with_stable_ids(
    api: StreamsApi, wait_service: WaitService, db: asyncpg.Connection
) -> None:
    await api.create("run-1", "in", direction="input", content_class="user_input")
    await api.create("run-1", "out")
    await api.append("run-1", "in", {"answer": "yes"})
    await api.append("run-1", "in", 2, 3, 4)
    await api.append("run-1", "out", "not delivered")
    await wait_service.wait_for(lambda: len(wait_service.events) >= 4)

    async def all_marked_delivered() -> bool:
        # a delivered row is never sent again: once all four are marked, nothing more can arrive
        return await db.fetchval("SELECT count(*) FROM wfs_input_deliveries WHERE state = 'delivered'") == 4

    await eventually(all_marked_delivered, message="deliveries not marked delivered")
    assert wait_service.sequences("run-1", "in") == [1, 2, 3, 4]
    assert wait_service.sequences("run-1", "out") == []
    first = wait_service.events[0]
    assert first["event_id"] == event_id("run-1", "in", 1)
    assert first["type"] == "workflow_stream.input"
    assert first["record"]["data"] == {"answer": "yes"}
    states = await db.fetch("SELECT state, attempts FROM wfs_input_deliveries ORDER BY sequence")
    assert [tuple(r) for r in states] == [("delivered", 1)] * 4
    status = await (await api.client.get(api.url("run-1", "in", "/deliveries"), headers=api.headers)).json()
    assert status["counts"] == {"pending": 0, "delivered": 4, "failed": 0}


async def test_outbox_row_commits_with_the_record(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("run-1", "in", direction="input", content_class="user_input")
    await problem(await api.append("run-1", "in", "x" * 70_000), 413, "payload_too_large")
    assert await db.fetchval("SELECT count(*) FROM wfs_input_deliveries") == 0
    await api.append("run-1", "in", 1, 2)
    rows = await db.fetch(
        """SELECT d.sequence, d.event_id FROM wfs_input_deliveries d
           JOIN wfs_streams s USING (run_id, stream_id)
           JOIN wfs_records r ON r.stream_key = s.stream_key AND r.sequence = d.sequence ORDER BY d.sequence"""
    )
    assert [(r["sequence"], r["event_id"]) for r in rows] == [(s, event_id("run-1", "in", s)) for s in (1, 2)]


@pytest.mark.slow  # eight failed attempts with real timeouts and back-off
async def test_failures_and_timeouts_back_off_then_deliver(
    api: StreamsApi, wait_service: WaitService, db: asyncpg.Connection
) -> None:
    async def flaky(event: dict[str, Any], attempt: int) -> int:
        if attempt <= 6:
            return 503 if attempt % 2 else 500
        if attempt <= 8:
            await asyncio.sleep(1.0)  # longer than the 0.5 s delivery timeout
        return 200

    wait_service.behaviour = flaky
    await api.create("run-1", "in", direction="input", content_class="user_input")
    await api.append("run-1", "in", *range(1, 6))
    await wait_service.wait_for(lambda: len(first_occurrences(wait_service.sequences("run-1", "in"))) == 5)
    assert first_occurrences(wait_service.sequences("run-1", "in")) == [1, 2, 3, 4, 5]
    row = await db.fetchrow("SELECT attempts, last_error FROM wfs_input_deliveries WHERE sequence = 1")
    assert row["attempts"] >= 7, "each failed attempt is counted in Postgres"
    assert row["last_error"] is None
    assert wait_service.attempts >= 13


async def test_permanent_failure_blocks_the_stream_until_requeued(
    api: StreamsApi, wait_service: WaitService, db: asyncpg.Connection
) -> None:
    broken = True

    async def rejecting(event: dict[str, Any], attempt: int) -> int:
        return 422 if broken and event["sequence"] == 2 else 200

    wait_service.behaviour = rejecting
    await api.create("run-1", "in", direction="input", content_class="user_input")
    await api.append("run-1", "in", 1, 2, 3)
    await wait_service.wait_for(lambda: wait_service.sequences("run-1", "in") == [1])

    async def failed_status() -> Any:
        status = await (await api.client.get(api.url("run-1", "in", "/deliveries"), headers=api.headers)).json()
        return status if status["counts"]["failed"] else None

    status = await eventually(failed_status, message="delivery 2 never failed")
    assert status["counts"] == {"pending": 1, "delivered": 1, "failed": 1}
    assert status["failed"][0]["sequence"] == 2 and status["failed"][0]["last_error"] == "HTTP 422"
    # a later delivery on another stream, its claim released: the dispatcher has finished a whole pass
    # since the failure, a pass in which 3 would have gone out if the failed 2 did not block it
    await api.create("run-1", "later", direction="input", content_class="user_input")
    await api.append("run-1", "later", "after the failure")
    await wait_service.wait_for(lambda: wait_service.sequences("run-1", "later") == [1])
    await eventually(
        lambda: db.fetchval("SELECT count(*) = 0 FROM wfs_worker_claims WHERE worker_kind = 'dispatch'"),
        message="the dispatcher's pass never ended",
    )
    assert wait_service.sequences("run-1", "in") == [1], "3 must not overtake the failed 2"

    broken = False
    resp = await api.client.post(api.url("run-1", "in", "/deliveries/requeue"), headers=api.headers)
    assert (await resp.json()) == {"requeued": 1}
    await wait_service.wait_for(lambda: wait_service.sequences("run-1", "in") == [1, 2, 3])
