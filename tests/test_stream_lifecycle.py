"""A first stream in one request, pins that could never work refused, deletion over HTTP, a stream's state
as the database holds it, the runs a caller may see, and errors that say what to fix (issue 46)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from tests.conftest import make_settings
from tests.support import ALICE, BOB, EVE, StreamsApi, pins
from workflow_streams import API_PREFIX
from workflow_streams.domain.admission import Served, refusal
from workflow_streams.domain.authz import seen_by
from workflow_streams.domain.pins import parse_pins
from workflow_streams.shells.compose import create_app

TEMPLATES = {
    "audited": {
        "description": "input streams kept a year, readable by the auditors",
        "pins": {
            "direction": "input",
            "content_class": "user_input",
            "retention": {"max_age_seconds": 31_536_000},
            "authorization": {"read": ["$creator", "group:auditors"]},
        },
    }
}


@pytest.fixture
async def templated(aiohttp_client: Any, database_url: str) -> StreamsApi:
    settings = make_settings(database_url, pins_templates=TEMPLATES)
    return StreamsApi(await aiohttp_client(create_app(settings)))


async def create(api: StreamsApi, run: str, body: dict[str, Any], headers: dict[str, str] = ALICE) -> Any:
    return await api.client.post(api.url(run), json=body, headers=headers)


async def test_a_first_stream_is_one_request(api: StreamsApi, db: asyncpg.Connection) -> None:
    resp = await create(api, "run-1", {"stream_id": "answers"})
    assert resp.status == 201, await resp.text()
    stored = json.loads(await db.fetchval("SELECT pins FROM wfs_streams WHERE run_id = 'run-1'"))
    # the whole resolved document is stored: this data plane's region, every right for the creator
    assert stored["placement"]["client_egress_regions"] == ["eu-west-1"]
    assert stored["placement"]["metadata_home"] == "eu-west-1"
    for action in ("append", "read", "ack", "close", "legal_hold"):
        assert stored["authorization"][action] == ["alice"], action
    assert (await api.append("run-1", "answers", {"text": "hi"})).status == 201
    assert (await api.read("run-1", "answers")).status == 200
    assert (await api.as_(BOB).read("run-1", "answers")).status == 403, "nobody else was given a right"
    again = await create(api, "run-1", {"stream_id": "answers"})
    assert again.status == 200, "the same default again is the same stream"


async def test_a_template_with_overrides_stores_the_resolved_pins(
    templated: StreamsApi, db: asyncpg.Connection
) -> None:
    overrides = {"credit": {"max_unread_items": 7}}
    resp = await create(templated, "run-t", {"stream_id": "in", "template": "audited", "pins": overrides})
    assert resp.status == 201, await resp.text()
    body = await resp.json()
    stored = json.loads(await db.fetchval("SELECT pins FROM wfs_streams WHERE stream_id = 'in'"))
    assert stored["direction"] == "input" and stored["content_class"] == "user_input"
    assert stored["retention"]["max_age_seconds"] == 31_536_000
    assert stored["authorization"]["read"] == ["alice", "group:auditors"]
    assert stored["authorization"]["append"] == ["alice"], "what the template leaves out comes from the base"
    assert stored["credit"]["max_unread_items"] == 7 and stored["credit"]["policy"] == "block"
    assert body["pins"] == {k: v for k, v in stored.items() if k != "pins_version"}

    listed = await (await templated.client.get(f"{API_PREFIX}/templates", headers=ALICE)).json()
    names = [t["name"] for t in listed["templates"]]
    assert names == ["default", "audited"]
    assert listed["templates"][1]["resolved"]["authorization"]["read"] == ["alice", "group:auditors"]

    unknown = await create(templated, "run-t", {"stream_id": "x", "template": "audit"})
    problem = await unknown.json()
    assert unknown.status == 404 and problem["field"] == "template" and problem["templates"] == ["audited"]


async def test_pins_that_lock_everyone_out_or_cannot_be_served_are_refused(
    api: StreamsApi, db: asyncpg.Connection
) -> None:
    document = pins()
    document["authorization"] = {}  # what a caller new to pins writes first
    locked = await create(api, "run-l", {"stream_id": "nobody", "pins": document})
    problem = await locked.json()
    assert locked.status == 422 and problem["code"] == "invalid_definition", problem
    assert {e["field"] for e in problem["errors"]} == {"authorization/read", "authorization/append"}
    elsewhere = await api.create("run-l", "far", placement={"client_egress_regions": ["us-east-1"]})
    problem = await elsewhere.json()
    assert elsewhere.status == 422
    assert [e["field"] for e in problem["errors"]] == ["placement/client_egress_regions"]
    assert await db.fetchval("SELECT count(*) FROM wfs_streams") == 0, "nothing was created"
    # fixed pins make the stream: nothing of the refusal stays behind
    assert (await api.create("run-l", "nobody")).status == 201


@pytest.mark.unit
def test_object_regions_no_store_here_serves_are_refused() -> None:
    served = Served("eu-west-1", ("eu-central-1",), ("eu-west-1",))
    ok = parse_pins(pins())
    assert refusal(ok, served) is None
    far = parse_pins(pins(placement={"object_regions": ["us-east-1"]}))
    problem = refusal(far, served)
    assert problem is not None and [e["field"] for e in problem.extra["errors"]] == ["placement/object_regions"]
    # no object store at all: objects are not served here, and no pin is judged by them
    assert refusal(far, Served("eu-west-1")) is None


async def test_delete_without_and_with_a_hold_and_define_again(api: StreamsApi, db: asyncpg.Connection) -> None:
    assert (await api.create("run-d", "s")).status == 201
    assert (await api.append("run-d", "s", 1, 2, 3)).status == 201
    refused = await api.client.delete(api.url("run-d", "s"), headers=BOB)
    assert refused.status == 403, "group readers may read, not delete"
    assert (await api.hold("run-d", "s", True, "matter 9", hold_id="m9")).status == 200
    held = await api.client.delete(api.url("run-d", "s"), headers=ALICE)
    assert held.status == 409 and (await held.json())["code"] == "stream_held"
    assert await db.fetchval("SELECT last_sequence FROM wfs_streams WHERE run_id = 'run-d'") == 3
    assert (await api.hold("run-d", "s", False, "", hold_id="m9")).status == 200

    deleted = await api.client.delete(api.url("run-d", "s"), headers=ALICE)
    assert deleted.status == 200, await deleted.text()
    assert await deleted.json() == {"run_id": "run-d", "stream_id": "s", "deleted": True, "objects_queued": 0}
    assert await db.fetchval("SELECT count(*) FROM wfs_streams") == 0
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 0
    assert (await api.read("run-d", "s")).status == 403
    gone = await api.client.delete(api.url("run-d", "s"), headers=ALICE)
    assert gone.status == 403, "a stream that is not there looks like one the caller may not see"

    again = await api.create("run-d", "s", credit={"max_unread_items": 5})
    assert again.status == 201, "a deleted stream's name can be defined again, with other pins"
    page = await (await api.read("run-d", "s")).json()
    assert page["records"] == [] and page["latest"] == 0


async def test_a_stream_owned_by_a_workflowstream_is_deleted_through_it(
    api: StreamsApi, db: asyncpg.Connection
) -> None:
    assert (await api.create("run-k", "s")).status == 201
    await db.execute(
        "UPDATE wfs_streams SET owner_namespace = 'team-a', owner_name = 'answers', owner_uid = 'u-1'"
        " WHERE run_id = 'run-k'"
    )
    refused = await api.client.delete(api.url("run-k", "s"), headers=ALICE)
    problem = await refused.json()
    assert refused.status == 409 and problem["code"] == "owned_elsewhere"
    assert problem["owner"] == {"kind": "WorkflowStream", "namespace": "team-a", "name": "answers", "uid": "u-1"}
    assert "kubectl delete wfs answers -n team-a" in problem["detail"]
    state = (await (await api.get("run-k", "s")).json())["state"]
    assert state["owner"]["namespace"] == "team-a"


async def test_get_shows_what_the_database_holds(api: StreamsApi, db: asyncpg.Connection) -> None:
    assert (await api.create("run-g", "out", credit={"max_unread_items": 4, "max_total_items": 100})).status == 201
    assert (await api.append("run-g", "out", "a", "b", "c")).status == 201
    state = (await (await api.get("run-g", "out")).json())["state"]
    assert state["unread"] == {
        "items": 3,
        "bytes": await db.fetchval("SELECT appended_bytes FROM wfs_streams"),
        "max_items": 4,
        "max_bytes": 1 << 30,
        "after_sequence": 0,
        "full": False,
    }
    assert state["consumers"] == [] and state["deliveries"] is None and state["owner"] is None
    assert state["total"]["items"] == 3 and state["total"]["max_items"] == 100
    assert state["objects_in_flight"] == {"prepared": 0, "uploaded": 0}

    assert (await api.ack("run-g", "out", "fast", 3)).status == 200
    assert (await api.ack("run-g", "out", "slow", 1)).status == 200
    assert (await api.append("run-g", "out", "d", "e")).status == 201
    assert (await api.hold("run-g", "out", True, "matter 1", hold_id="m1")).status == 200
    state = (await (await api.get("run-g", "out")).json())["state"]
    assert [(c["consumer_id"], c["acked_sequence"], c["lag"]) for c in state["consumers"]] == [
        ("slow", 1, 4),
        ("fast", 3, 2),
    ]
    assert state["unread"]["items"] == 4 and state["unread"]["after_sequence"] == 1
    assert state["unread"]["full"] is True, "the slowest consumer holds the window at its ceiling"
    refused = await api.append("run-g", "out", "f")
    assert refused.status == 429, "what get calls full is what credit refuses"
    assert [h["hold_id"] for h in state["legal_holds"]] == ["m1"] and state["legal_hold"] is True

    assert (await api.create("run-g", "in", direction="input")).status == 201
    assert (await api.append("run-g", "in", "x", "y")).status == 201
    state = (await (await api.get("run-g", "in")).json())["state"]
    assert state["deliveries"] == {"pending": 2, "delivered": 0, "failed": 0}


async def test_runs_are_listed_for_those_who_may_see_something(api: StreamsApi) -> None:
    for run in ("r-a", "r-b", "r-c"):
        assert (await api.create(run, "s")).status == 201
    assert (await api.create("r-b", "t")).status == 201
    eves = await create(api, "r-eve", {"stream_id": "mine"}, headers=EVE)
    assert eves.status == 201

    first = await (await api.client.get(f"{API_PREFIX}/runs?limit=2", headers=ALICE)).json()
    assert [(r["run_id"], r["streams"]) for r in first["runs"]] == [("r-a", 1), ("r-b", 2)]
    assert first["next_after"] == "r-b"
    rest = await (await api.client.get(f"{API_PREFIX}/runs?after=r-b", headers=ALICE)).json()
    assert [r["run_id"] for r in rest["runs"]] == ["r-c"] and rest["next_after"] is None
    seen = await (await api.client.get(f"{API_PREFIX}/runs", headers=EVE)).json()
    assert [r["run_id"] for r in seen["runs"]] == ["r-eve"], "eve sees her run only"
    by_group = await (await api.client.get(f"{API_PREFIX}/runs", headers=BOB)).json()
    assert [r["run_id"] for r in by_group["runs"]] == ["r-a", "r-b", "r-c"], "group:readers may read those"


async def test_stored_seen_by_agrees_with_the_rights_rule(api: StreamsApi, db: asyncpg.Connection) -> None:
    """The column a create writes (the domain's rule) and the SQL writing that filled it for streams stored
    before it existed (migration 489) give the same subjects."""
    cases = [
        {},
        {"read": ["a"], "append": ["b"]},
        {"read": ["*"], "append": ["a"], "subscribe": ["sub-only"]},
        {"read": ["a"], "append": ["a"], "close": ["group:ops"], "delete": ["deleter"]},
        {"read": ["a"], "append": ["a"], "legal_hold": ["legal"], "ack": ["group:x", "a"]},
        {"read": ["alice"], "append": ["alice", "group:readers"]},
    ]
    for authorization in cases:
        document = pins()
        document["authorization"] = authorization
        parsed = parse_pins(document)
        in_sql = await db.fetchval("SELECT wfs_seen_by($1::jsonb)", json.dumps(parsed.stored()))
        assert list(in_sql) == seen_by(parsed.authorization), authorization
    assert (await api.create("r", "written", authorization={"read": ["zed"]})).status == 201
    stored = await db.fetchval("SELECT seen_by FROM wfs_streams WHERE stream_id = 'written'")
    written = parse_pins(pins(authorization={"read": ["zed"]}))
    assert list(stored) == seen_by(written.authorization) and "zed" in stored


async def test_errors_say_what_to_fix(api: StreamsApi, aiohttp_client: Any, database_url: str) -> None:
    assert (await api.create("run-e", "s")).status == 201
    typo = await api.client.get(api.url("run-e", "s", "/records") + "?afer=1", headers=ALICE)
    problem = await typo.json()
    assert typo.status == 400 and problem["field"] == "afer", problem
    assert "after" in problem["detail"]
    assert (await api.client.get(api.url("run-e", "s") + "?verbose=1", headers=ALICE)).status == 400
    # a browser's subscription authenticates by its query token, and then hears what is wrong
    url = api.url("run-e", "s", "/subscribe") + "?access_token=tok-alice&verbose=1"
    browser = await api.client.get(url)
    assert browser.status == 400 and (await browser.json())["field"] == "verbose"
    assert (await api.client.get(api.url("run-e", "s", "/subscribe") + "?verbose=1")).status == 401

    conflict = await api.create("run-e", "s", credit={"max_unread_items": 5}, retention={"max_records": 3})
    problem = await conflict.json()
    assert conflict.status == 409 and problem["code"] == "pins_conflict"
    assert problem["differing_fields"] == ["credit/max_unread_items", "retention/max_records"]

    small = StreamsApi(await aiohttp_client(create_app(make_settings(database_url, max_request_bytes=1024))))
    large = await small.append("run-e", "s", "x" * 5000)
    problem = await large.json()
    assert large.status == 413 and problem["limit_bytes"] == 1024 and "1024 bytes" in problem["detail"]
