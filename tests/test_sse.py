"""Live subscriptions over SSE through the real server."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientPayloadError, TCPConnector
from aiohttp.test_utils import TestClient

from tests.support import BOB, EVE, SseReader, StreamsApi, credit, metric, problem, small_receive_buffer
from tests.waiting import eventually
from workflow_streams.domain.wakes import RECORDS, Signal
from workflow_streams.runtime import live
from workflow_streams.shells.compose import create_app
from workflow_streams.store import notify
from workflow_streams.store.retention import prune_stream


async def subscribe(api: StreamsApi, run: str, stream: str, **params: Any) -> Any:
    headers = dict(api.headers)
    if "last_event_id" in params:
        headers["Last-Event-ID"] = str(params.pop("last_event_id"))
    query = {k: str(v) for k, v in params.items()}
    return await api.client.get(api.url(run, stream, "/subscribe"), params=query, headers=headers)


async def test_backfill_then_follow(api: StreamsApi) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1, 2, 3)
    resp = await subscribe(api, "r", "s", after=1)
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/event-stream"
    events = SseReader(resp)
    assert await events.records(2) == [2, 3]
    await api.append("r", "s", 4)
    await api.append("r", "s", 5, 6)
    assert await events.records(3) == [4, 5, 6]
    resp.close()


async def test_event_carries_the_record(api: StreamsApi) -> None:
    await api.create("r", "s")
    await api.append("r", "s", {"token": "hello\nworld"})
    events = SseReader(await subscribe(api, "r", "s"))
    event = await events.next()
    assert event is not None and event.id == "1"
    record = event.json()
    assert record["sequence"] == 1 and record["data"] == {"token": "hello\nworld"}


async def test_last_event_id_wins_over_after(api: StreamsApi) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1, 2, 3, 4)
    events = SseReader(await subscribe(api, "r", "s", after=0, last_event_id=3))
    assert await events.records(1) == [4]


async def test_cursor_and_auth_errors_are_plain_http(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s", retention={"max_records": 1})
    await api.append("r", "s", 1, 2, 3)
    await problem(await subscribe(api, "r", "s", after=9), 400, "future_cursor")
    await problem(await subscribe(api, "r", "s", last_event_id="x"), 400, "invalid_input")
    await problem(await subscribe(api, "r", "s", limit=3), 400, "invalid_input")
    await prune_stream(db, "r", "s")
    body = await problem(await subscribe(api, "r", "s", after=0), 410, "cursor_expired")
    assert body["earliest"] == 3
    await problem(await subscribe(api.as_(EVE), "r", "s", after=2), 403, "forbidden")
    await problem(await subscribe(api.as_({}), "r", "s", after=2), 401, "unauthenticated")


async def test_query_token_for_browsers(api: StreamsApi) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1)
    resp = await subscribe(api.as_({}), "r", "s", access_token="tok-alice")
    assert await SseReader(resp).records(1) == [1]
    # only subscribe accepts it
    resp = await api.client.get(api.url("r", "s", "/records"), params={"access_token": "tok-alice"})
    await problem(resp, 401, "unauthenticated")


async def test_heartbeats_while_idle(aiohttp_client: Any, database_url: str, settings_for: Any) -> None:
    api = StreamsApi(await aiohttp_client(create_app(settings_for(database_url, sse_heartbeat_seconds=0.1))))
    await api.create("r", "s")
    resp = await subscribe(api, "r", "s")
    reader = SseReader(resp)
    reader_task = asyncio.create_task(reader.next())
    await eventually(lambda: reader.comments.count("heartbeat") >= 2, message="fewer than 2 heartbeats")
    assert reader.comments.count("heartbeat") >= 2
    await api.append("r", "s", 1)
    event = await reader_task
    assert event is not None and event.id == "1"


async def test_close_event_after_drain(api: StreamsApi) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1, 2)
    events = SseReader(await subscribe(api, "r", "s"))
    assert await events.records(2) == [1, 2]
    await api.append("r", "s", 3)
    await api.close("r", "s")
    assert await events.records(1) == [3]
    close = await events.next()
    assert close is not None and close.event == "close" and close.json() == {"last_sequence": 3}
    assert await events.next() is None, "the server ends the stream after close"
    # a reconnect after the end gets the close at once
    late = SseReader(await subscribe(api, "r", "s", last_event_id=3))
    event = await late.next()
    assert event is not None and event.event == "close"


@pytest.mark.skipif(os.environ.get("WFS_TEST_WAKE_SOURCE") == "poll", reason="gap evidence comes from NOTIFY payloads")
async def test_skipped_wake_is_recorded_as_gap_evidence(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1, 2)
    events = SseReader(await subscribe(api, "r", "s"))
    assert await events.records(2) == [1, 2]
    # a wake that announces sequence 5 when 3 is next: notifications 3..4 were missed
    await notify.send(db, [Signal(RECORDS, "r", "s", 5, 5)], sender="test")
    row = await eventually(
        lambda: db.fetchrow("SELECT expected_sequence, observed_sequence, detected_by FROM wfs_gap_evidence"),
        message="no gap evidence recorded",
    )
    assert row is not None and tuple(row) == (3, 5, "sse")
    await api.append("r", "s", 3)
    assert await events.records(1) == [3], "the subscriber keeps following from Postgres"


async def test_connection_lifetime_ends_with_resumable_id(
    aiohttp_client: Any, database_url: str, settings_for: Any
) -> None:
    settings = settings_for(database_url, sse_max_connection_seconds=0.5)
    api = StreamsApi(await aiohttp_client(create_app(settings)))
    await api.create("r", "s")
    await api.append("r", "s", 1, 2)
    events = SseReader(await subscribe(api, "r", "s"))
    assert await events.records(2) == [1, 2]
    assert await events.next(seconds=5) is None
    await api.append("r", "s", 3)
    resumed = SseReader(await subscribe(api, "r", "s", last_event_id=2))
    assert await resumed.records(1) == [3]


async def test_acks_while_subscribed_free_credit(api: StreamsApi) -> None:
    await api.create("r", "s", credit=credit(2, "block"))
    events = SseReader(await subscribe(api, "r", "s"))

    async def produce() -> None:
        for i in range(10):
            assert (await api.append("r", "s", i)).status == 201

    producer = asyncio.create_task(produce())
    seen: list[int] = []
    while len(seen) < 10:
        seq = (await events.records(1))[0]
        seen.append(seq)
        assert (await api.ack("r", "s", "sub-1", seq)).status == 200
    await asyncio.wait_for(producer, 10)
    assert seen == list(range(1, 11))


async def test_slow_subscriber_is_cut_off_not_buffered(
    aiohttp_client: Any, database_url: str, settings_for: Any, monkeypatch: Any
) -> None:
    """A subscriber that stops reading is disconnected once a write stalls; it resumes without loss."""
    monkeypatch.setattr(live, "WRITE_TIMEOUT_SECONDS", 0.5)

    client: TestClient = await aiohttp_client(
        create_app(settings_for(database_url)), connector=TCPConnector(socket_factory=small_receive_buffer)
    )
    api = StreamsApi(client)
    await api.create("r", "s")
    big = "x" * 60_000
    for _ in range(20):
        await api.append("r", "s", *([big] * 10))  # 200 records, 12 MB
    resp = await subscribe(api, "r", "s", after=0)
    reader = SseReader(resp)
    assert await reader.records(1) == [1]
    # stop reading: socket buffers fill, the server's write stalls, and the server ends the subscription
    open_while_reading = metric("wfs_subscriptions_open")
    await eventually(
        lambda: metric("wfs_subscriptions_open") < open_while_reading, message="the stalled subscriber stays open"
    )
    got = [1]
    with contextlib.suppress(ClientPayloadError):  # the cut-off: the chunked body never completes
        while (event := await reader.next(seconds=10)) is not None:
            got.append(int(event.id or 0))
    assert got == list(range(1, len(got) + 1))
    assert len(got) < 200, "the server must have cut the stalled subscriber off"
    rest = SseReader(await subscribe(api, "r", "s", last_event_id=got[-1]))
    assert await rest.records(200 - len(got), seconds=30) == list(range(len(got) + 1, 201))


async def test_subscribe_has_its_own_right(api: StreamsApi) -> None:
    await api.create("r", "s", authorization={"read": ["alice", "group:readers"], "subscribe": ["alice"]})
    await api.append("r", "s", 1)
    bob = api.as_(BOB)  # may read, may not subscribe
    assert (await bob.read("r", "s")).status == 200
    await problem(await subscribe(bob, "r", "s"), 403, "forbidden")
    assert await SseReader(await subscribe(api, "r", "s")).records(1) == [1]
