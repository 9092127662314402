"""Placement pins enforced by the data plane: client egress, metadata home, payload logs."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import pytest

from tests.support import StreamsApi, problem
from workflow_streams.domain.pins import parse_pins
from workflow_streams.domain.placement import client_region
from workflow_streams.domain.redaction import loggable_payload
from workflow_streams.shells.compose import create_app


async def make_api(aiohttp_client: Any, database_url: str, settings_for: Any, **overrides: Any) -> StreamsApi:
    return StreamsApi(await aiohttp_client(create_app(settings_for(database_url, **overrides))))


async def test_reads_from_outside_the_egress_regions_are_refused(
    aiohttp_client: Any, database_url: str, settings_for: Any
) -> None:
    # the test client connects from 127.0.0.1, which this data plane maps to us-east-1
    api = await make_api(aiohttp_client, database_url, settings_for, region_cidrs={"us-east-1": ["127.0.0.0/8"]})
    await api.create("r", "eu-only")
    await api.create("r", "global", placement={"client_egress_regions": ["eu-west-1", "us-east-1"]})
    for stream in ("eu-only", "global"):
        assert (await api.append("r", stream, 1)).status == 201
    body = await problem(await api.read("r", "eu-only"), 403, "placement_violation")
    assert body["client_region"] == "us-east-1"
    resp = await api.client.get(api.url("r", "eu-only", "/subscribe"), headers=api.headers)
    await problem(resp, 403, "placement_violation")
    assert (await api.read("r", "global")).status == 200


async def test_forwarded_for_counts_only_through_trusted_proxies(
    aiohttp_client: Any, database_url: str, settings_for: Any
) -> None:
    cidrs = {"us-east-1": ["203.0.113.0/24"]}
    trusting = await make_api(
        aiohttp_client, database_url, settings_for, region_cidrs=cidrs, trusted_proxies=["127.0.0.0/8"]
    )
    await trusting.create("r", "s")
    far = {**trusting.headers, "X-Forwarded-For": "203.0.113.9, 10.0.0.1"}
    resp = await trusting.client.get(trusting.url("r", "s", "/records"), headers=far)
    await problem(resp, 403, "placement_violation")
    assert client_region("127.0.0.1", "203.0.113.9", cidrs, [], "eu-west-1") == "eu-west-1", "untrusted: ignored"


async def test_metadata_only_in_its_home(
    aiohttp_client: Any, database_url: str, settings_for: Any, db: asyncpg.Connection
) -> None:
    api = await make_api(aiohttp_client, database_url, settings_for, metadata_region="eu-west-1")
    assert (await api.create("r", "home")).status == 201
    body = await problem(
        await api.create("r", "away", placement={"metadata_home": "us-east-1"}), 403, "placement_violation"
    )
    assert body["metadata_home"] == "us-east-1"
    assert await db.fetchval("SELECT count(*) FROM wfs_streams") == 1


@pytest.fixture
def payload_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="workflow_streams.payload")
    return caplog


async def test_payload_logs_follow_the_log_region(
    aiohttp_client: Any, database_url: str, settings_for: Any, payload_logs: pytest.LogCaptureFixture
) -> None:
    api = await make_api(aiohttp_client, database_url, settings_for)  # runs in eu-west-1
    await api.create("r", "local-logs")
    await api.create(
        "r",
        "masked",
        placement={"log_region": "eu-central-1"},
        redaction={"strategy": "mask_fields", "fields": ["/user/email"]},
    )
    await api.create("r", "dropped", placement={"log_region": "eu-central-1"})
    secret = {"user": {"email": "ada@example.com", "name": "Ada"}}
    for stream in ("local-logs", "masked", "dropped"):
        await api.append("r", stream, secret)
    lines = {
        stream: next(r.getMessage() for r in payload_logs.records if f"r/{stream}/1" in r.getMessage())
        for stream in ("local-logs", "masked", "dropped")
    }
    assert "ada@example.com" in lines["local-logs"], "in its log region the payload may be logged"
    assert "ada@example.com" not in lines["masked"] and '"name": "Ada"' in lines["masked"]
    assert "Ada" not in lines["dropped"] and "redacted" in lines["dropped"]
    assert all(not hasattr(r, "wfs_payload") for r in payload_logs.records)


@pytest.mark.unit
def test_masking_rules() -> None:
    pins = parse_pins(
        {
            "direction": "output",
            "content_class": "model_output",
            "schema_ref": "s",
            "placement": {
                "metadata_home": "a",
                "object_regions": ["a"],
                "client_egress_regions": ["a"],
                "log_region": "b",
            },
            "redaction": {"strategy": "mask_fields", "fields": ["/a/0/k", "/missing/x", "/t~1u"]},
            "authorization": {},
            "credit": {"max_unread_items": 1, "max_unread_bytes": 1},
        }
    )
    shown = loggable_payload(pins, b'{"a": [{"k": 1, "j": 2}], "t/u": 3}', "application/json", "a")
    assert shown == '{"a": [{"k": "***", "j": 2}], "t/u": "***"}'
    assert loggable_payload(pins, b"\x00\x01", "application/octet-stream", "a") == "<redacted 2 bytes>"
    assert loggable_payload(pins, b"plain", "text/plain", "b") == "plain"
