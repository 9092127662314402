"""Hostile input gets a clear 4xx and changes nothing: one test per class, each checks the stream after."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientResponse

from tests.support import ALICE, EVE, StreamsApi, pins
from tests.waiting import eventually
from workflow_streams import API_PREFIX
from workflow_streams.domain.strictjson import MAX_DEPTH
from workflow_streams.shells.compose import create_app


async def snapshot(db: asyncpg.Connection) -> tuple[Any, ...]:
    """Everything a request could change."""
    return (
        tuple(await db.fetch("SELECT run_id, stream_id, last_sequence, appended_bytes, closed_at FROM wfs_streams")),
        tuple(
            await db.fetch(
                """SELECT s.run_id, s.stream_id, r.sequence, r.payload, r.object
                   FROM wfs_records r JOIN wfs_streams s USING (stream_key) ORDER BY 1, 2, 3"""
            )
        ),
        tuple(await db.fetch("SELECT * FROM wfs_consumers ORDER BY consumer_id")),
        tuple(await db.fetch("SELECT * FROM wfs_append_receipts ORDER BY idempotency_key")),
        tuple(await db.fetch("SELECT * FROM wfs_legal_holds ORDER BY hold_id")),
        tuple(await db.fetch("SELECT * FROM wfs_object_intents")),
    )


@pytest.fixture
async def stream(api: StreamsApi) -> StreamsApi:
    await api.create("r", "s")
    await api.append("r", "s", {"n": 1}, {"n": 2})
    await api.ack("r", "s", "c1", 1)
    return api


async def expect_unchanged(
    db: asyncpg.Connection, request: Callable[[], Awaitable[ClientResponse]], status: int | tuple[int, ...]
) -> dict[str, Any]:
    before = await snapshot(db)
    resp = await request()
    statuses = status if isinstance(status, tuple) else (status,)
    assert resp.status in statuses, (resp.status, await resp.text())
    assert resp.content_type == "application/problem+json"
    body: dict[str, Any] = await resp.json(content_type=None)
    assert body["status"] == resp.status and body["code"]
    assert await snapshot(db) == before, "a refused request changed the stream"
    return body


RECORDS = f"{API_PREFIX}/runs/r/streams/s/records"


async def test_oversized_bodies(stream: StreamsApi, db: asyncpg.Connection) -> None:
    huge = json.dumps({"records": [{"data": "x" * 60_000} for _ in range(80)]}).encode()  # ~4.8 MB > 4 MiB
    headers = {**ALICE, "Content-Type": "application/json"}
    body = await expect_unchanged(db, lambda: stream.client.post(RECORDS, data=io.BytesIO(huge), headers=headers), 413)
    assert body["code"] == "payload_too_large"
    await expect_unchanged(db, lambda: stream.append("r", "s", "y" * 70_000), 413)


async def test_malformed_json(stream: StreamsApi, db: asyncpg.Connection) -> None:
    headers = {**ALICE, "Content-Type": "application/json"}
    for raw in (b"{", b"[1,", b"\xff\xfe", b"", b"null", b'{"data": NaN', b"{'data': 1}"):
        await expect_unchanged(db, lambda raw=raw: stream.client.post(RECORDS, data=raw, headers=headers), 400)
    text = {**ALICE, "Content-Type": "text/plain"}
    await expect_unchanged(db, lambda: stream.client.post(RECORDS, data=b'{"data": 1}', headers=text), 400)


async def test_wrong_types(stream: StreamsApi, db: asyncpg.Connection) -> None:
    cases: list[Callable[[], Awaitable[ClientResponse]]] = [
        lambda: stream.append("r", "s", body={"records": "not a list"}),
        lambda: stream.append("r", "s", body={"records": [{"content_type": 7, "data": 1}]}),
        lambda: stream.append("r", "s", body={"data_base64": 12}),
        lambda: stream.ack("r", "s", "c1", "2"),
        lambda: stream.ack("r", "s", "c1", [2]),
        lambda: stream.hold("r", "s", "true"),  # type: ignore[arg-type]
        lambda: stream.client.post(stream.url("r"), json={"stream_id": 5, "pins": pins()}, headers=ALICE),
        lambda: stream.client.post(stream.url("r"), json=["stream_id"], headers=ALICE),
    ]
    for case in cases:
        await expect_unchanged(db, case, (400, 422))
    wrong = pins(credit={"max_unread_items": 1.5})
    body = await expect_unchanged(
        db, lambda: stream.client.post(stream.url("r"), json={"stream_id": "n", "pins": wrong}, headers=ALICE), 422
    )
    assert body["errors"][0]["field"] == "credit/max_unread_items"


async def test_huge_and_negative_cursors(stream: StreamsApi, db: asyncpg.Connection) -> None:
    for after in ("-1", "9" * 30, str(2**63), "1e9", "+1", "0x1", "\u0661"):  # the last: Arabic-Indic one
        await expect_unchanged(db, lambda after=after: stream.read("r", "s", after=after), 400)
    await expect_unchanged(db, lambda: stream.read("r", "s", after=str(2**63 - 1)), 400)
    for limit in ("0", "-5", "1000000", "abc"):
        await expect_unchanged(db, lambda limit=limit: stream.read("r", "s", limit=limit), 400)
    resp = await stream.client.get(stream.url("r", "s", "/subscribe"), headers={**ALICE, "Last-Event-ID": "-7"})
    assert resp.status == 400


async def test_identifiers_with_path_tricks_or_sql(stream: StreamsApi, db: asyncpg.Connection) -> None:
    tricks = ["..%2F..%2Fetc", "s%00", "s'%20OR%201=1--", "%252e%252e", "a" * 200, "s;DROP%20TABLE%20wfs_records"]
    for trick in tricks:
        url = f"{API_PREFIX}/runs/r/streams/{trick}/records"
        await expect_unchanged(db, lambda url=url: stream.client.post(url, json={"data": 1}, headers=ALICE), (400, 404))
        consumer = f"{API_PREFIX}/runs/r/streams/s/consumers/{trick}/ack"
        await expect_unchanged(
            db,
            lambda consumer=consumer: stream.client.post(consumer, json={"sequence": 2}, headers=ALICE),
            (400, 404),
        )
    await expect_unchanged(db, lambda: stream.append("r", "s", 1, key="k\u00e9y"), 400)


async def test_unknown_fields(stream: StreamsApi, db: asyncpg.Connection) -> None:
    await expect_unchanged(db, lambda: stream.append("r", "s", body={"data": 1, "sequence": 99}), 400)
    await expect_unchanged(
        db,
        lambda: stream.client.post(
            stream.url("r", "s", "/consumers/c1/ack"), json={"sequence": 2, "force": True}, headers=ALICE
        ),
        400,
    )
    await expect_unchanged(db, lambda: stream.hold("r", "s", True, "x", admin=True), 400)
    body = await expect_unchanged(
        db,
        lambda: stream.client.post(
            stream.url("r"), json={"stream_id": "x", "pins": pins(), "owner": "eve"}, headers=ALICE
        ),
        400,
    )
    assert body["field"] == "owner"


async def test_slow_body_times_out(
    aiohttp_client: Any, database_url: str, settings_for: Any, db: asyncpg.Connection
) -> None:
    api = StreamsApi(await aiohttp_client(create_app(settings_for(database_url, body_timeout_seconds=0.5))))
    await api.create("r", "s")
    await api.append("r", "s", 1)

    async def trickle() -> Any:
        yield b'{"records": [{"data": 1},'
        await asyncio.sleep(2)
        yield b'{"data": 2}]}'

    headers = {**ALICE, "Content-Type": "application/json"}
    body = await expect_unchanged(db, lambda: api.client.post(RECORDS, data=trickle(), headers=headers), 408)
    assert body["code"] == "request_timeout"


async def test_too_many_subscriptions_per_principal(
    aiohttp_client: Any, database_url: str, settings_for: Any, db: asyncpg.Connection
) -> None:
    api = StreamsApi(await aiohttp_client(create_app(settings_for(database_url, sse_max_per_principal=3))))
    await api.create("r", "s")
    url = api.url("r", "s", "/subscribe")
    open_ = [await api.client.get(url, headers=ALICE) for _ in range(3)]
    assert all(r.status == 200 for r in open_)
    body = await expect_unchanged(db, lambda: api.client.get(url, headers=ALICE), 429)
    assert body["code"] == "too_many_subscriptions" and body["limit"] == 3
    open_[0].close()

    async def admitted() -> Any:
        resp = await api.client.get(url, headers=ALICE)
        if resp.status == 429:  # the server has not seen the close yet
            resp.close()
            return None
        return resp

    again = await eventually(admitted, message="a closed subscription never freed its slot")
    assert again.status == 200, "a closed subscription frees its slot"
    for r in [again, *open_[1:]]:
        r.close()


async def test_control_characters_in_stored_text(stream: StreamsApi, db: asyncpg.Connection) -> None:
    """Postgres text cannot hold NUL: refused as input, never a 500 (found by schemathesis)."""
    bad = pins(schema_ref="schemas/\u0000/v1")
    body = await expect_unchanged(
        db, lambda: stream.client.post(stream.url("r"), json={"stream_id": "n", "pins": bad}, headers=ALICE), 422
    )
    assert body["errors"][0]["field"] == "schema_ref"
    await expect_unchanged(db, lambda: stream.hold("r", "s", True, "matter\u0000"), 400)
    await expect_unchanged(
        db,
        lambda: stream.client.post(
            stream.url("r"),
            json={"stream_id": "n", "pins": {**pins(), "content_class": {"not": "a string"}}},
            headers=ALICE,
        ),
        422,
    )


# Strict JSON (RFC 8259) on every body. Each case is the raw text of a body, sent as application/json.

JSON = {**ALICE, "Content-Type": "application/json"}


def raw_body(value: Any, **literals: str) -> bytes:
    """``value`` as JSON text, with each string ``"<name>"`` in it replaced by the raw ``literals[name]``."""
    text = json.dumps(value)
    for name, literal in literals.items():
        assert f'"<{name}>"' in text
        text = text.replace(f'"<{name}>"', literal)
    return text.encode()


async def refused_json(
    db: asyncpg.Connection, request: Callable[[], Awaitable[ClientResponse]], rule: str
) -> dict[str, Any]:
    body = await expect_unchanged(db, request, 400)
    assert (body["code"], body["rule"]) == ("invalid_json", rule), body
    return body


def bodies(stream: StreamsApi, *, literal: str, placeholder: Any = "<x>") -> list[tuple[str, str, bytes]]:
    """The same hostile literal in the body of every operation that reads one."""
    prepare = {"idempotency_key": "k", "sha256": "0" * 64, "size": placeholder}
    return [
        ("POST", RECORDS, raw_body({"data": placeholder}, x=literal)),
        ("POST", RECORDS, raw_body({"records": [{"data": 1}, {"data": {"deep": [placeholder]}}]}, x=literal)),
        (
            "POST",
            stream.url("r"),
            raw_body({"stream_id": "n", "pins": pins(credit={"max_unread_items": placeholder})}, x=literal),
        ),
        ("POST", stream.url("r", "s", "/consumers/c1/ack"), raw_body({"sequence": placeholder}, x=literal)),
        ("PUT", stream.url("r", "s", "/legal-hold"), raw_body({"enabled": True, "reason": placeholder}, x=literal)),
        ("POST", stream.url("r", "s", "/objects/prepare"), raw_body(prepare, x=literal)),
    ]


async def test_non_finite_numbers(stream: StreamsApi, db: asyncpg.Connection) -> None:
    """NaN and infinities are not JSON: stored, they would break every reader of the stream."""
    for literal in ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1.5e999", "1" * 400 + ".0"):
        for method, url, raw in bodies(stream, literal=literal):
            body = await refused_json(
                db,
                lambda method=method, url=url, raw=raw: stream.client.request(method, url, data=raw, headers=JSON),
                "non_finite_number",
            )
            assert body["field"] == "/"
    # the largest finite double is a number like any other
    ok = await stream.client.post(RECORDS, data=b'{"data": [1.7976931348623157e308, -0.0, 5e-324]}', headers=JSON)
    assert ok.status == 201, await ok.text()


async def test_lone_surrogates(stream: StreamsApi, db: asyncpg.Connection) -> None:
    """An escaped lone UTF-16 surrogate is not text: no encoder can write it (it was a 500)."""
    for literal in ('"\\ud800"', '"a\\udfffb"', '"\\uDBFF"', '"\\ud800\\\\udc00"'):
        for method, url, raw in bodies(stream, literal=literal):
            await refused_json(
                db,
                lambda method=method, url=url, raw=raw: stream.client.request(method, url, data=raw, headers=JSON),
                "lone_surrogate",
            )
    # in a key, and in the stream id of a create
    await refused_json(
        db, lambda: stream.client.post(RECORDS, data=b'{"data": {"\\udc00": 1}}', headers=JSON), "lone_surrogate"
    )
    create = raw_body({"stream_id": "<x>", "pins": pins()}, x='"n\\ud800"')
    await refused_json(db, lambda: stream.client.post(stream.url("r"), data=create, headers=JSON), "lone_surrogate")
    # an escaped pair is one character, and a literal backslash-u is just text: both are stored
    resp = await stream.client.post(RECORDS, data=b'{"data": ["\\ud83d\\ude00", "\\\\ud800"]}', headers=JSON)
    assert resp.status == 201, await resp.text()
    records = await stream.read_all("r", "s")
    assert records[-1]["data"] == ["\U0001f600", "\\ud800"]


async def test_nesting_deeper_than_the_limit(stream: StreamsApi, db: asyncpg.Connection) -> None:
    """100,000 levels (about 200 KB, under the size cap) was a RecursionError and a 500."""
    for levels in (MAX_DEPTH, 1000, 100_000):  # with the body's own level, each is past the limit
        nested = "[" * levels + "]" * levels
        for method, url, raw in bodies(stream, literal=nested):
            body = await refused_json(
                db,
                lambda method=method, url=url, raw=raw: stream.client.request(method, url, data=raw, headers=JSON),
                "too_deep",
            )
            assert body["limit"] == MAX_DEPTH
    # exactly at the limit: the body is level 1, data the rest
    at_limit = raw_body({"data": "<x>"}, x="[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))
    resp = await stream.client.post(RECORDS, data=at_limit, headers=JSON)
    assert resp.status == 201, await resp.text()


async def test_numbers_and_encodings_python_would_take(stream: StreamsApi, db: asyncpg.Connection) -> None:
    """An integer longer than Python converts (was a ValueError), and bodies in another charset."""
    await refused_json(
        db, lambda: stream.client.post(RECORDS, data=b'{"data": ' + b"7" * 5000 + b"}", headers=JSON), "number_too_long"
    )
    latin = {**ALICE, "Content-Type": "application/json; charset=latin-1"}
    await refused_json(
        db, lambda: stream.client.post(RECORDS, data='{"data": "é"}'.encode("latin-1"), headers=latin), "encoding"
    )
    await refused_json(db, lambda: stream.client.post(RECORDS, data=b'{"data": "\xe9"}', headers=JSON), "encoding")
    await refused_json(db, lambda: stream.client.post(RECORDS, data=b'{"data": 1', headers=JSON), "syntax")
    utf8 = {**ALICE, "Content-Type": "application/json; charset=UTF-8"}
    resp = await stream.client.post(RECORDS, data='{"data": "é"}'.encode(), headers=utf8)
    assert resp.status == 201, await resp.text()


async def test_deliveries_of_an_output_stream(stream: StreamsApi, db: asyncpg.Connection) -> None:
    """Input-only routes on an output stream say so (they answered 200 with zeros)."""
    for method, tail in (("GET", "/deliveries"), ("POST", "/deliveries/requeue")):
        url = stream.url("r", "s", tail)
        body = await expect_unchanged(
            db, lambda method=method, url=url: stream.client.request(method, url, headers=ALICE), 409
        )
        assert body["code"] == "not_an_input_stream"
        # to a caller without rights the stream stays invisible, direction and all
        eve = await expect_unchanged(
            db, lambda method=method, url=url: stream.client.request(method, url, headers=EVE), 403
        )
        assert eve["code"] == "forbidden"
    await stream.create("r", "in", direction="input", content_class="user_input")
    resp = await stream.client.get(stream.url("r", "in", "/deliveries"), headers=ALICE)
    assert resp.status == 200 and (await resp.json())["counts"] == {"pending": 0, "delivered": 0, "failed": 0}


async def test_a_body_over_the_limit_that_arrived_whole(
    aiohttp_client: Any, database_url: str, settings_for: Any, db: asyncpg.Connection
) -> None:
    """A body already in the server's buffer when the handler runs is taken without reading the stream
    again (api.common.read_json): the size limit holds on that path too."""
    api = StreamsApi(await aiohttp_client(create_app(settings_for(database_url, max_request_bytes=2048))))
    await api.create("r", "s")
    body = json.dumps({"data": "x" * 3000}).encode()
    headers = {**ALICE, "Content-Type": "application/json"}
    problem = await expect_unchanged(db, lambda: api.client.post(RECORDS, data=body, headers=headers), 413)
    assert problem["code"] == "payload_too_large"
    assert (await api.append("r", "s", "small")).status == 201  # under the limit, the same path appends
