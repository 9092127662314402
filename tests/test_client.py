"""The Python client and the CLI against the real data plane."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml

from tests.controlplane import ControlPlane
from tests.replica import Replica
from tests.support import pins
from tests.test_operator import apply, stream_manifest
from workflow_streams.client import BackpressureError, CursorExpiredError, ProblemError, StreamsClient
from workflow_streams.store.retention import prune_stream

pytestmark = pytest.mark.slow


@pytest.fixture
async def replica(database_url: str, tmp_path: Path) -> Any:
    server = Replica(database_url, tmp_path / "replica.log", WFS_REGION="eu-west-1")
    async with aiohttp.ClientSession() as session:
        await server.ready(session)
    yield server
    server.stop()


async def test_subscribe_survives_a_server_restart(database_url: str, replica: Replica, tmp_path: Path) -> None:
    async with StreamsClient(replica.base, "tok-alice", max_wait=60) as client:
        await client.create_stream("run", "s", pins())
        total = 200
        received: list[int] = []

        async def follow() -> None:
            async for record in client.subscribe("run", "s", after=0):
                received.append(record.data)
                if len(received) == total:
                    return

        follower = asyncio.create_task(follow())
        current = replica
        for value in range(1, total + 1):
            await client.append("run", "s", value)
            if value == total // 2:
                current.stop()  # the subscription drops with the server; down until the next one is ready
                current = Replica(database_url, tmp_path / "replica.log", port=replica.port, WFS_REGION="eu-west-1")
                async with aiohttp.ClientSession() as session:
                    await current.ready(session)
        await asyncio.wait_for(follower, 60)
        current.stop()
    assert received == list(range(1, total + 1)), "no loss, no duplicate across the restart"


async def test_backpressure_is_honoured(replica: Replica) -> None:
    told_to_wait: list[tuple[float, str]] = []

    async def retry_wait(seconds: float, reason: str) -> None:
        # the client's own wait between retries: note what the server said, then free credit once
        told_to_wait.append((seconds, reason))
        if len(told_to_wait) == 1:
            await client.ack("run", "bp", "consumer", 2)

    async with StreamsClient(replica.base, "tok-alice", max_wait=30, retry_wait=retry_wait) as client:
        await client.create_stream("run", "bp", pins(credit={"max_unread_items": 2, "max_unread_bytes": 10_000}))
        await client.append("run", "bp", 1, 2)
        result = await client.append("run", "bp", 3)  # 429 + Retry-After until the ack lands
        assert result.sequences == [3]
    # refused first, and the wait was the server's Retry-After, not the client's own back-off
    assert len(told_to_wait) == 1, told_to_wait
    seconds, reason = told_to_wait[0]
    assert "429 backpressure" in reason, reason
    assert seconds == 1.0  # Retry-After as the server sent it

    async with StreamsClient(replica.base, "tok-alice", max_wait=1.5) as impatient:
        await impatient.append("run", "bp", 4)
        with pytest.raises(BackpressureError) as raised:
            await impatient.append("run", "bp", 5)
        assert raised.value.retry_after == 1.0
        page = await impatient.read("run", "bp")
        assert [r.data for r in page.records] == [1, 2, 3, 4], "nothing appended twice or behind our back"


async def test_410_is_a_typed_error(replica: Replica, database_url: str) -> None:
    async with StreamsClient(replica.base, "tok-alice") as client:
        await client.create_stream("run", "short", pins(retention={"max_records": 2}))
        await client.append("run", "short", *range(5))
        conn = await asyncpg.connect(database_url)
        try:
            await prune_stream(conn, "run", "short")
        finally:
            await conn.close()
        with pytest.raises(CursorExpiredError) as raised:
            await client.read("run", "short", after=0)
        assert (raised.value.earliest, raised.value.latest, raised.value.requested) == (4, 5, 1)
        with pytest.raises(CursorExpiredError):
            async for _ in client.subscribe("run", "short", after=1):
                pass
        tail = [r.sequence async for r in client.iter_records("run", "short", after=raised.value.earliest - 1)]
        assert tail == [4, 5], "resync from earliest works"


async def test_object_upload_from_a_file(database_url: str, tmp_path: Path, s3_regions: Any) -> None:
    regions = {name: dataclasses.asdict(cfg) for name, cfg in s3_regions.items()}
    server = Replica(database_url, tmp_path / "objects.log", WFS_REGION="eu-west-1", WFS_S3_REGIONS=json.dumps(regions))
    path = tmp_path / "blob.bin"
    data = os.urandom(7 * 1024 * 1024 + 5)
    path.write_bytes(data)
    try:
        async with aiohttp.ClientSession() as session:
            await server.ready(session)
        async with StreamsClient(server.base, "tok-alice") as client:
            await client.create_stream("run", "obj", pins())
            progress: list[int] = []
            sequence = await client.upload_object("run", "obj", path, progress=progress.append)
            assert progress[-1] == len(data) and len(progress) > 10, "progress while streaming the file"
            assert await client.upload_object("run", "obj", path) == sequence, "an idempotent re-upload"
            (record,) = (await client.read("run", "obj")).records
            assert record.kind == "object" and record.object is not None
            assert record.object["sha256"] == hashlib.sha256(data).hexdigest()
            assert await client.read_object("run", "obj", sequence) == data
            seen: list[tuple[int, int]] = []
            copy = tmp_path / "copy.bin"
            info = await client.save_object(
                "run", "obj", sequence, copy, progress=lambda n, size: seen.append((n, size))
            )
            assert copy.read_bytes() == data and seen[-1] == (len(data), len(data))
            assert (info.size, info.sha256) == (len(data), hashlib.sha256(data).hexdigest())
            await client.append("run", "obj", {"inline": True})
            with pytest.raises(ProblemError) as inline:
                await client.read_object("run", "obj", sequence + 1)
            assert (inline.value.status, inline.value.code) == (409, "not_an_object")
        env = {"WFS_URL": server.base, "WFS_TOKEN": "tok-alice"}
        other = tmp_path / "other.bin"
        other.write_bytes(b"x" * 300_000)
        uploaded = await asyncio.to_thread(cli, "append", "run", "obj", "--file", str(other), "--json", env=env)
        assert uploaded.returncode == 0, uploaded.stderr
        assert json.loads(uploaded.stdout) == {"sequences": [3]}
    finally:
        server.stop()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workflow_streams", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


async def test_cli_append_tail_ack(replica: Replica) -> None:
    env = {"WFS_URL": replica.base, "WFS_TOKEN": "tok-alice"}
    async with StreamsClient(replica.base, "tok-alice") as client:
        await client.create_stream("run", "cli", pins())
    appended = await asyncio.to_thread(cli, "append", "run", "cli", '{"a": 1}', '"two"', "3", "--json", env=env)
    assert appended.returncode == 0, appended.stderr
    assert json.loads(appended.stdout)["sequences"] == [1, 2, 3]
    tailed = await asyncio.to_thread(cli, "tail", "run", "cli", "--after", "1", "--count", "2", env=env)
    assert tailed.returncode == 0, tailed.stderr
    lines = [json.loads(line) for line in tailed.stdout.splitlines()]
    assert [(r["sequence"], r["data"]) for r in lines] == [(2, "two"), (3, 3)]
    acked = await asyncio.to_thread(cli, "ack", "run", "cli", "reader", "3", env=env)
    assert acked.returncode == 0, acked.stderr
    regressed = await asyncio.to_thread(cli, "ack", "run", "cli", "reader", "1", env=env)
    assert regressed.returncode == 1 and "ack_regression" in regressed.stderr


def test_cli_hold_and_release(kube: ControlPlane, namespace: str) -> None:
    apply(kube, namespace, stream_manifest("target", "run-cli", "target"))
    env = {"KUBECONFIG": str(kube.kubeconfig)}
    placed = cli(
        "hold",
        "target",
        "-n",
        namespace,
        "--matter",
        "M-9",
        "--reason",
        "audit",
        "--requested-by",
        "legal@example.com",
        "--no-wait",
        env=env,
    )
    assert placed.returncode == 0, placed.stderr
    assert "only requested" in placed.stdout, "without waiting the CLI says the hold is not in place yet"
    # no operator runs here: waiting ends after --timeout, saying the hold is not applied
    waited = cli(
        "hold",
        "target",
        "-n",
        namespace,
        "--matter",
        "M-10",
        "--reason",
        "audit",
        "--requested-by",
        "l@x",
        "--timeout",
        "1",
        env=env,
    )
    assert waited.returncode == 1 and "pending" in waited.stderr and "did not report the hold applied" in waited.stderr
    hold = yaml.safe_load(kube.kubectl("get", "-n", namespace, "wfhold", "target-m-9", "-o", "yaml").stdout)
    assert hold["spec"] == {
        "streamRef": {"name": "target"},
        "matterId": "M-9",
        "reason": "audit",
        "requestedBy": "legal@example.com",
    }
    released = cli("release", "target-m-9", "-n", namespace, "--no-wait", env=env)
    assert released.returncode == 0, released.stderr
    assert "deletion requested" in released.stdout
    assert kube.kubectl("get", "-n", namespace, "wfhold", "target-m-9", check=False).returncode != 0

    # a stream that does not exist: said at once, and nothing is created
    missing = cli(
        "hold", "nosuch", "-n", namespace, "--matter", "M-11", "--reason", "r", "--requested-by", "l@x", env=env
    )
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1, missing.stderr
    assert missing.stderr.startswith("error: not_found: no WorkflowStream 'nosuch'"), missing.stderr
    assert kube.kubectl("get", "-n", namespace, "wfhold", "nosuch-m-11", check=False).returncode != 0
    gone = cli("release", "no-such-hold", "-n", namespace, env=env)
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1, gone.stderr
    assert gone.stderr.startswith("error: not_found: no such hold: streamlegalhold 'no-such-hold'"), gone.stderr
