"""Large objects through HTTP against a real MinIO: lifecycle, mismatches, expiry, retention, legal hold."""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any

import asyncpg
import pytest
from botocore.exceptions import ClientError

from tests.support import BOB, EVE, ObjectsApi, StreamsApi, problem
from tests.waiting import eventually
from workflow_streams.shells.compose import create_app

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


def object_url(api: StreamsApi, run: str, stream: str, sequence: Any) -> str:
    return api.url(run, stream, f"/records/{sequence}/object")


async def test_a_reader_downloads_what_was_uploaded(api: StreamsApi) -> None:
    await api.create("r", "s")
    objs = ObjectsApi(api, "r", "s")
    data = os.urandom(6 * MiB + 7)  # two parts in S3
    intent = await (await objs.prepare(data, "report", content_type="application/pdf")).json()
    await objs.upload(intent["intent_id"], data)
    sequence = (await (await objs.commit(intent["intent_id"])).json())["sequence"]
    reader = api.as_(BOB)  # in group readers: the read right, not append
    resp = await reader.client.get(object_url(api, "r", "s", sequence), headers=reader.headers)
    assert resp.status == 200, await resp.text()
    assert await resp.read() == data
    assert resp.headers["Content-Type"] == "application/pdf"
    assert int(resp.headers["Content-Length"]) == len(data)
    expected_digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert resp.headers["Repr-Digest"] == f"sha-256=:{expected_digest}:"
    assert resp.headers["Accept-Ranges"] == "bytes"

    ranged = await reader.client.get(
        object_url(api, "r", "s", sequence), headers={**reader.headers, "Range": "bytes=5242870-5242889"}
    )
    assert ranged.status == 206
    assert await ranged.read() == data[5242870:5242890], "a range across the part boundary"
    assert ranged.headers["Content-Range"] == f"bytes 5242870-5242889/{len(data)}"
    assert ranged.headers["Repr-Digest"] == f"sha-256=:{expected_digest}:", "the whole object's digest"
    suffix = await reader.client.get(
        object_url(api, "r", "s", sequence), headers={**reader.headers, "Range": "bytes=-3"}
    )
    assert suffix.status == 206 and await suffix.read() == data[-3:]
    past = await reader.client.get(
        object_url(api, "r", "s", sequence), headers={**reader.headers, "Range": f"bytes={len(data)}-"}
    )
    await problem(past, 416, "range_not_satisfiable")
    assert past.headers["Content-Range"] == f"bytes */{len(data)}"


async def test_a_download_needs_the_read_right_and_reveals_nothing(api: StreamsApi) -> None:
    await api.create("r", "s")
    sequence = await ObjectsApi(api, "r", "s").put(b"secret bytes", "k")
    eve = api.as_(EVE)  # no right on the stream
    refused = await problem(await eve.client.get(object_url(api, "r", "s", sequence), headers=EVE), 403, "forbidden")
    absent = await problem(await eve.client.get(object_url(api, "r", "nosuch", 1), headers=EVE), 403, "forbidden")
    beyond = await problem(await eve.client.get(object_url(api, "r", "s", 99), headers=EVE), 403, "forbidden")
    assert refused == absent == beyond, "the same answer as for a stream that does not exist"
    await problem(await api.client.get(object_url(api, "r", "s", sequence)), 401, "unauthenticated")
    await problem(await api.client.get(object_url(api, "r", "s", "x1"), headers=api.headers), 400, "invalid_input")


async def test_a_download_from_outside_the_egress_regions_is_refused(
    aiohttp_client: Any, database_url: str, settings_for: Any, s3_regions: Any
) -> None:
    # the test client connects from 127.0.0.1, which this data plane maps to us-east-1
    settings = settings_for(database_url, s3_regions=s3_regions, region_cidrs={"us-east-1": ["127.0.0.0/8"]})
    api = StreamsApi(await aiohttp_client(create_app(settings)))
    await api.create("r", "eu-only")
    await api.create("r", "global", placement={"client_egress_regions": ["eu-west-1", "us-east-1"]})
    for stream in ("eu-only", "global"):
        assert await ObjectsApi(api, "r", stream).put(b"placed bytes", "k") == 1
    body = await problem(
        await api.client.get(object_url(api, "r", "eu-only", 1), headers=api.headers), 403, "placement_violation"
    )
    assert body["client_region"] == "us-east-1"
    allowed = await api.client.get(object_url(api, "r", "global", 1), headers=api.headers)
    assert allowed.status == 200 and await allowed.read() == b"placed bytes"


async def test_only_committed_objects_of_records_are_readable(api: StreamsApi) -> None:
    await api.create("r", "s")
    objs = ObjectsApi(api, "r", "s")
    pending = await (await objs.prepare(b"not committed", "pending")).json()
    await objs.upload(pending["intent_id"], b"not committed")
    await problem(await api.client.get(object_url(api, "r", "s", 1), headers=api.headers), 404, "not_found")
    await objs.abort(pending["intent_id"])
    await problem(await api.client.get(object_url(api, "r", "s", 1), headers=api.headers), 404, "not_found")
    await api.append("r", "s", {"inline": True})
    await problem(await api.client.get(object_url(api, "r", "s", 1), headers=api.headers), 409, "not_an_object")
    assert await objs.put(b"committed", "committed") == 2
    resp = await api.client.get(object_url(api, "r", "s", 2), headers=api.headers)
    assert resp.status == 200 and await resp.read() == b"committed"


async def test_a_pruned_object_is_410(api: StreamsApi, s3: Any) -> None:
    await api.create("r", "s", retention={"max_records": 1})
    objs = ObjectsApi(api, "r", "s")
    await objs.put(b"first", "a")
    await objs.put(b"second", "b")

    async def pruned() -> bool:
        return (await api.client.get(object_url(api, "r", "s", 1), headers=api.headers)).status == 410

    await eventually(pruned)
    await problem(await api.client.get(object_url(api, "r", "s", 1), headers=api.headers), 410, "cursor_expired")
    resp = await api.client.get(object_url(api, "r", "s", 2), headers=api.headers)
    assert resp.status == 200 and await resp.read() == b"second"


async def test_prepare_refuses_an_object_that_could_never_be_committed(
    api: StreamsApi, s3: Any, db: asyncpg.Connection
) -> None:
    await api.create("r", "s", credit={"max_unread_bytes": 1000, "max_total_bytes": 1500})
    objs = ObjectsApi(api, "r", "s")
    body = await problem(await objs.prepare(os.urandom(2000), "too-big"), 422, "object_exceeds_credit")
    assert "max_unread_bytes" in body["detail"] and body["limit"] == 1000 and body["size"] == 2000
    assert await db.fetchval("SELECT count(*) FROM wfs_object_intents") == 0, "refused before any upload"
    first = os.urandom(900)
    assert await objs.put(first, "first") == 1
    body = await problem(await objs.prepare(os.urandom(700), "past-the-total"), 409, "quota_exhausted")
    assert "max_total_bytes" in body["detail"]
    again = await objs.prepare(first, "first")
    assert again.status == 200, "a prepare replayed for a committed object is still answered"
    assert (await again.json())["committed_sequence"] == 1
