"""Pins that can evolve: stored pins (tests/fixtures/pins) read, mean what they meant, and compare equal
to themselves re-applied, under today's model and under a model that gained pins."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import asyncpg
import pytest
from pydantic import Field

from tests.support import StreamsApi, problem
from workflow_streams.domain.authz import Trusted
from workflow_streams.domain.errors import PinsConflict
from workflow_streams.domain.pins import (
    VERSION_KEY,
    Credit,
    NewerPinsVersion,
    StreamPins,
    Text,
    document_digest,
    parse_pins,
)
from workflow_streams.store import definitions, streams
from workflow_streams.store.db import create_pool
from workflow_streams_operator.convert import pins_from_spec, spec_from_pins

FIXTURES = Path(__file__).parent / "fixtures" / "pins"
STORED = {str(path.relative_to(FIXTURES)): json.loads(path.read_text()) for path in sorted(FIXTURES.glob("*/*.json"))}
CURRENT = {name: f for name, f in STORED.items() if f["stored"].get(VERSION_KEY) == StreamPins.pins_version}

# the creator of these definitions; who may see them is not what these tests are about
ALICE = Trusted("alice")


# A later release that adds pins with defaults: in domain/pins.py each is the one line marked below.
class FutureCredit(Credit):
    max_record_bytes: int | None = Field(default=None, ge=1, description="Ceiling on one record.")  # the line


class FuturePins(StreamPins):
    credit: FutureCredit  # (only the subclass needs this line; the real change edits Credit itself)
    priority: Literal["normal", "high"] = Field(default="normal", description="Delivery priority.")  # the line


def contains(whole: Any, part: Any) -> bool:
    """Every key of ``part`` is in ``whole`` with the same value (recursively)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(key in whole and contains(whole[key], v) for key, v in part.items())
    return bool(whole == part)


async def store_as_found(db: asyncpg.Connection, run_id: str, stream_id: str, fixture: dict[str, Any]) -> None:
    """The row exactly as the release that wrote the fixture left it."""
    await db.execute(
        "INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by) VALUES ($1, $2, $3, $4, 'old')",
        run_id,
        stream_id,
        json.dumps(fixture["stored"]),
        fixture["pins_digest"],
    )


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, min_size=1, max_size=2)
    yield pool
    await pool.close()


def test_there_are_fixtures_of_the_current_version() -> None:
    assert len(CURRENT) >= 3 and len(STORED) > len(CURRENT)


@pytest.mark.parametrize("name", STORED)
def test_stored_pins_read_as_their_request(name: str) -> None:
    fixture = STORED[name]
    requested = parse_pins(fixture["request"])
    stored = StreamPins.read_stored(fixture["stored"])
    assert stored == requested and stored.digest() == requested.digest()
    assert StreamPins.read_stored(json.dumps(fixture["stored"])) == stored, "text, as a plain connection gives it"
    assert document_digest(fixture["stored"]) == fixture["pins_digest"], "pins_digest addresses the stored document"
    assert parse_pins(pins_from_spec(fixture["spec_pins"])) == stored, "the WorkflowStream spec means the same"
    assert spec_from_pins(fixture["request"]) == fixture["spec_pins"]


@pytest.mark.parametrize("name", CURRENT)
def test_this_release_stores_the_current_fixtures(name: str) -> None:
    """What this release stores holds every fixture value; anything more is a pin added with its default."""
    fixture = CURRENT[name]
    today = parse_pins(fixture["request"]).stored()
    assert contains(today, fixture["stored"]), "the stored form changed: see tests/fixtures/pins/README.md"


@pytest.mark.parametrize("name", STORED)
async def test_stored_pins_compare_equal_to_themselves_re_applied(
    name: str, api: StreamsApi, db: asyncpg.Connection
) -> None:
    fixture = STORED[name]
    await store_as_found(db, "run-old", "s", fixture)
    again = await api.client.post(
        api.url("run-old"), json={"stream_id": "s", "pins": fixture["request"]}, headers=api.headers
    )
    assert again.status == 200, await again.text()
    body = await again.json()
    assert body["pins"] == parse_pins(fixture["request"]).canonical()
    assert body["pins_digest"] == fixture["pins_digest"] and body["created_by"] == "old"

    changed = copy.deepcopy(fixture["request"])
    changed["credit"]["max_unread_items"] += 1
    conflict = await api.client.post(api.url("run-old"), json={"stream_id": "s", "pins": changed}, headers=api.headers)
    await problem(conflict, 409, "pins_conflict")
    row = await db.fetchrow("SELECT pins, pins_digest FROM wfs_streams WHERE run_id = 'run-old'")
    assert json.loads(row["pins"]) == fixture["stored"] and row["pins_digest"] == fixture["pins_digest"]


@pytest.mark.parametrize("name", STORED)
def test_a_model_with_added_pins_reads_every_stored_fixture(name: str) -> None:
    fixture = STORED[name]
    future = FuturePins.read_stored(fixture["stored"])
    assert future.priority == "normal" and future.credit.max_record_bytes is None, "missing pins take defaults"
    assert future == FuturePins.model_validate(fixture["request"])
    # the old comparison (today's canonical digest against the stored one) would call this a conflict
    assert future.digest() != fixture["pins_digest"]


@pytest.mark.parametrize("name", STORED)
async def test_a_pin_added_with_a_default_breaks_no_stored_stream(
    name: str, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    fixture = STORED[name]
    await store_as_found(db, "run-old", "s", fixture)
    async with pool.acquire() as conn:
        definition, created = await definitions.create_definition(
            conn, "run-old", "s", FuturePins.model_validate(fixture["request"]), ALICE
        )
        assert not created and definition.pins_digest == fixture["pins_digest"]
        with pytest.raises(PinsConflict):
            await definitions.create_definition(
                conn, "run-old", "s", FuturePins.model_validate({**fixture["request"], "priority": "high"}), ALICE
            )
        # and a stream the later release creates stores its pins in full
        await definitions.create_definition(conn, "run-new", "s", FuturePins.model_validate(fixture["request"]), ALICE)
    stored = json.loads(await db.fetchval("SELECT pins FROM wfs_streams WHERE run_id = 'run-new'"))
    assert stored["priority"] == "normal" and stored["credit"]["max_record_bytes"] is None


@pytest.mark.parametrize("name", CURRENT)
def test_pins_a_later_release_stored_are_read_without_its_additions(name: str) -> None:
    """After a rollback, pins this release does not know are ignored, not an error on every read."""
    fixture = CURRENT[name]
    later = FuturePins.model_validate({**fixture["request"], "priority": "high"}).stored()
    assert "max_record_bytes" in later["credit"]
    assert StreamPins.read_stored(later) == parse_pins(fixture["request"])


class TenantPins(StreamPins):
    """A later release with a pin old documents lack and that has no default: a version bump and an upgrade."""

    pins_version = 2
    pins_upgrades = {1: lambda document: {**document, "tenant": "shared"}}
    tenant: Text = Field(description="The tenant the stream belongs to.")


@pytest.mark.parametrize("name", STORED)
def test_a_version_bump_upgrades_older_documents(name: str) -> None:
    fixture = STORED[name]
    upgraded = TenantPins.read_stored(fixture["stored"])
    assert upgraded.tenant == "shared"
    assert upgraded == TenantPins.model_validate({**fixture["request"], "tenant": "shared"})
    assert upgraded.stored()[VERSION_KEY] == 2
    assert TenantPins.read_stored(upgraded.stored()) == upgraded
    with pytest.raises(NewerPinsVersion):
        StreamPins.read_stored(upgraded.stored())  # this release cannot know what version 2 means


@pytest.mark.parametrize("version", [99, 0, "1", None])
def test_versions_this_release_cannot_read_are_refused(version: Any) -> None:
    document = {**next(iter(CURRENT.values()))["stored"], VERSION_KEY: version}
    with pytest.raises(NewerPinsVersion):
        StreamPins.read_stored(document)


def test_pins_are_parsed_once_per_stored_document() -> None:
    """Every stream row read maps its pins through row_pins: a cache hit is one dict lookup."""
    fixture = STORED["unversioned/minimal.json"]
    row = {"pins_digest": fixture["pins_digest"], "pins": fixture["stored"]}
    first = streams.row_pins(row)
    assert streams.row_pins({**row, "pins": None}) is first
