"""`workflow-streams dev`: the whole product on one machine, driven from the outside as a user would."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.devproc import DevProcess
from tests.support import pins
from tests.waiting import eventually
from tests.waitservice import WaitService
from workflow_streams.local.kube import binaries_present
from workflow_streams.local.minio import minio_binary

pytestmark = pytest.mark.slow
# this test drives processes from the outside on purpose
# ruff: noqa: ASYNC240


def dev_pins(**overrides: Any) -> dict[str, Any]:
    everything = ["dev"]
    rights = {k: everything for k in ("append", "read", "ack", "close", "legal_hold")}
    return pins(authorization=rights, **overrides)


async def eventually_json(session: aiohttp.ClientSession, url: str, headers: dict[str, str], check: Any) -> Any:
    last: list[Any] = []

    async def checked() -> Any:
        async with session.get(url, headers=headers) as resp:
            last[:] = [await resp.json()]
        return last[0] if check(last[0]) else None

    try:
        return await eventually(checked, within=60, interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer: {last}") from None


async def test_dev_is_the_whole_product(tmp_path: Path) -> None:
    if minio_binary() is None:
        pytest.fail("MinIO is not built: scripts/bootstrap builds it")
    dev = DevProcess(tmp_path, WFS_SSE_HEARTBEAT_SECONDS="1")
    try:
        await asyncio.to_thread(dev.wait_ready)
        output = dev.output()
        assert re.search(r"objects +MinIO at http://127\.0\.0\.1:\d+, bucket wfs-dev for region eu-west-1", output)
        assert re.search(r"delivery +input records go to the built-in wait service", output)
        headers = {"Authorization": "Bearer dev-secret"}
        async with aiohttp.ClientSession() as session:
            create = {"stream_id": "files", "pins": dev_pins()}
            async with session.post(f"{dev.base}/runs/r/streams", json=create, headers=headers) as resp:
                assert resp.status == 201, await resp.text()
            # objects: prepare -> upload -> commit on dev's MinIO
            data = os.urandom(200_000)
            stream = f"{dev.base}/runs/r/streams/files"
            prepare = {"idempotency_key": "k", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            async with session.post(f"{stream}/objects/prepare", json=prepare, headers=headers) as resp:
                assert resp.status == 201, await resp.text()
                intent = (await resp.json())["intent_id"]
            upload_headers = {**headers, "Content-Type": "application/octet-stream"}
            async with session.put(f"{stream}/objects/{intent}/upload", data=data, headers=upload_headers) as resp:
                assert resp.status == 200, await resp.text()
            async with session.post(f"{stream}/objects/{intent}/commit", headers=headers) as resp:
                assert resp.status == 201, await resp.text()
            async with session.get(f"{stream}/records", headers=headers) as resp:
                (record,) = (await resp.json())["records"]
                assert record["object"]["size"] == len(data)

            # input delivery to the built-in wait service
            create = {"stream_id": "answers", "pins": dev_pins(direction="input", content_class="user_input")}
            async with session.post(f"{dev.base}/runs/r/streams", json=create, headers=headers) as resp:
                assert resp.status == 201, await resp.text()
            answers = f"{dev.base}/runs/r/streams/answers"
            async with session.post(f"{answers}/records", json={"data": {"answer": "yes"}}, headers=headers) as resp:
                assert resp.status == 201
            await eventually_json(session, f"{answers}/deliveries", headers, lambda b: b["counts"]["delivered"] == 1)
        dev.wait_for_output(r"wait service: received r/answers #1 \(event [0-9a-f-]+\): \{\"answer\": \"yes\"\}")
        # one access-log line per request, with the principal; a 401 is visible too
        dev.wait_for_output(
            r"POST /api/workflow-streams/runs/r/streams/files/objects/[0-9a-f-]+/commit 201 [\d.]+ms dev"
        )
    finally:
        assert dev.stop() == 0
    assert "Traceback" not in dev.output()
    data_dir = re.search(r"data in (\S+)\)", dev.output())
    assert data_dir and not Path(data_dir[1]).exists(), "the throwaway Postgres is removed on exit"


async def test_objects_say_minio_is_being_built_then_turn_on(tmp_path: Path) -> None:
    """A first run: MinIO still builds in the background. Uploads say so (not "no object store
    configured"), and objects turn on by themselves once the binary is there."""
    binary = minio_binary()
    if binary is None:
        pytest.fail("MinIO is not built: scripts/bootstrap builds it")
    cache = tmp_path / "fresh-cache"  # a fresh machine's tool cache: no MinIO in it yet
    build_log = tmp_path / "minio-build.log"
    dev = DevProcess(tmp_path, WFS_CACHE=str(cache), WFS_DEV_MINIO_BUILD_LOG=str(build_log))
    try:
        await asyncio.to_thread(dev.wait_ready)
        assert "waiting for MinIO's one-time build" in dev.output()
        headers = {"Authorization": "Bearer dev-secret"}
        data = os.urandom(100_000)
        prepare = {"idempotency_key": "k", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        stream = f"{dev.base}/runs/r/streams/files"
        async with aiohttp.ClientSession() as session:
            create = {"stream_id": "files", "pins": dev_pins()}
            async with session.post(f"{dev.base}/runs/r/streams", json=create, headers=headers) as resp:
                assert resp.status == 201, await resp.text()
            async with session.post(f"{stream}/objects/prepare", json=prepare, headers=headers) as resp:
                body = await resp.json(content_type=None)
            assert resp.status == 421 and body["code"] == "object_region_unavailable", body
            assert "MinIO is still being built" in body["detail"] and str(build_log) in body["detail"], body

            (cache / "bin").mkdir(parents=True)
            (cache / "bin" / "minio").symlink_to(binary)  # the background build is done

            async def prepared() -> bool:
                try:
                    async with session.post(f"{stream}/objects/prepare", json=prepare, headers=headers) as resp:
                        return resp.status == 201
                except aiohttp.ClientConnectionError:  # the data plane restarts with its object store
                    return False

            await eventually(prepared, within=60, interval=0.2, message="objects never turned on")
        dev.wait_for_output(r"objects: ready, MinIO at http://127\.0\.0\.1:\d+")
    finally:
        assert dev.stop() == 0


async def test_wfs_settings_override_dev_defaults(tmp_path: Path) -> None:
    wait = WaitService()
    await wait.start()
    dev = DevProcess(tmp_path, WFS_WAIT_SERVICE_URL=wait.url, WFS_TOKENS=json.dumps({"tok-ops": "ops"}))
    try:
        await asyncio.to_thread(dev.wait_ready)
        assert f"input records go to {wait.url}" in dev.output()
        async with aiohttp.ClientSession() as session:
            headers = {"Authorization": "Bearer tok-ops"}  # WFS_TOKENS' token works beside dev's
            body = {
                "stream_id": "in",
                "pins": pins(
                    direction="input", content_class="user_input", authorization={"append": ["ops"], "read": ["ops"]}
                ),
            }
            async with session.post(f"{dev.base}/runs/r/streams", json=body, headers=headers) as resp:
                assert resp.status == 201, await resp.text()
            async with session.post(f"{dev.base}/runs/r/streams/in/records", json={"data": 1}, headers=headers) as resp:
                assert resp.status == 201
        await wait.wait_for(lambda: wait.sequences("r", "in") == [1])
        dev.wait_for_output(r"POST /api/workflow-streams/runs/r/streams/in/records 201 [\d.]+ms ops")
    finally:
        dev.stop()
        await wait.stop()


def test_token_is_stable_and_a_taken_port_is_reported_first(tmp_path: Path) -> None:
    first = DevProcess(tmp_path, token=None)
    try:
        first.wait_ready()
        token = first.token()
        assert (first.data_dir / "token").read_text().strip() == token
        assert (first.data_dir / "token").stat().st_mode & 0o077 == 0, "the token file is private"
        # a second dev on the same port: one line, before anything else is printed or started
        taken = subprocess.run(
            [sys.executable, "-m", "workflow_streams", "dev", "--port", str(first.port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert taken.returncode == 1
        assert taken.stdout == ""
        assert taken.stderr.strip().splitlines() == [
            f"error: port_in_use: 127.0.0.1:{first.port} is already in use (another dev? choose one with --port)"
        ]
    finally:
        first.stop()
    second = DevProcess(tmp_path, token=None)  # the same data directory
    try:
        second.wait_ready()
        assert second.token() == token, "the token survives a restart"
    finally:
        second.stop()


@pytest.mark.skipif(not binaries_present(), reason="etcd/kube-apiserver not built (scripts/bootstrap controlplane)")
async def test_dev_kube_runs_the_operator_and_holds(tmp_path: Path) -> None:
    dev = DevProcess(tmp_path, "--kube")
    try:
        await asyncio.to_thread(dev.wait_ready, 300)
        kubeconfig = dev.data_dir / "kubeconfig"
        assert f"export KUBECONFIG={kubeconfig}" in dev.output()
        manifest = {
            "apiVersion": "workflowstreams.dev/v1alpha1",
            "kind": "WorkflowStream",
            "metadata": {"name": "answers", "namespace": "default"},
            "spec": {
                "runId": "run-k",
                "streamId": "answers",
                "pins": {
                    "direction": "input",
                    "contentClass": "user_input",
                    "schemaRef": "example.com/schemas/answer/v1",
                    "placement": {
                        "metadataHome": "eu-west-1",
                        "objectRegions": ["eu-west-1"],
                        "clientEgressRegions": ["eu-west-1"],
                        "logRegion": "eu-west-1",
                    },
                    "retention": {"maxAgeSeconds": 604800},
                    "authorization": {"append": ["dev"], "read": ["dev"]},
                    "credit": {"maxUnreadItems": 1000, "maxUnreadBytes": 10485760, "policy": "block"},
                },
            },
        }

        def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["kubectl", "--kubeconfig", str(kubeconfig), *args],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=120,
            )

        applied = await asyncio.to_thread(kubectl, "apply", "-f", "-", stdin=yaml.safe_dump(manifest))
        assert applied.returncode == 0, applied.stderr
        ready = await asyncio.to_thread(
            kubectl, "wait", "--for=condition=Ready", "wfs/answers", "-n", "default", "--timeout=120s"
        )
        assert ready.returncode == 0, f"{ready.stderr}\n{dev.output()[-3000:]}"

        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        held = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "workflow_streams",
                "hold",
                "answers",
                "--matter",
                "2026-114",
                "--reason",
                "litigation",
                "--requested-by",
                "legal@example.com",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert held.returncode == 0, held.stderr
        headers = {"Authorization": "Bearer dev-secret"}
        async with aiohttp.ClientSession() as session:
            body = await eventually_json(
                session, f"{dev.base}/runs/run-k/streams/answers", headers, lambda b: b["state"]["legal_hold"]
            )
        assert body["state"]["legal_holds"], body
        operator_log = dev.data_dir / "operator.log"
        assert f"the operator (its log: {operator_log}, kept after exit)" in dev.output(), "dev names the log"
    finally:
        dev.stop()
    assert operator_log.read_text().strip(), "the operator's log outlives dev"
    assert f"the operator's log is kept in {operator_log}" in dev.output()
