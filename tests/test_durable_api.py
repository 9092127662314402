"""What the Durable Streams surface adds beyond the protocol's own suite: our authentication and
template authorization, our own streams in JSON mode, and our guarantees as extensions (410 with the
bounds after retention, 429 with Retry-After under credit), over the same store and wakes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import make_settings
from tests.support import ALICE, BOB, StreamsApi
from workflow_streams.domain.durable import encode_offset
from workflow_streams.domain.durable_pins import default_template
from workflow_streams.shells.compose import create_app
from workflow_streams.store.retention import prune_stream

DS = "/api/durable-streams/v1/stream"
MakeClient = Callable[..., Awaitable[TestClient]]


@pytest.fixture
def ds_client(aiohttp_client: Any, database_url: str) -> MakeClient:
    async def make(**settings: Any) -> TestClient:
        client: TestClient = await aiohttp_client(create_app(make_settings(database_url, **settings)))
        return client

    return make


def template(**overrides: Any) -> dict[str, Any]:
    return {**default_template("eu-west-1", None), **overrides}


async def test_callers_authenticate_as_on_our_api(ds_client: MakeClient) -> None:
    client = await ds_client()
    refused = await client.put(f"{DS}/s", headers={"Content-Type": "text/plain"})
    assert refused.status == 401
    assert refused.headers["X-Content-Type-Options"] == "nosniff"
    wrong = await client.put(f"{DS}/s", headers={"Content-Type": "text/plain", "Authorization": "Bearer nope"})
    assert wrong.status == 401
    created = await client.put(f"{DS}/s", headers={"Content-Type": "text/plain", **ALICE}, data=b"hi")
    assert created.status == 201
    assert (await client.get(f"{DS}/s")).status == 401
    read = await client.get(f"{DS}/s", headers=BOB)
    assert read.status == 200 and await read.read() == b"hi"


async def test_anonymous_callers_only_when_allowed(ds_client: MakeClient) -> None:
    client = await ds_client(durable_anonymous=True)
    assert (await client.put(f"{DS}/s", headers={"Content-Type": "text/plain"}, data=b"a")).status == 201
    assert await (await client.get(f"{DS}/s")).read() == b"a"
    # a token that is sent is still checked
    assert (await client.get(f"{DS}/s", headers={"Authorization": "Bearer nope"})).status == 401
    # our own API is not opened by this
    assert (await client.get("/api/workflow-streams/runs/durable-streams/streams/s")).status == 401


async def test_template_authorization_hides_streams_from_others(ds_client: MakeClient) -> None:
    owners_only = {"append": ["$creator"], "read": ["$creator"], "close": ["$creator"]}
    client = await ds_client(durable_template=template(authorization=owners_only))
    assert (await client.put(f"{DS}/mine", headers={"Content-Type": "text/plain", **ALICE})).status == 201
    assert (await client.post(f"{DS}/mine", headers={"Content-Type": "text/plain", **ALICE}, data=b"x")).status == 204
    for method in ("GET", "HEAD", "DELETE"):
        assert (await client.request(method, f"{DS}/mine", headers=BOB)).status == 404, method
    appended = await client.post(f"{DS}/mine", headers={"Content-Type": "text/plain", **BOB}, data=b"y")
    assert appended.status == 404
    # creating it again reveals nothing either
    assert (await client.put(f"{DS}/mine", headers={"Content-Type": "application/json", **BOB})).status == 403
    assert await (await client.get(f"{DS}/mine", headers=ALICE)).read() == b"x"


async def test_our_own_streams_are_json_streams(ds_client: MakeClient) -> None:
    client = await ds_client()
    api = StreamsApi(client)
    assert (await api.create("run-1", "out")).status == 201
    body = {"records": [{"data": {"token": "Hel"}}, {"content_type": "text/plain", "data_base64": "aGk="}]}
    assert (await api.append("run-1", "out", body=body)).status == 201
    head = await client.head(f"{DS}/run-1/out", headers=ALICE)
    assert head.status == 200 and head.headers["Content-Type"] == "application/json"
    assert head.headers["Stream-Next-Offset"] == encode_offset(2)
    messages = await (await client.get(f"{DS}/run-1/out", headers=ALICE)).json()
    assert messages[0] == {"token": "Hel"}
    assert messages[1]["sequence"] == 2 and messages[1]["data_base64"] == "aGk="
    # a long-poll at the tail is answered by an append through our own API: the same wakes
    tail = head.headers["Stream-Next-Offset"]
    poll = asyncio.create_task(client.get(f"{DS}/run-1/out?offset={tail}&live=long-poll", headers=ALICE))
    assert (await api.append("run-1", "out", {"token": "lo"})).status == 201
    answer = await poll
    assert answer.status == 200 and await answer.json() == [{"token": "lo"}]
    # appends through the protocol are records of our API
    posted = await client.post(
        f"{DS}/run-1/out", headers={"Content-Type": "application/json", **ALICE}, data=b'[{"a": 1}, 2]'
    )
    assert posted.status == 204 and posted.headers["Stream-Next-Offset"] == encode_offset(5)
    assert [r["data"] for r in await api.read_all("run-1", "out", after=3)] == [{"a": 1}, 2]
    # the protocol cannot delete a stream of our API
    assert (await client.delete(f"{DS}/run-1/out", headers=ALICE)).status == 405


async def test_a_pruned_offset_is_410_with_the_bounds(ds_client: MakeClient, db: asyncpg.Connection) -> None:
    client = await ds_client(durable_anonymous=True, durable_template=template(retention={"max_records": 2}))
    assert (await client.put(f"{DS}/r", headers={"Content-Type": "text/plain"})).status == 201
    for part in (b"a", b"b", b"c", b"d", b"e"):
        assert (await client.post(f"{DS}/r", headers={"Content-Type": "text/plain"}, data=part)).status == 204
    assert await prune_stream(db, "durable-streams", "r") == 3
    gone = await client.get(f"{DS}/r?offset={encode_offset(1)}")
    assert gone.status == 410
    problem = await gone.json()
    assert (problem["code"], problem["earliest"], problem["latest"]) == ("cursor_expired", 4, 5)
    # the start is what the stream still holds
    start = await client.get(f"{DS}/r?offset=-1")
    assert start.status == 200 and await start.read() == b"de"
    assert (await client.get(f"{DS}/r?offset={encode_offset(3)}")).status == 200


async def test_credit_refusals_are_429_with_retry_after(ds_client: MakeClient) -> None:
    credit = {"max_unread_items": 2, "max_unread_bytes": 1 << 20, "policy": "reject"}
    client = await ds_client(durable_anonymous=True, durable_template=template(credit=credit))
    assert (await client.put(f"{DS}/c", headers={"Content-Type": "text/plain"})).status == 201
    for part in (b"a", b"b"):
        assert (await client.post(f"{DS}/c", headers={"Content-Type": "text/plain"}, data=part)).status == 204
    refused = await client.post(f"{DS}/c", headers={"Content-Type": "text/plain"}, data=b"c")
    assert refused.status == 429
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["X-Content-Type-Options"] == "nosniff"
    # the same through the producer path, whose checks run in the append's own transaction
    producer = {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
    refused = await client.post(f"{DS}/c", headers={"Content-Type": "text/plain", **producer}, data=b"c")
    assert refused.status == 429 and "Retry-After" in refused.headers
    assert await (await client.get(f"{DS}/c")).read() == b"ab"


@pytest.mark.parametrize(
    "body",
    [
        b"[NaN]",
        b'{"x": Infinity}',
        b"[1e400]",
        b'["\\ud800"]',
        b"[" * 100_000 + b"]" * 100_000,
        b"\xff\xfe not UTF-8",
    ],
    ids=["nan", "infinity", "overflow", "lone-surrogate", "deep", "not-utf8"],
)
async def test_bodies_that_are_not_strict_json_store_nothing(ds_client: MakeClient, body: bytes) -> None:
    """JSON mode takes strict JSON only, as our own API does: what is stored is served to every reader,
    and one NaN would make every later read of the stream invalid JSON."""
    client = await ds_client(durable_anonymous=True)
    json_mode = {"Content-Type": "application/json"}
    assert (await client.put(f"{DS}/j", headers=json_mode, data=b'[{"ok":1}]')).status == 201
    refused = await client.post(f"{DS}/j", headers=json_mode, data=body)
    assert refused.status == 400, await refused.text()
    assert (await client.put(f"{DS}/k", headers=json_mode, data=body)).status == 400
    read = await client.get(f"{DS}/j?offset=-1")
    assert await read.json() == [{"ok": 1}]
    assert (await client.head(f"{DS}/k")).status == 404


async def test_a_catch_up_read_answers_an_ordinary_stream_whole_and_compressed(ds_client: MakeClient) -> None:
    """The protocol's clients take the first response of a read that is not live and stop: 2,000
    records come in one response (compressed when asked), and HEAD says which state it describes."""
    client = await ds_client(durable_anonymous=True)
    json_mode = {"Content-Type": "application/json"}
    assert (await client.put(f"{DS}/many", headers=json_mode)).status == 201
    for start in range(0, 2000, 500):
        batch = ",".join(f'{{"n":{n}}}' for n in range(start, start + 500))
        assert (await client.post(f"{DS}/many", headers=json_mode, data=f"[{batch}]")).status == 204
    read = await client.get(f"{DS}/many?offset=-1", headers={"Accept-Encoding": "gzip"})
    assert read.headers["Content-Encoding"] == "gzip"
    assert read.headers["Stream-Up-To-Date"] == "true"
    assert [m["n"] for m in await read.json()] == list(range(2000))
    head = await client.head(f"{DS}/many")
    assert (await client.head(f"{DS}/many")).headers["ETag"] == head.headers["ETag"]  # nothing changed
    assert (await client.post(f"{DS}/many", headers=json_mode, data=b'{"n":2000}')).status == 204
    assert (await client.head(f"{DS}/many")).headers["ETag"] != head.headers["ETag"]
    plain = await client.get(f"{DS}/many?offset=-1", headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers


async def test_a_plain_append_checks_the_protocols_stream_under_the_row_lock(
    ds_client: MakeClient, db: asyncpg.Connection
) -> None:
    """A plain append is one group-committed transaction that also decides what the protocol asks of the
    stream: its records take the stream's content type as stored, it renews a sliding TTL, and a stream
    deleted and made again with another content type refuses it (409), as does one deleted (404)."""
    client = await ds_client(durable_anonymous=True)
    text = {"Content-Type": "text/plain"}
    assert (await client.put(f"{DS}/t", headers={**text, "Stream-TTL": "3600"})).status == 201
    before = await db.fetchval("SELECT accessed_at FROM wfs_durable_streams WHERE stream_id = 't'")
    appended = await client.post(f"{DS}/t", headers={"Content-Type": "text/plain; charset=utf-8"}, data=b"ab")
    assert appended.status == 204 and appended.headers["Stream-Next-Offset"] == encode_offset(1)
    after = await db.fetchval("SELECT accessed_at FROM wfs_durable_streams WHERE stream_id = 't'")
    assert after > before
    stored = await db.fetchval(
        "SELECT r.content_type FROM wfs_records r JOIN wfs_streams s USING (stream_key) WHERE s.stream_id = 't'"
    )
    assert stored == "text/plain"
    assert (await client.delete(f"{DS}/t")).status == 204
    assert (await client.post(f"{DS}/t", headers=text, data=b"c")).status == 404
    assert (await client.put(f"{DS}/t", headers={"Content-Type": "application/json"})).status == 201
    refused = await client.post(f"{DS}/t", headers=text, data=b"c")
    assert refused.status == 409 and (await refused.json())["code"] == "content_type_mismatch"
    assert (await client.post(f"{DS}/t", headers={"Content-Type": "application/json"}, data=b"[1]")).status == 204
    assert await (await client.get(f"{DS}/t")).json() == [1]
