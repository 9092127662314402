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

from tests.conftest import create_database
from tests.minio import ACCESS_KEY, SECRET_KEY, MinioServer
from tests.replica import Replica
from tests.support import ALICE, pins
from workflow_streams import API_PREFIX
from workflow_streams.api.app import create_app
from workflow_streams.localpg import LocalPostgres
from workflow_streams.objectstore import RegionConfig


async def test_document_lists_exactly_the_routes(aiohttp_client: Any, database_url: str, settings_for: Any) -> None:
    app = create_app(settings_for(database_url))
    client = await aiohttp_client(app)
    resp = await client.get(f"{API_PREFIX}/openapi.json")
    assert resp.status == 200
    document = await resp.json()
    documented = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops}
    routed = set()
    for resource in app.router.resources():
        info = resource.get_info()
        if "app" in info:  # the API sub-application
            for route in info["app"].router.routes():
                path = route.resource.canonical.removeprefix(API_PREFIX) if route.resource else ""
                if route.method != "HEAD" and path != "/openapi.json":
                    routed.add((route.method, path))
    assert documented == routed


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
