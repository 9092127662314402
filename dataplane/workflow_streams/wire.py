"""The wire format of records: JSON for reads, Server-Sent Events for subscriptions.

Encoding is where catch-up reads and fan-out spend their time, so stored JSON payloads are spliced in
as stored (never decoded and re-encoded), and an SSE page is encoded once for all its subscribers.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from .domain.cursor import Bounds
from .domain.records import is_json


def record_json(row: asyncpg.Record) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sequence": row["sequence"],
        "kind": row["kind"],
        "content_type": row["content_type"],
        "size": row["size_bytes"],
        "appended_at": row["appended_at"].isoformat(),
    }
    if row["kind"] == "object":
        out["object"] = row["object"]
    elif is_json(row["content_type"]):
        out["data"] = json.loads(row["payload"])
    else:
        out["data_base64"] = base64.b64encode(row["payload"]).decode()
    return out


_CONTENT_TYPES: dict[str, bytes] = {}


def record_bytes(row: asyncpg.Record) -> bytes:
    """``record_json(row)`` as JSON bytes, splicing a JSON payload in as stored instead of decoding and
    re-encoding it (the largest cost of catch-up reads and fan-out)."""
    content_type = row["content_type"]
    quoted = _CONTENT_TYPES.get(content_type)
    if quoted is None:
        quoted = json.dumps(content_type).encode()
        if len(_CONTENT_TYPES) < 1000:
            _CONTENT_TYPES[content_type] = quoted
    head = (
        f'{{"sequence":{row["sequence"]},"kind":"{row["kind"]}","content_type":'.encode()
        + quoted
        + f',"size":{row["size_bytes"]},"appended_at":"{row["appended_at"].isoformat()}"'.encode()
    )
    if row["kind"] == "object":
        return head + b',"object":' + json.dumps(row["object"], separators=(",", ":")).encode() + b"}"
    if is_json(content_type):
        return head + b',"data":' + bytes(row["payload"]) + b"}"
    return head + b',"data_base64":"' + base64.b64encode(row["payload"]) + b'"}'


def page_bytes(records: Sequence[asyncpg.Record], next_after: int, bounds: Bounds, closed: bool) -> bytes:
    """The read response body."""
    tail = (
        f'],"next_after":{next_after},"earliest":{bounds.earliest},"latest":{bounds.latest},'
        f'"closed":{"true" if closed else "false"}}}'
    )
    return b'{"records":[' + b",".join(record_bytes(r) for r in records) + tail.encode()


def sse_event(row: asyncpg.Record) -> bytes:
    """One record as an SSE event. The record's JSON has no raw newlines (JSON escapes them), so it is
    one data line."""
    return f"id: {row['sequence']}\nevent: record\ndata: ".encode() + record_bytes(row) + b"\n\n"
