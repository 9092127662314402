"""Live reads of the Durable Streams surface on the one live-read engine (runtime/live.py): a reader
that stops reading is cut off rather than buffered and resumes without loss, both surfaces count
against one per-principal cap, and both follow one stream's records together."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from aiohttp import ClientPayloadError, TCPConnector
from aiohttp.test_utils import TestClient

from tests.conftest import make_settings
from tests.support import ALICE, SseReader, StreamsApi, metric, problem, small_receive_buffer
from tests.waiting import eventually
from workflow_streams.domain.durable import encode_offset
from workflow_streams.runtime import live
from workflow_streams.shells.compose import create_app

DS = "/api/durable-streams/v1/stream"
JSON = {**ALICE, "Content-Type": "application/json"}


async def _protocol_events(reader: SseReader, until_offset: int, seconds: float = 10.0) -> tuple[list[int], int]:
    """The messages (each a JSON number) of data events and the offset of the last control event, read
    until that offset reaches ``until_offset``."""
    messages: list[int] = []
    offset = -1
    while offset < until_offset:
        event = await reader.next(seconds)
        assert event is not None, f"the stream ended at offset {offset}"
        if event.event == "data":
            messages += [m["n"] for m in json.loads(event.data)]
        elif event.event == "control":
            offset = int(json.loads(event.data)["streamNextOffset"])
    return messages, offset


async def test_a_protocol_reader_that_stops_reading_is_cut_off_and_resumes(
    aiohttp_client: Any, database_url: str, monkeypatch: Any
) -> None:
    """The connection is cut once a write waits longer than the stall timeout, so what the server holds
    for it stays one page and a socket buffer; the reader resumes at its last offset and misses nothing."""
    monkeypatch.setattr(live, "WRITE_TIMEOUT_SECONDS", 0.5)

    client: TestClient = await aiohttp_client(
        create_app(make_settings(database_url)), connector=TCPConnector(socket_factory=small_receive_buffer)
    )
    assert (await client.put(f"{DS}/big", headers=JSON)).status == 201
    pad = "x" * 60_000
    total = 300  # 18 MB: far more than the socket buffers hold
    for start in range(0, total, 10):
        batch = ",".join(json.dumps({"n": n, "pad": pad}) for n in range(start, start + 10))
        assert (await client.post(f"{DS}/big", headers=JSON, data=f"[{batch}]")).status == 204
    open_before = metric("wfs_subscriptions_open")
    resp = await client.get(f"{DS}/big?offset=-1&live=sse", headers=ALICE)
    assert resp.status == 200
    reader = SseReader(resp)
    got, offset = await _protocol_events(reader, until_offset=1)
    # stop reading: the socket buffers fill, the server's write stalls, and the server ends the connection
    await eventually(
        lambda: metric("wfs_subscriptions_open") <= open_before, message="the stalled protocol reader stays open"
    )
    with contextlib.suppress(ClientPayloadError):  # the cut-off: the chunked body never completes
        while (event := await reader.next(seconds=10)) is not None:
            if event.event == "data":
                got += [m["n"] for m in json.loads(event.data)]
            elif event.event == "control":
                offset = int(json.loads(event.data)["streamNextOffset"])
    assert offset < total, "the server must have cut the stalled reader off"
    got = got[:offset]  # a data event without its control is not a position to resume from
    rest = SseReader(await client.get(f"{DS}/big?offset={encode_offset(offset)}&live=sse", headers=ALICE))
    more, _ = await _protocol_events(rest, until_offset=total, seconds=30)
    assert got + more == list(range(total))


async def test_live_connections_of_both_surfaces_share_one_cap_per_principal(
    aiohttp_client: Any, database_url: str
) -> None:
    client: TestClient = await aiohttp_client(create_app(make_settings(database_url, sse_max_per_principal=2)))
    api = StreamsApi(client)
    await api.create("run-1", "out")
    ours = await client.get(api.url("run-1", "out", "/subscribe"), headers=api.headers)
    theirs = await client.get(f"{DS}/run-1/out?offset=-1&live=sse", headers=ALICE)
    assert (ours.status, theirs.status) == (200, 200)
    await SseReader(theirs).next()  # started: its slot is held
    refused = await client.get(f"{DS}/run-1/out?offset=-1&live=sse", headers=ALICE)
    body = await problem(refused, 429, "too_many_subscriptions")
    assert body["limit"] == 2 and refused.headers["Retry-After"]
    ours.close()
    await eventually(lambda: _slot_free(client, api), message="the closed subscription's slot was never freed")


async def _slot_free(client: TestClient, api: StreamsApi) -> bool:
    resp = await client.get(f"{DS}/run-1/out?offset=-1&live=sse", headers=ALICE)
    resp.close()
    return resp.status == 200


async def test_both_surfaces_follow_one_stream_together(aiohttp_client: Any, database_url: str) -> None:
    """Followers of both protocols on one stream are given every record once, in order, as it commits."""
    client: TestClient = await aiohttp_client(create_app(make_settings(database_url)))
    api = StreamsApi(client)
    await api.create("run-1", "out")
    ours = [SseReader(await client.get(api.url("run-1", "out", "/subscribe"), headers=api.headers)) for _ in range(3)]
    theirs = [SseReader(await client.get(f"{DS}/run-1/out?offset=-1&live=sse", headers=ALICE)) for _ in range(3)]
    for reader in theirs:
        assert await _protocol_events(reader, until_offset=0) == ([], 0)  # the first control: up to date
    for n in range(1, 31):
        assert (await api.append("run-1", "out", {"n": n})).status == 201
    for reader in ours:
        assert await reader.records(30) == list(range(1, 31))
    for reader in theirs:
        assert await _protocol_events(reader, until_offset=30) == (list(range(1, 31)), 30)
