"""Records as callers send them (validation, the inline size cap, the idempotency digest) and as the
store returns them."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import InvalidInput, InvalidJson, PayloadTooLarge
from .media import is_json as is_json  # the one JSON rule; re-exported for the record encoders

INLINE_LIMIT = 64 * 1024
# what a record is when it names no content type; the store keeps it as NULL (migration 483)
DEFAULT_CONTENT_TYPE = "application/json"
MAX_BATCH = 1000
_ALLOWED_FIELDS = frozenset({"content_type", "data", "data_base64"})


@dataclass(frozen=True)
class RecordIn:
    content_type: str
    # inline bytes, or None for an object record whose bytes live in S3
    payload: bytes | None
    object: dict[str, Any] | None = None

    @property
    def kind(self) -> str:
        return "inline" if self.payload is not None else "object"

    @property
    def size(self) -> int:
        """What the record costs in credit: inline bytes, or the object's size."""
        if self.payload is not None:
            return len(self.payload)
        assert self.object is not None
        return int(self.object["size"])


class StoredRecord(NamedTuple):
    """A record as stored, what reads, fan-out and delivery encode. Immutable and slotted; a named tuple
    rather than a frozen dataclass because catch-up reads build one per record and a frozen dataclass's
    ``__init__`` (one ``object.__setattr__`` per field) costs more than encoding the record, where the
    store builds a named tuple straight from the row's tuple (``store.reads.stored_record``; figures:
    bench/README.md, constants)."""

    sequence: int
    kind: str  # "inline" or "object"
    content_type: str
    # the inline bytes; None for an object record
    payload: bytes | None
    size_bytes: int
    # the object's metadata (region, key, size, digest); None for an inline record
    object: dict[str, Any] | None
    appended_at: dt.datetime


# one encoder for every record: json.dumps with options builds a new one per call (figures: bench/README.md, constants)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; ``ValueError`` for what JSON cannot hold (NaN, infinities, lone surrogates)."""
    return _ENCODER.encode(value).encode()


def parse_append_body(body: Any) -> list[RecordIn]:
    """One record (an object) or a batch (``{"records": [...]}``); all-or-nothing validation."""
    if isinstance(body, dict) and set(body) == {"records"}:
        items = body["records"]
        if not isinstance(items, list) or not items:
            raise InvalidInput("records must be a non-empty array", field="records")
        if len(items) > MAX_BATCH:
            raise InvalidInput(f"a batch holds at most {MAX_BATCH} records", field="records", limit=MAX_BATCH)
        return [_parse_record(item, i) for i, item in enumerate(items)]
    return [_parse_record(body, None)]


def _parse_record(item: Any, index: int | None) -> RecordIn:
    """A record of a body (``index``: its place in a batch). The usual record, ``{"data": …}`` of the
    default content type, takes the shortest way; a field's name is only written for an error."""
    if type(item) is dict and len(item) == 1 and "data" in item:
        try:
            payload = encode_json(item["data"])
        except ValueError:
            payload = None  # the full rules below name the field
        if payload is not None and len(payload) <= INLINE_LIMIT:
            return RecordIn(DEFAULT_CONTENT_TYPE, payload)
    return _parse_any_record(item, "" if index is None else f"records/{index}")


def _parse_any_record(item: Any, where: str) -> RecordIn:
    prefix = f"{where}/" if where else ""
    if not isinstance(item, dict):
        raise InvalidInput("a record must be a JSON object", field=where or "/")
    unknown = set(item) - _ALLOWED_FIELDS
    if unknown:
        raise InvalidInput(f"unknown field(s): {', '.join(sorted(unknown))}", field=f"{prefix}{min(unknown)}")
    content_type = item.get("content_type", DEFAULT_CONTENT_TYPE)
    if not isinstance(content_type, str) or not 0 < len(content_type) <= 255 or not content_type.isprintable():
        raise InvalidInput("content_type must be a short printable string", field=f"{prefix}content_type")
    has_data, has_b64 = "data" in item, "data_base64" in item
    if has_data == has_b64:
        raise InvalidInput("a record has exactly one of data or data_base64", field=where or "/")
    if has_data:
        if not is_json(content_type):
            raise InvalidInput("data is for JSON content types; use data_base64", field=f"{prefix}data")
        try:  # read_json already refuses these; this keeps every stored payload JSON whoever calls
            payload = encode_json(item["data"])
        except ValueError as exc:
            raise InvalidJson(f"data is not JSON: {exc}", field=f"{prefix}data", rule="not_json") from None
    else:
        text = item["data_base64"]
        if not isinstance(text, str):
            raise InvalidInput("data_base64 must be a string", field=f"{prefix}data_base64")
        try:
            payload = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput("data_base64 is not valid base64", field=f"{prefix}data_base64") from None
    if len(payload) > INLINE_LIMIT:
        raise PayloadTooLarge(
            f"inline payload is {len(payload)} bytes; the limit is {INLINE_LIMIT}: use the objects API",
            field=where or "/",
            limit=INLINE_LIMIT,
            size=len(payload),
        )
    return RecordIn(content_type=content_type, payload=payload)


def request_digest(records: list[RecordIn]) -> str:
    """What an Idempotency-Key promises: the same records, byte for byte."""
    h = hashlib.sha256()
    for record in records:
        body = record.payload if record.payload is not None else json.dumps(record.object, sort_keys=True).encode()
        for part in (record.content_type.encode(), body):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.hexdigest()
