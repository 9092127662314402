"""The server's memory stays bounded while 32 MiB objects upload concurrently (a real server process)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.replica import Replica
from tests.support import ALICE, pins
from workflow_streams import API_PREFIX
from workflow_streams.domain.objects import MAX_OBJECT_BYTES

pytestmark = pytest.mark.slow

UPLOADS = 4


async def test_concurrent_32_mib_uploads_keep_memory_bounded(
    database_url: str, s3_regions: Any, tmp_path: Path
) -> None:
    regions = {name: dataclasses.asdict(cfg) for name, cfg in s3_regions.items()}
    replica = Replica(database_url, tmp_path / "replica.log", WFS_S3_REGIONS=json.dumps(regions))
    base = f"{replica.base}{API_PREFIX}/runs/r/streams/s"
    data = os.urandom(MAX_OBJECT_BYTES)
    digest = hashlib.sha256(data).hexdigest()
    try:
        async with aiohttp.ClientSession() as session:
            await replica.ready(session)
            body = {"stream_id": "s", "pins": pins()}
            async with session.post(f"{replica.base}{API_PREFIX}/runs/r/streams", json=body, headers=ALICE) as r:
                assert r.status == 201

            async def upload(i: int) -> None:
                prepare = {"idempotency_key": f"u{i}", "sha256": digest, "size": len(data)}
                async with session.post(f"{base}/objects/prepare", json=prepare, headers=ALICE) as r:
                    intent = await r.json()
                headers = {**ALICE, "Content-Type": "application/octet-stream"}
                url = f"{base}/objects/{intent['intent_id']}/upload"
                async with session.put(url, data=io.BytesIO(data), headers=headers) as r:
                    assert r.status == 200, await r.text()
                async with session.post(f"{base}/objects/{intent['intent_id']}/commit", headers=ALICE) as r:
                    assert r.status == 201, await r.text()

            await upload(-1)  # warm up: imports, pools, S3 clients
            baseline = replica.rss_bytes()
            peak = baseline
            sampling = True

            async def sample() -> None:
                nonlocal peak
                while sampling:
                    peak = max(peak, replica.rss_bytes())
                    await asyncio.sleep(0.02)

            sampler = asyncio.create_task(sample())
            await asyncio.gather(*(upload(i) for i in range(UPLOADS)))
            sampling = False
            await sampler
    finally:
        replica.stop()
    growth = peak - baseline
    print(f"RSS baseline {baseline >> 20} MiB, peak {peak >> 20} MiB, growth {growth >> 20} MiB")
    # holding the bodies would need UPLOADS * 32 MiB = 128 MiB; streaming needs about a part per upload
    assert growth < UPLOADS * MAX_OBJECT_BYTES / 2, f"server grew by {growth >> 20} MiB"
