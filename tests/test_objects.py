"""Large objects through HTTP against a real MinIO: lifecycle, mismatches, expiry, retention, legal hold."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import asyncpg
import pytest
from botocore.exceptions import ClientError

from tests.support import ObjectsApi, StreamsApi, problem
from tests.waiting import eventually
from workflow_streams.api.app import create_app

pytestmark = pytest.mark.slow  # MinIO
MiB = 1024 * 1024


@pytest.fixture
async def api(aiohttp_client: Any, database_url: str, settings_for: Any, s3_regions: Any) -> StreamsApi:
    settings = settings_for(
        database_url, s3_regions=s3_regions, janitor_interval_seconds=0.2, prune_interval_seconds=0.2
    )
    return StreamsApi(await aiohttp_client(create_app(settings)))


async def exists(s3: Any, key: str) -> bool:
    listing = await s3.list_object_versions(Bucket=s3.bucket, Prefix=key)
    return any(v["Key"] == key for v in listing.get("Versions", []))


async def test_full_lifecycle_multipart(api: StreamsApi, s3: Any, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    objs = ObjectsApi(api, "r", "s")
    data = os.urandom(12 * MiB + 123)
    prepared = await objs.prepare(data, "upload-1", content_type="application/x-tar", schema_ref="tar/v1")
    assert prepared.status == 201
    intent = await prepared.json()
    assert intent["state"] == "prepared" and intent["region"] == "eu-west-1"
    assert intent["object_key"].startswith("streams/r/s/")
    receipt = intent["authorization_receipt"]
    assert receipt["principal"] == "alice" and receipt["granted_by"] == "authorization.append: alice"
    again = await objs.prepare(data, "upload-1", content_type="application/x-tar", schema_ref="tar/v1")
    assert again.status == 200 and (await again.json())["intent_id"] == intent["intent_id"]

    uploaded = await objs.upload(intent["intent_id"], data)
    assert uploaded.status == 200, await uploaded.text()
    assert (await uploaded.json())["state"] == "uploaded"
    head = await s3.head_object(Bucket=s3.bucket, Key=intent["object_key"], ChecksumMode="ENABLED")
    assert head["ContentLength"] == len(data)
    assert (await (await api.read("r", "s")).json())["records"] == [], "not visible before commit"

    committed = await objs.commit(intent["intent_id"])
    assert committed.status == 201
    sequence = (await committed.json())["sequence"]
    duplicate = await objs.commit(intent["intent_id"])
    assert duplicate.status == 200 and (await duplicate.json())["sequence"] == sequence

    (record,) = (await (await api.read("r", "s")).json())["records"]
    assert record["kind"] == "object" and record["sequence"] == sequence and record["size"] == len(data)
    assert record["object"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert record["object"]["key"] == intent["object_key"]
    body = await (await s3.get_object(Bucket=s3.bucket, Key=intent["object_key"]))["Body"].read()
    assert hashlib.sha256(body).digest() == hashlib.sha256(data).digest()
    assert await db.fetchval("SELECT appended_bytes FROM wfs_streams") == len(data), "objects cost credit"


async def test_small_object_single_put(api: StreamsApi) -> None:
    await api.create("r", "s")
    objs = ObjectsApi(api, "r", "s")
    assert await objs.put(b"hello object", "small") == 1
    again = await (await objs.prepare(b"hello object", "small")).json()
    assert again["state"] == "committed" and again["committed_sequence"] == 1, "a retried prepare finds the commit"
    await problem(await objs.upload(again["intent_id"], b"hello object"), 409, "intent_state")


async def test_digest_mismatch_leaves_nothing(api: StreamsApi, s3: Any, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    objs = ObjectsApi(api, "r", "s")
    for size in (1000, 7 * MiB):
        data = os.urandom(size)
        intent = await (await objs.prepare(data, f"k-{size}")).json()
        tampered = bytes([data[0] ^ 1]) + data[1:]
        body = await problem(await objs.upload(intent["intent_id"], tampered), 422, "object_mismatch")
        assert body["field"] == "sha256"
        assert not await exists(s3, intent["object_key"])
        await problem(await objs.commit(intent["intent_id"]), 409, "intent_state")
    await problem(await objs.upload(intent["intent_id"], b"short"), 400, "invalid_input")
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 0


async def test_size_limits(api: StreamsApi) -> None:
    await api.create("r", "s")
    objs = ObjectsApi(api, "r", "s")
    resp = await api.client.post(
        objs._url("/prepare"),
        json={"idempotency_key": "big", "sha256": "0" * 64, "size": 32 * MiB + 1},
        headers=api.headers,
    )
    body = await problem(resp, 413, "payload_too_large")
    assert body["limit"] == 32 * MiB
    resp = await api.client.post(
        objs._url("/prepare"), json={"idempotency_key": "k", "sha256": "XYZ", "size": 1}, headers=api.headers
    )
    await problem(resp, 400, "invalid_input")
    await problem(await objs.prepare(b"x", "k", region="us-east-1"), 400, "invalid_input")
    first = await objs.prepare(b"x", "same-key")
    assert first.status == 201
    await problem(await objs.prepare(b"other bytes", "same-key"), 409, "idempotency_key_reused")


async def test_abort_deletes_the_object(api: StreamsApi, s3: Any) -> None:
    await api.create("r", "s")
    objs = ObjectsApi(api, "r", "s")
    data = os.urandom(2048)
    intent = await (await objs.prepare(data, "to-abort")).json()
    await objs.upload(intent["intent_id"], data)
    assert await exists(s3, intent["object_key"])
    resp = await objs.abort(intent["intent_id"])
    assert (await resp.json())["state"] == "aborted"
    await problem(await objs.commit(intent["intent_id"]), 409, "intent_state")

    async def gone() -> bool:
        return not await exists(s3, intent["object_key"])

    await eventually(gone)


async def test_expired_intents_are_cleaned_up(api: StreamsApi, s3: Any, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    objs = ObjectsApi(api, "r", "s")
    data = os.urandom(4096)
    intent = await (await objs.prepare(data, "orphan", expires_in_seconds=1)).json()
    await objs.upload(intent["intent_id"], data)
    assert await exists(s3, intent["object_key"])

    async def cleaned() -> bool:
        # the janitor deletes the object, then marks its outbox row: wait for both
        deleted = await db.fetchval("SELECT deleted_at IS NOT NULL FROM wfs_deletion_outbox")
        return bool(deleted) and not await exists(s3, intent["object_key"])

    await eventually(cleaned)
    assert await db.fetchval("SELECT state FROM wfs_object_intents") == "expired"
    assert await db.fetchval("SELECT deleted_at IS NOT NULL FROM wfs_deletion_outbox") is True
    await problem(await objs.commit(intent["intent_id"]), 409, "intent_state")


async def test_pruning_deletes_objects_and_reads_get_410(api: StreamsApi, s3: Any) -> None:
    await api.create("r", "s", retention={"max_records": 1})
    objs = ObjectsApi(api, "r", "s")
    first = await (await objs.prepare(b"first", "a")).json()
    await objs.upload(first["intent_id"], b"first")
    await objs.commit(first["intent_id"])
    await objs.put(b"second", "b")

    async def pruned_and_deleted() -> bool:
        return (await api.read("r", "s", after=0)).status == 410 and not await exists(s3, first["object_key"])

    await eventually(pruned_and_deleted)
    body = await problem(await api.read("r", "s", after=0), 410, "cursor_expired")
    assert body["earliest"] == 2


async def test_legal_hold_blocks_pruning_and_s3_delete(api: StreamsApi, s3: Any, db: asyncpg.Connection) -> None:
    await api.create("r", "s", retention={"max_records": 1})
    objs = ObjectsApi(api, "r", "s")
    before = await (await objs.prepare(b"before the hold", "a")).json()
    await objs.upload(before["intent_id"], b"before the hold")
    await objs.commit(before["intent_id"])
    assert (await api.hold("r", "s", True, "matter 7")).status == 200
    during = await (await objs.prepare(b"during the hold", "b")).json()
    await objs.upload(during["intent_id"], b"during the hold")
    await objs.commit(during["intent_id"])
    await api.append("r", "s", "inline too")

    # an unheld stream with the same retention, its object superseded after the hold was placed: once the
    # pruner has dropped its record and the janitor its object, both have swept since the hold
    await api.create("r", "control", retention={"max_records": 1})
    control = ObjectsApi(api, "r", "control")
    unheld = await (await control.prepare(b"not held", "c")).json()
    await control.upload(unheld["intent_id"], b"not held")
    await control.commit(unheld["intent_id"])
    await api.append("r", "control", "supersedes it")

    async def control_swept() -> bool:
        return not await exists(s3, unheld["object_key"])

    await eventually(control_swept, message="the pruner and janitor never swept the unheld stream")
    held_records = "SELECT count(*) FROM wfs_records r JOIN wfs_streams s USING (stream_key) WHERE s.stream_id = 's'"
    assert await db.fetchval(held_records) == 3, "the hold stops pruning"
    for key in (before["object_key"], during["object_key"]):
        hold = await s3.get_object_legal_hold(Bucket=s3.bucket, Key=key)
        assert hold["LegalHold"]["Status"] == "ON"
        versions = (await s3.list_object_versions(Bucket=s3.bucket, Prefix=key))["Versions"]
        with pytest.raises(ClientError) as refused:
            await s3.delete_object(Bucket=s3.bucket, Key=key, VersionId=versions[0]["VersionId"])
        # S3 says AccessDenied; MinIO says InvalidRequest "Object is WORM protected"
        assert refused.value.response["Error"]["Code"] in ("AccessDenied", "InvalidRequest")
        assert await exists(s3, key)

    assert (await api.hold("r", "s", False)).status == 200

    async def released() -> bool:
        return not await exists(s3, before["object_key"]) and not await exists(s3, during["object_key"])

    await eventually(released)
    assert await db.fetchval(held_records) == 1
