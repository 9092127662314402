"""S3 (aiobotocore): one client per object region, uploads that hold one part in memory at most."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import ClientError

from ..domain.errors import ObjectGone, ObjectMismatch, ObjectRegionUnavailable
from ..domain.objects import PART_BYTES, s3_checksum

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegionConfig:
    endpoint_url: str
    bucket: str
    access_key_id: str
    secret_access_key: str
    s3_region: str = "us-east-1"
    create_bucket: bool = False


@dataclass(frozen=True)
class Evidence:
    size: int
    checksum: str | None


class ObjectStore:
    def __init__(self, regions: Mapping[str, RegionConfig]) -> None:
        self.regions = dict(regions)
        self._clients: dict[str, Any] = {}
        self._stack = contextlib.AsyncExitStack()

    async def open(self) -> None:
        session = get_session()
        config = Config(
            retries={"max_attempts": 3, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        for name, region in self.regions.items():
            self._clients[name] = await self._stack.enter_async_context(
                session.create_client(
                    "s3",
                    endpoint_url=region.endpoint_url,
                    region_name=region.s3_region,
                    aws_access_key_id=region.access_key_id,
                    aws_secret_access_key=region.secret_access_key,
                    config=config,
                )
            )
            if region.create_bucket:
                await self.ensure_bucket(name)

    async def close(self) -> None:
        await self._stack.aclose()

    def client(self, region: str) -> Any:
        try:
            return self._clients[region]
        except KeyError:
            raise ObjectRegionUnavailable(f"this data plane has no object store for region {region!r}") from None

    def bucket(self, region: str) -> str:
        self.client(region)
        return self.regions[region].bucket

    async def ensure_bucket(self, region: str) -> None:
        """Buckets are created with Object Lock, so legal holds can be set on their objects."""
        client = self.client(region)
        try:
            await client.create_bucket(Bucket=self.bucket(region), ObjectLockEnabledForBucket=True)
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    async def upload(
        self, region: str, key: str, chunks: AsyncIterator[bytes], size: int, sha256_hex: str, legal_hold: bool
    ) -> str:
        """Stream ``chunks`` to S3; verify size and digest. Returns the checksum S3 will report.

        On any mismatch nothing stays in S3 (the multipart upload is aborted) and ObjectMismatch is raised.
        """
        client, bucket = self.client(region), self.bucket(region)
        hold = {"ObjectLockLegalHoldStatus": "ON"} if legal_hold else {}
        parts = _parts(chunks, size)
        if size <= PART_BYTES:  # one PUT, with the checksum S3 verifies on arrival
            # at most one part; drained all the same, so that bytes beyond the prepared size are refused
            (body,) = [part async for part in parts] or [io.BytesIO()]
            with body.getbuffer() as view:
                whole, received = hashlib.sha256(view), len(view)
            _check(whole, received, size, sha256_hex)
            digest = whole.digest()
            await client.put_object(Bucket=bucket, Key=key, Body=body, ChecksumSHA256=_b64(digest), **hold)
            return s3_checksum([digest])
        upload = await client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256", **hold)
        upload_id = upload["UploadId"]
        try:
            whole, received = hashlib.sha256(), 0
            done: list[dict[str, Any]] = []
            digests: list[bytes] = []
            async for part in parts:
                with part.getbuffer() as view:
                    whole.update(view)
                    received += len(view)
                    digest = hashlib.sha256(view).digest()
                number = len(done) + 1
                response = await client.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=part,
                    ChecksumSHA256=_b64(digest),
                )
                done.append({"PartNumber": number, "ETag": response["ETag"], "ChecksumSHA256": _b64(digest)})
                digests.append(digest)
            _check(whole, received, size, sha256_hex)
            await client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
            )
            return s3_checksum(digests)
        except BaseException:
            with contextlib.suppress(ClientError):
                await client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            raise

    async def evidence(self, region: str, key: str) -> Evidence | None:
        """What S3 says about the object (HEAD), or None if it does not exist."""
        try:
            head = await self.client(region).head_object(Bucket=self.bucket(region), Key=key, ChecksumMode="ENABLED")
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return Evidence(size=head["ContentLength"], checksum=head.get("ChecksumSHA256"))

    async def _versions(self, region: str, key: str) -> list[str]:
        client = self.client(region)
        listing = await client.list_object_versions(Bucket=self.bucket(region), Prefix=key)
        found = [*listing.get("Versions", []), *listing.get("DeleteMarkers", [])]
        return [v["VersionId"] for v in found if v["Key"] == key]

    async def delete(self, region: str, key: str) -> None:
        """Delete every version (buckets with Object Lock are versioned). S3 refuses while held."""
        client = self.client(region)
        for version in await self._versions(region, key):
            await client.delete_object(Bucket=self.bucket(region), Key=key, VersionId=version)

    async def set_legal_hold(self, region: str, key: str, on: bool) -> None:
        client = self.client(region)
        for version in await self._versions(region, key):
            await client.put_object_legal_hold(
                Bucket=self.bucket(region),
                Key=key,
                VersionId=version,
                LegalHold={"Status": "ON" if on else "OFF"},
            )

    async def bucket_policy(self, region: str) -> dict[str, Any]:
        try:
            response = await self.client(region).get_bucket_policy(Bucket=self.bucket(region))
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("NoSuchBucketPolicy", "NoSuchPolicy"):
                return {"Version": "2012-10-17", "Statement": []}
            raise
        policy: dict[str, Any] = json.loads(response["Policy"])
        return policy

    async def put_bucket_policy(self, region: str, policy: dict[str, Any]) -> None:
        client = self.client(region)
        if policy["Statement"]:
            await client.put_bucket_policy(Bucket=self.bucket(region), Policy=json.dumps(policy))
        else:
            await client.delete_bucket_policy(Bucket=self.bucket(region))

    async def get(self, region: str, key: str, byte_range: tuple[int, int] | None = None) -> Any:
        """The object's streaming body (``async with``; ``iter_chunks``), whole or one byte range (first and
        last, inclusive). ObjectGone if S3 no longer has it."""
        client, bucket = self.client(region), self.bucket(region)
        ranged = {"Range": f"bytes={byte_range[0]}-{byte_range[1]}"} if byte_range is not None else {}
        try:
            response = await client.get_object(Bucket=bucket, Key=key, **ranged)
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                raise ObjectGone("the object is no longer in S3: its record was pruned since") from None
            raise
        return response["Body"]


async def _parts(chunks: AsyncIterator[bytes], size: int) -> AsyncIterator[io.BytesIO]:
    """Regroup a byte stream into parts of at least PART_BYTES (the last may be smaller); refuse more
    bytes than were prepared. One part buffer is alive per upload.

    A part is a BytesIO its bytes were written into, not ``bytes``: botocore wraps a ``bytes`` body in a
    BytesIO that shares it, and aiohttp's ``getbuffer()`` on that copies the whole part, so each part in
    flight would be held twice (tests/test_objects_memory.py watches the server with tracemalloc). A
    BytesIO of our own is sent in chunks straight from its buffer."""
    buffer = io.BytesIO()
    received = 0
    async for chunk in chunks:
        received += len(chunk)
        if received > size:
            raise ObjectMismatch(f"the upload is larger than the prepared size {size}", field="size", size=size)
        buffer.write(chunk)
        if buffer.tell() >= PART_BYTES:
            buffer.seek(0)
            yield buffer
            buffer = io.BytesIO()
    if buffer.tell():
        buffer.seek(0)
        yield buffer


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _check(whole: Any, received: int, size: int, sha256_hex: str) -> None:
    if received != size:
        raise ObjectMismatch(f"received {received} bytes, prepared {size}", field="size", size=size, received=received)
    if whole.hexdigest() != sha256_hex:
        raise ObjectMismatch("the uploaded bytes do not match the prepared sha256", field="sha256")
