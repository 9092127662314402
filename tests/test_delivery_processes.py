"""Real processes: two data-plane replicas, kill -9 of one mid-delivery, a Postgres restart."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.replica import Replica
from tests.support import ALICE, pins
from tests.waiting import eventually
from tests.waitservice import WaitService, first_occurrences
from workflow_streams import API_PREFIX
from workflow_streams.domain.delivery import event_id
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.store.migrate import apply_migrations

pytestmark = pytest.mark.slow

STREAMS = [f"in-{i}" for i in range(10)]
PER_STREAM = 100


def _dispatch_env(service: WaitService) -> dict[str, str]:
    return {
        "WFS_WAIT_SERVICE_URL": service.url,
        "WFS_WORKER_LEASE_SECONDS": "2",
        "WFS_DELIVERY_TIMEOUT_SECONDS": "2",
        "WFS_DELIVERY_BACKOFF_BASE_SECONDS": "0.05",
    }


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _setup_streams(session: aiohttp.ClientSession, base: str) -> None:
    for stream in STREAMS:
        body = {"stream_id": stream, "pins": pins(direction="input", content_class="user_input")}
        async with session.post(f"{base}{API_PREFIX}/runs/run-1/streams", json=body, headers=ALICE) as resp:
            assert resp.status == 201, await resp.text()


async def _post_until_accepted(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    """Retry through 503s and dropped connections (a replica or Postgres going away), same key every time."""

    async def accepted() -> bool:
        try:
            async with session.post(url, json=body, headers=headers) as resp:
                assert resp.status in (200, 201, 503), await resp.text()
                return resp.status != 503
        except aiohttp.ClientError:
            return False

    await eventually(accepted, within=30, interval=0.1, message=f"{url} never accepted the append")


async def _append_all(session: aiohttp.ClientSession, base: str) -> None:
    async def one_stream(stream: str) -> None:
        for start in range(1, PER_STREAM + 1, 10):
            body = {"records": [{"data": {"n": n}} for n in range(start, start + 10)]}
            url = f"{base}{API_PREFIX}/runs/run-1/streams/{stream}/records"
            await _post_until_accepted(session, url, body, {**ALICE, "Idempotency-Key": f"{stream}-{start}"})

    await asyncio.gather(*(one_stream(s) for s in STREAMS))


def _assert_delivered_exactly(service: WaitService) -> None:
    for stream in STREAMS:
        sequences = service.sequences("run-1", stream)
        assert first_occurrences(sequences) == list(range(1, PER_STREAM + 1)), f"{stream}: order or loss"
        for event in service.events:
            assert event["event_id"] == event_id(event["run_id"], event["stream_id"], event["sequence"])
            assert event["record"]["data"] == {"n": event["sequence"]}
    duplicates = sum(n - 1 for n in Counter(e["event_id"] for e in service.events).values())
    print(f"{len(service.events)} deliveries, {duplicates} redeliveries (same event id)")


async def test_kill_9_one_replica_mid_delivery(
    own_pg: LocalPostgres, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await apply_migrations(own_pg.dsn)

    async def slow_accept(event: dict[str, Any], attempt: int) -> int:
        await asyncio.sleep(0.005)
        return 200

    service = WaitService(slow_accept)
    await service.start()
    replicas = [Replica(own_pg.dsn, tmp_path / f"replica-{i}.log", **_dispatch_env(service)) for i in range(2)]
    try:
        for replica in replicas:
            await replica.ready(session)
        await _setup_streams(session, replicas[0].base)
        await _append_all(session, replicas[1].base)
        await service.wait_for(lambda: len(service.events) >= 300)
        replicas[0].kill()
        await service.wait_for(lambda: len(set(e["event_id"] for e in service.events)) == 1000, seconds=120)
        _assert_delivered_exactly(service)
    finally:
        for replica in replicas:
            replica.stop()
        await service.stop()


async def test_postgres_restart_during_delivery(
    own_pg: LocalPostgres, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await apply_migrations(own_pg.dsn)

    async def slow_accept(event: dict[str, Any], attempt: int) -> int:
        await asyncio.sleep(0.003)
        return 200

    service = WaitService(slow_accept)
    await service.start()
    replica = Replica(own_pg.dsn, tmp_path / "replica.log", **_dispatch_env(service))
    try:
        await replica.ready(session)
        await _setup_streams(session, replica.base)
        await _append_all(session, replica.base)
        await service.wait_for(lambda: len(service.events) >= 200)
        await asyncio.to_thread(own_pg.restart, "immediate")
        await service.wait_for(lambda: len(set(e["event_id"] for e in service.events)) == 1000, seconds=120)
        _assert_delivered_exactly(service)
    finally:
        replica.stop()
        await service.stop()
