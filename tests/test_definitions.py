"""Stream definitions over HTTP: create, idempotent re-create, immutable pins, refusals."""

from __future__ import annotations

import asyncpg

from tests.support import BOB, EVE, StreamsApi, pins, problem
from workflow_streams import API_PREFIX
from workflow_streams.domain.authz import Trusted
from workflow_streams.store import definitions


async def test_create_then_same_pins_is_idempotent(api: StreamsApi) -> None:
    first = await api.create("run-1", "out")
    assert first.status == 201
    body = await first.json()
    assert body["run_id"] == "run-1" and body["stream_id"] == "out"
    assert body["created_by"] == "alice"
    assert first.headers["Location"] == f"{API_PREFIX}/runs/run-1/streams/out"

    again = await api.create("run-1", "out")
    assert again.status == 200
    assert await again.json() == body


async def test_defaults_are_part_of_the_pins(api: StreamsApi) -> None:
    """Leaving a default out and spelling it out are the same pins."""
    assert (await api.create("run-1", "out")).status == 201
    explicit = pins()
    explicit["credit"]["block_timeout_ms"] = 5000
    explicit["redaction"] = {"strategy": "drop_payload", "fields": []}
    resp = await api.client.post(api.url("run-1"), json={"stream_id": "out", "pins": explicit}, headers=api.headers)
    assert resp.status == 200


async def test_different_pins_conflict(api: StreamsApi) -> None:
    assert (await api.create("run-1", "out")).status == 201
    resp = await api.create("run-1", "out", retention={"max_records": 10})
    body = await problem(resp, 409, "pins_conflict")
    assert body["existing_pins_digest"] != body["requested_pins_digest"]
    got = await (await api.get("run-1", "out")).json()
    assert got["pins"]["retention"]["max_records"] is None


async def test_raw_model_reasoning_is_refused(api: StreamsApi) -> None:
    resp = await api.create("run-1", "thoughts", content_class="raw_model_reasoning")
    body = await problem(resp, 422, "forbidden_content_class")
    assert "reasoning_summary" in body["allowed"]
    await problem(await api.get("run-1", "thoughts"), 403, "forbidden")  # as if it were not ours


async def test_invalid_definitions_name_the_field(api: StreamsApi) -> None:
    resp = await api.create("run-1", "out", content_class="poetry")
    body = await problem(resp, 422, "invalid_definition")
    assert any(e["field"] == "content_class" for e in body["errors"])

    resp = await api.create("run-1", "out", credit={"max_unread_items": "10"})
    body = await problem(resp, 422, "invalid_definition")
    assert any(e["field"] == "credit/max_unread_items" for e in body["errors"])

    resp = await api.create("run-1", "out", placement={"object_regions": []})
    body = await problem(resp, 422, "invalid_definition")
    assert any(e["field"] == "placement/object_regions" for e in body["errors"])

    resp = await api.create("run-1", "out", surprise=True)
    body = await problem(resp, 422, "invalid_definition")
    assert any(e["field"] == "surprise" for e in body["errors"])

    # beyond what Postgres holds (a bigint count, an interval added to now()): refused, not a 500
    for field, value in (("max_records", 2**65), ("max_age_seconds", 10**18)):
        resp = await api.create("run-1", "out", retention={field: value})
        body = await problem(resp, 422, "invalid_definition")
        assert any(e["field"] == f"retention/{field}" for e in body["errors"])


async def test_get_returns_definition_and_state(api: StreamsApi) -> None:
    await api.create("run-1", "out")
    await api.append("run-1", "out", {"n": 1})
    body = await (await api.get("run-1", "out")).json()
    assert body["state"]["last_sequence"] == 1
    assert body["state"]["closed"] is False
    assert body["state"]["legal_hold"] is False
    assert body["pins"]["placement"]["metadata_home"] == "eu-west-1"


async def test_authentication_and_authorization(api: StreamsApi) -> None:
    await api.create("run-1", "out")
    await problem(await api.as_({}).get("run-1", "out"), 401, "unauthenticated")
    await problem(await api.as_({"Authorization": "Bearer nope"}).get("run-1", "out"), 401, "unauthenticated")
    await problem(await api.as_(EVE).get("run-1", "out"), 403, "forbidden")
    assert (await api.as_(BOB).get("run-1", "out")).status == 200
    # eve cannot learn the pins, nor that the stream exists, by re-creating it
    await problem(await api.as_(EVE).create("run-1", "out"), 403, "forbidden")
    await problem(await api.as_(EVE).create("run-1", "out", retention={"max_records": 5}), 403, "forbidden")


async def test_bad_identifiers_are_rejected(api: StreamsApi) -> None:
    for bad in ("..", "a%2F..%2Fb", "x'%3B%20DROP%20TABLE%20wfs_streams%3B--", "-lead"):
        resp = await api.client.get(f"{API_PREFIX}/runs/{bad}/streams/out", headers=api.headers)
        assert resp.status in (400, 404), (bad, resp.status)
        assert resp.content_type == "application/problem+json"
    resp = await api.client.post(api.url("run-1"), json={"stream_id": "a/b", "pins": pins()}, headers=api.headers)
    await problem(resp, 400, "invalid_input")


async def test_missing_and_forbidden_streams_look_the_same(api: StreamsApi) -> None:
    """A caller learns nothing about streams it cannot see: same status, code and detail."""
    await api.create("run-1", "secret", authorization={"read": ["alice"], "append": ["alice"]})
    eve = api.as_(EVE)
    pairs = [
        (await eve.read("run-1", "secret"), await eve.read("run-1", "nothing-here")),
        (await eve.get("run-1", "secret"), await eve.get("run-2", "secret")),
        (await eve.append("run-1", "secret", 1), await eve.append("run-1", "nothing-here", 1)),
        (await eve.ack("run-1", "secret", "c", 0), await eve.ack("run-1", "nothing-here", "c", 0)),
    ]
    for existing, missing in pairs:
        assert existing.status == missing.status == 403
        assert await existing.json() == await missing.json()


async def test_deleting_a_stream_deletes_its_records(api: StreamsApi, db: asyncpg.Connection) -> None:
    """Records hold no foreign key to their stream (migration 484): the delete takes them, and only them."""
    for stream_id in ("out", "other"):
        await api.create("run-1", stream_id)
        for n in range(3):
            assert (await api.append("run-1", stream_id, {"n": n})).status == 201
    keys = dict(await db.fetch("SELECT stream_id, stream_key FROM wfs_streams WHERE run_id = 'run-1'"))
    await definitions.delete_stream(db, "run-1", "out", Trusted("test"))

    count = "SELECT count(*) FROM wfs_records WHERE stream_key = $1"
    assert await db.fetchval(count, keys["out"]) == 0
    assert await db.fetchval(count, keys["other"]) == 3
    assert await db.fetchval("SELECT count(*) FROM wfs_streams WHERE run_id = 'run-1'") == 1
