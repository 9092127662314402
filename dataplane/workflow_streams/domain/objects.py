"""Large objects: what a prepare pins, the intent state machine, and S3 checksum evidence."""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput, PayloadTooLarge, RangeNotSatisfiable

MAX_OBJECT_BYTES = 32 * 1024 * 1024
# S3's minimum part size; one part's buffer is all an upload holds in memory
PART_BYTES = 5 * 1024 * 1024
DEFAULT_EXPIRY_SECONDS = 3600
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# one byte range (RFC 9110 14.1.2): "first-[last]" or "-suffix"; positions of at most 19 digits
_BYTE_RANGE = re.compile(r"bytes=(?:(\d{1,19})-(\d{1,19})?|-(\d{1,19}))", re.IGNORECASE)
# a content type as a response header may carry it: printable ASCII (what prepare accepts is wider)
_HEADER_SAFE = re.compile(r"[\x20-\x7e]+")
_FIELDS = {"idempotency_key", "sha256", "size", "content_type", "schema_ref", "region", "expires_in_seconds"}

# state -> states it may move to
TRANSITIONS: dict[str, frozenset[str]] = {
    "prepared": frozenset({"uploaded", "aborted", "expired"}),
    "uploaded": frozenset({"committed", "aborted", "expired"}),
    "committed": frozenset(),
    "aborted": frozenset(),
    "expired": frozenset(),
}


def can_move(state: str, to: str) -> bool:
    return to in TRANSITIONS[state]


@dataclass(frozen=True)
class ObjectPins:
    """What a prepare fixes; the same idempotency key with other pins is a conflict."""

    idempotency_key: str
    sha256: str
    size: int
    content_type: str
    schema_ref: str | None
    region: str | None
    expires_in_seconds: int

    def same_as(self, prepared: Prepared) -> bool:
        """Whether ``prepared`` (what this idempotency key already made) is what these pins ask for; a
        prepare that named no region accepts the region chosen then."""
        return (self.sha256, self.size, self.content_type, self.schema_ref) == (
            prepared.sha256,
            prepared.size,
            prepared.content_type,
            prepared.schema_ref,
        ) and self.region in (None, prepared.region)


@dataclass(frozen=True)
class Prepared:
    """What an existing intent fixed, as ``ObjectPins.same_as`` compares it (the store maps its row)."""

    sha256: str
    size: int
    content_type: str
    schema_ref: str | None
    region: str


def parse_prepare(body: Any) -> ObjectPins:
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object", field="/")
    unknown = set(body) - _FIELDS
    if unknown:
        raise InvalidInput(f"unknown field(s): {', '.join(sorted(unknown))}", field=min(unknown))
    key = body.get("idempotency_key")
    if not isinstance(key, str) or not 0 < len(key) <= 255 or not key.isprintable():
        raise InvalidInput("idempotency_key must be 1-255 printable characters", field="idempotency_key")
    digest = body.get("sha256")
    if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
        raise InvalidInput("sha256 must be 64 lowercase hex characters", field="sha256")
    size = body.get("size")
    if type(size) is not int or size < 1:
        raise InvalidInput("size must be a positive integer", field="size")
    if size > MAX_OBJECT_BYTES:
        raise PayloadTooLarge(
            f"objects are at most {MAX_OBJECT_BYTES} bytes", field="size", limit=MAX_OBJECT_BYTES, size=size
        )
    content_type = body.get("content_type", "application/octet-stream")
    if not isinstance(content_type, str) or not 0 < len(content_type) <= 255 or not content_type.isprintable():
        raise InvalidInput("content_type must be a short printable string", field="content_type")
    schema_ref = body.get("schema_ref")
    if schema_ref is not None and (
        not isinstance(schema_ref, str) or not 0 < len(schema_ref) <= 512 or not schema_ref.isprintable()
    ):
        raise InvalidInput("schema_ref must be printable text of at most 512 characters", field="schema_ref")
    region = body.get("region")
    if region is not None and not isinstance(region, str):
        raise InvalidInput("region must be a string", field="region")
    expires = body.get("expires_in_seconds", DEFAULT_EXPIRY_SECONDS)
    if type(expires) is not int or not 1 <= expires <= 7 * 24 * 3600:
        raise InvalidInput("expires_in_seconds must be an integer from 1 to 604800", field="expires_in_seconds")
    return ObjectPins(key, digest, size, content_type, schema_ref, region, expires)


def choose_region(requested: str | None, pinned: list[str]) -> str:
    """Objects go only to the definition's pinned object regions; the first is the default."""
    if requested is None:
        return pinned[0]
    if requested not in pinned:
        raise InvalidInput(f"region {requested!r} is not one of the stream's object regions", field="region")
    return requested


def object_key(run_id: str, stream_id: str, intent_id: str) -> str:
    """Server-owned: callers never choose where bytes land."""
    return f"streams/{run_id}/{stream_id}/{intent_id}"


def s3_checksum(part_digests: list[bytes]) -> str:
    """The SHA-256 checksum S3 reports for an object: the plain digest for a single PUT, the digest of
    the part digests with a ``-N`` suffix for a multipart upload."""
    if len(part_digests) == 1:
        return base64.b64encode(part_digests[0]).decode()
    combined = hashlib.sha256(b"".join(part_digests)).digest()
    return f"{base64.b64encode(combined).decode()}-{len(part_digests)}"


def object_json(
    region: str, bucket: str, key: str, size: int, sha256: str, content_type: str, intent_id: str
) -> dict[str, Any]:
    """The metadata of an ``object`` record, as stored and as readers see it."""
    return {
        "region": region,
        "bucket": bucket,
        "key": key,
        "size": size,
        "sha256": sha256,
        "content_type": content_type,
        "intent_id": intent_id,
    }


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one byte range a ``Range`` header asks of an object of ``size`` bytes, as (first, last)
    inclusive; None to send the whole object. A header this server does not take (another unit, several
    ranges, a malformed or reversed one) is ignored, as RFC 9110 allows; a range starting past the end is
    ``RangeNotSatisfiable``."""
    if header is None:
        return None
    found = _BYTE_RANGE.fullmatch(header.strip())
    if found is None:
        return None
    first_text, last_text, suffix_text = found.groups()
    if suffix_text is not None:
        suffix = int(suffix_text)
        if suffix == 0:
            raise RangeNotSatisfiable(f"an empty suffix range of a {size}-byte object", size=size)
        return max(0, size - suffix), size - 1
    first = int(first_text)
    last = size - 1 if last_text is None else int(last_text)
    if last_text is not None and last < first:
        return None
    if first >= size:
        raise RangeNotSatisfiable(f"the range starts at byte {first}; the object has {size} bytes", size=size)
    return first, min(last, size - 1)


def repr_digest(sha256_hex: str) -> str:
    """The ``Repr-Digest`` header (RFC 9530) of an object: its whole SHA-256, also on a partial response."""
    return f"sha-256=:{base64.b64encode(bytes.fromhex(sha256_hex)).decode()}:"


def served_content_type(content_type: str) -> str:
    """The Content-Type an object is served with: its own, where a header can carry it as given."""
    return content_type if _HEADER_SAFE.fullmatch(content_type) else "application/octet-stream"
