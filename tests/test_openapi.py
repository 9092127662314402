"""The served OpenAPI document matches the router, and schemathesis finds no 5xx against it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from tests.conftest import create_database
from tests.minio import ACCESS_KEY, SECRET_KEY, MinioServer
from tests.replica import Replica
from tests.support import ALICE, BOB, EVE, StreamsApi, pins
from workflow_streams import API_PREFIX
from workflow_streams.adapters.objectstore import RegionConfig
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.shells.compose import create_app


async def test_document_lists_exactly_the_routes(aiohttp_client: Any, database_url: str, settings_for: Any) -> None:
    app = create_app(settings_for(database_url))
    client = await aiohttp_client(app)
    resp = await client.get(f"{API_PREFIX}/openapi.json")
    assert resp.status == 200
    document = await resp.json()
    documented = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops}
    routed = set()
    for route in app.router.routes():  # the API's, under its prefix (the Durable Streams sub-app has its own)
        canonical = route.resource.canonical if route.resource else ""
        path = canonical.removeprefix(API_PREFIX)
        if path != canonical and route.method != "HEAD" and path != "/openapi.json":
            routed.add((route.method, path))
    assert documented == routed


async def served_document(
    aiohttp_client: Any, database_url: str, settings_for: Any
) -> tuple[StreamsApi, dict[str, Any]]:
    api = StreamsApi(await aiohttp_client(create_app(settings_for(database_url))))
    resp = await api.client.get(f"{API_PREFIX}/openapi.json")
    assert resp.status == 200
    return api, await resp.json()


async def test_served_document_is_valid_openapi(aiohttp_client: Any, database_url: str, settings_for: Any) -> None:
    _, document = await served_document(aiohttp_client, database_url, settings_for)
    assert document["openapi"] == "3.1.0"
    validate(document)
    # the validator reads the schemas too: 3.1's type lists are not 3.0.3 (the old document's mistake)
    with pytest.raises(OpenAPIValidationError):
        validate({**document, "openapi": "3.0.3"})


async def test_every_operation_is_described(aiohttp_client: Any, database_url: str, settings_for: Any) -> None:
    _, document = await served_document(aiohttp_client, database_url, settings_for)
    tags = {tag["name"] for tag in document["tags"]}
    operations = {(method, path): op for path, ops in document["paths"].items() for method, op in ops.items()}
    ids = [op["operationId"] for op in operations.values()]
    assert len(ids) == len(set(ids)), "operationIds are unique"
    for (method, path), op in operations.items():
        assert op["summary"] and op["description"] and set(op["tags"]) <= tags, (method, path)
        codes = documented_codes(op)
        assert {"unauthenticated", "database_unavailable"} <= set(codes), (method, path)
        for status, response in op["responses"].items():
            if status.startswith(("4", "5")):
                assert "application/problem+json" in response["content"], (method, path, status)
            if status in ("429", "503"):
                assert "Retry-After" in response["headers"], (method, path, status)
        if "requestBody" in op and "application/json" in op["requestBody"]["content"]:
            assert {"invalid_json", "payload_too_large", "request_timeout"} <= set(codes), (method, path)

    def params(method: str, path: str) -> set[tuple[str, str]]:
        return {(p["in"], p["name"]) for p in operations[method, path]["parameters"]}

    stream = "/runs/{run_id}/streams/{stream_id}"
    subscribe = operations["get", stream + "/subscribe"]
    assert {("query", "after"), ("query", "access_token"), ("header", "Last-Event-ID")} <= params(
        "get", stream + "/subscribe"
    )
    assert set(subscribe["responses"]["200"]["content"]["text/event-stream"]["x-sse-events"]) == {
        "record",
        "close",
        "error",
        "heartbeat",
    }
    assert ("header", "Idempotency-Key") in params("post", stream + "/records")
    assert "Idempotent-Replayed" in operations["post", stream + "/records"]["responses"]["200"]["headers"]
    assert "Location" in operations["post", "/runs/{run_id}/streams"]["responses"]["201"]["headers"]
    assert {("query", "after"), ("query", "limit")} <= params("get", "/runs/{run_id}/streams")


def documented_codes(operation: dict[str, Any]) -> dict[str, int]:
    """The problem codes an operation documents, with their statuses."""
    out = {}
    for status, response in operation["responses"].items():
        schema = response.get("content", {}).get("application/problem+json", {}).get("schema")
        if schema is not None:
            out.update({code: int(status) for code in schema["allOf"][1]["properties"]["code"]["enum"]})
    return out


def operation_for(document: dict[str, Any], method: str, url: str) -> dict[str, Any]:
    path = url.removeprefix(API_PREFIX).split("?")[0]
    for template, ops in document["paths"].items():
        if re.fullmatch(re.sub(r"\{[a-z_]+\}", "[^/]+", template), path) and method.lower() in ops:
            return dict(ops[method.lower()])
    raise AssertionError(f"{method} {path} is not documented")


async def test_answered_problem_codes_are_documented(aiohttp_client: Any, database_url: str, settings_for: Any) -> None:
    """Real failures of each operation answer a (status, code) its entry in the document lists."""
    api, document = await served_document(aiohttp_client, database_url, settings_for)
    await api.create("r", "s")
    await api.create("r", "closed")
    await api.close("r", "closed")
    await api.append("r", "s", 1, 2)
    await api.ack("r", "s", "c1", 2)
    s = api.url("r", "s")
    json_headers = {**ALICE, "Content-Type": "application/json"}
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", api.url("r"), {"json": {"stream_id": "s", "pins": pins(schema_ref="other/v2")}}),
        ("POST", api.url("r"), {"json": {"stream_id": "x", "pins": pins(content_class="raw_model_reasoning")}}),
        ("POST", api.url("r"), {"json": {"stream_id": "x", "pins": {}}}),
        ("POST", api.url("r"), {"data": b'{"stream_id": NaN}', "headers": json_headers}),
        ("GET", api.url("r") + "?limit=0", {}),
        ("GET", api.url("r"), {"headers": {}}),
        ("GET", s, {"headers": EVE}),
        ("POST", s + "/records", {"data": b'{"data": "\\ud800"}', "headers": json_headers}),
        ("POST", api.url("r", "closed", "/records"), {"json": {"data": 1}}),
        ("POST", s + "/records", {"json": {"data": "y" * 70_000}}),
        ("GET", s + "/records?after=9", {}),
        ("GET", s + "/subscribe?after=9", {}),
        ("GET", s + "/subscribe?access_token=nope", {"headers": {}}),
        ("POST", s + "/consumers/c1/ack", {"json": {"sequence": 1}}),
        ("POST", s + "/consumers/c1/ack", {"json": {"sequence": 7}}),
        ("POST", api.url("r", "closed", "/consumers/c1/ack"), {"json": {"sequence": 0}}),
        ("POST", s + "/close", {"headers": BOB}),
        ("PUT", s + "/legal-hold", {"json": {"enabled": True, "reason": ""}}),
        ("GET", s + "/deliveries", {}),
        ("POST", s + "/deliveries/requeue", {}),
        ("POST", s + "/objects/prepare", {"json": {"idempotency_key": "k", "sha256": "0" * 64, "size": 1}}),
        ("GET", s + "/objects/00000000-0000-0000-0000-000000000000", {}),
        ("GET", s + "/records/1/object", {}),
        ("GET", s + "/records/9/object", {}),
        ("GET", s + "/records/0/object", {}),
        ("GET", s + "/records/1/object", {"headers": EVE}),
        ("POST", s + "/objects/00000000-0000-0000-0000-000000000000/abort", {}),
    ]
    for method, url, kwargs in cases:
        kwargs.setdefault("headers", ALICE)
        resp = await api.client.request(method, url, **kwargs)
        body = await resp.json(content_type=None)
        assert resp.status >= 400 and resp.content_type == "application/problem+json", (method, url, body)
        documented = documented_codes(operation_for(document, method, url))
        assert documented.get(body["code"]) == resp.status, (method, url, resp.status, body["code"], documented)


@pytest.fixture(scope="module")
def served(pg: LocalPostgres, minio: MinioServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server process, with an object store, and one stream r/s to aim at."""
    database_url = asyncio.run(create_database(pg))
    region = RegionConfig(minio.endpoint, "wfs-openapi", ACCESS_KEY, SECRET_KEY, create_bucket=True)
    replica = Replica(
        database_url,
        Path(tmp_path_factory.mktemp("openapi")) / "replica.log",
        WFS_REGION="eu-west-1",
        WFS_TOKENS='{"tok-alice": "alice"}',
        WFS_S3_REGIONS=json.dumps({"eu-west-1": dataclasses.asdict(region)}),
    )

    async def prepare() -> None:
        async with aiohttp.ClientSession() as session:
            await replica.ready(session)
            body = {"stream_id": "s", "pins": pins()}
            async with session.post(f"{replica.base}{API_PREFIX}/runs/r/streams", json=body, headers=ALICE) as r:
                assert r.status == 201
            async with session.post(
                f"{replica.base}{API_PREFIX}/runs/r/streams/s/records", json={"data": 1}, headers=ALICE
            ) as r:
                assert r.status == 201

    asyncio.run(prepare())
    yield replica.base
    replica.stop()


@pytest.mark.slow
def test_schemathesis_finds_no_server_errors(served: str) -> None:
    """Schemathesis, driven by the served document, sends valid and invalid requests of every
    operation; whatever it sends, the answer is never a 5xx."""
    schemathesis_cli = Path(sys.executable).parent / "schemathesis"
    result = subprocess.run(
        [
            str(schemathesis_cli),
            "run",
            f"{served}{API_PREFIX}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "40",
            "--seed",
            "476",
            "--header",
            f"Authorization: {ALICE['Authorization']}",
            "--suppress-health-check",
            "all",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    generated = re.search(r"(\d+) generated", result.stdout)
    assert generated and int(generated[1]) > 500, "schemathesis must actually have exercised the API"
