"""The bytes both HTTP surfaces put on the wire: our API's JSON bodies and SSE events, and the Durable
Streams protocol's bodies (JSON arrays of messages, or bytes) and SSE ``data``/``control`` events.

Encoding is where catch-up reads and fan-out spend their time, so stored JSON payloads are spliced in
as stored (never decoded and re-encoded), and an SSE page is encoded once for all its subscribers
(``runtime.reads.SharedPage.memo``).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from collections.abc import Sequence
from typing import Any

from ..domain.cursor import Bounds
from ..domain.durable import is_json_mode, sse_base64
from ..domain.errors import StreamError, StreamNotFound
from ..domain.records import StoredRecord, is_json


def record_json(record: StoredRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sequence": record.sequence,
        "kind": record.kind,
        "content_type": record.content_type,
        "size": record.size_bytes,
        "appended_at": timestamp(record.appended_at),
    }
    if record.kind == "object":
        out["object"] = record.object
        return out
    payload = record.payload
    assert payload is not None  # an inline record has its bytes (the table's CHECK)
    if is_json(record.content_type):
        out["data"] = json.loads(payload)
    else:
        out["data_base64"] = base64.b64encode(payload).decode()
    return out


def timestamp(at: dt.datetime) -> str:
    """RFC 3339 in UTC as Postgres writes a timestamp in JSON (``store.bodies`` assembles records there):
    fractional seconds without trailing zeros, none when whole."""
    text = at.astimezone(dt.UTC).isoformat(timespec="microseconds")  # 2026-12-07T08:18:50.282460+00:00
    fraction = text[20:26].rstrip("0")
    return f"{text[:19]}.{fraction}+00:00" if fraction else f"{text[:19]}+00:00"


_CONTENT_TYPES: dict[str, bytes] = {}


def record_bytes(record: StoredRecord) -> bytes:
    """``record_json(record)`` as JSON bytes, splicing a JSON payload in as stored instead of decoding and
    re-encoding it (the largest cost of catch-up reads and fan-out)."""
    content_type = record.content_type
    quoted = _CONTENT_TYPES.get(content_type)
    if quoted is None:
        quoted = json.dumps(content_type).encode()
        if len(_CONTENT_TYPES) < 1000:
            _CONTENT_TYPES[content_type] = quoted
    kind = record.kind
    appended_at = timestamp(record.appended_at)
    head = (
        f'{{"sequence":{record.sequence},"kind":"{kind}","content_type":'.encode()
        + quoted
        + f',"size":{record.size_bytes},"appended_at":"{appended_at}"'.encode()
    )
    if kind == "object":
        return head + b',"object":' + json.dumps(record.object, separators=(",", ":")).encode() + b"}"
    payload = record.payload
    assert payload is not None  # an inline record has its bytes (the table's CHECK)
    if is_json(content_type):
        return head + b',"data":' + payload + b"}"
    return head + b',"data_base64":"' + base64.b64encode(payload) + b'"}'


# The read response body around its records (``record_bytes`` of each, joined by commas; ``store.bodies``
# assembles them in Postgres): PAGE_HEAD, the records, then ``page_tail``.
PAGE_HEAD = b'{"records":['


def page_tail(next_after: int, bounds: Bounds, closed: bool) -> bytes:
    return (
        f'],"next_after":{next_after},"earliest":{bounds.earliest},"latest":{bounds.latest},'
        f'"closed":{"true" if closed else "false"}}}'
    ).encode()


def append_bytes(first_sequence: int, last_sequence: int) -> bytes:
    """The append response body: the sequences the request's records got, as json.dumps spaces them (the
    README shows it), formatted here: json.dumps of the same document costs several times as much
    (figures: bench/README.md, constants)."""
    sequences = ", ".join(map(str, range(first_sequence, last_sequence + 1)))
    return (
        f'{{"first_sequence": {first_sequence}, "last_sequence": {last_sequence}, "sequences": [{sequences}]}}'
    ).encode()


# --- Server-Sent Events, both surfaces ---------------------------------------------------------

HEARTBEAT = b": heartbeat\n\n"  # a comment: keeps proxies from timing an idle connection out
RECONNECT_MS = 1000
RETRY = f"retry: {RECONNECT_MS}\n\n".encode()  # how soon a browser reconnects (our API's streams start so)

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def event(name: str, data: str) -> bytes:
    """One event; every line of ``data`` gets its own ``data:`` field, splitting on CRLF, CR and LF alike,
    so a payload can never end the event or start another (CRLF injection)."""
    lines = "".join(f"data:{line}\n" for line in _LINE_BREAK.split(data))
    return f"event: {name}\n{lines}\n".encode()


def record_event(record: StoredRecord) -> bytes:
    """One record as our API's SSE event. The record's JSON has no raw newlines (JSON escapes them), so it
    is one data line; its id is what a browser's reconnect sends back as Last-Event-ID."""
    return f"id: {record.sequence}\nevent: record\ndata: ".encode() + record_bytes(record) + b"\n\n"


def close_event(last_sequence: int) -> bytes:
    """Our API's last event of a closed stream, once every record was delivered."""
    return f"event: close\ndata: {json.dumps({'last_sequence': last_sequence})}\n\n".encode()


def error_event(exc: StreamError) -> bytes:
    """Our API's in-band error (the response had started): the problem's code, detail and fields."""
    return f"event: error\ndata: {json.dumps({'code': exc.code, 'detail': exc.detail, **exc.extra})}\n\n".encode()


# --- the Durable Streams protocol ---------------------------------------------------------------


def message(record: StoredRecord) -> bytes:
    """A record as one JSON message: JSON payloads as stored; anything else (only our own streams hold
    base64 or object records) as the record object our own API returns."""
    if record.payload is not None and is_json(record.content_type):  # inline (the CHECK: kind = inline iff payload)
        return record.payload
    return record_bytes(record)


def payloads(records: Sequence[StoredRecord], content_type: str) -> list[bytes]:
    """A stream's records as the protocol's units: messages of a JSON stream, else the stored bytes."""
    if is_json_mode(content_type):
        return [message(r) for r in records]
    return [r.payload for r in records if r.payload is not None]


def body(records: Sequence[StoredRecord], content_type: str) -> bytes:
    """A read's body: a JSON array of messages, or the bytes one after another."""
    parts = payloads(records, content_type)
    if is_json_mode(content_type):
        return b"[" + b",".join(parts) + b"]"
    return b"".join(parts)


def data_text(parts: list[bytes], content_type: str) -> str:
    """A page of records as one ``data`` event's text: a JSON array, text, or base64 of the bytes."""
    if is_json_mode(content_type):
        return "[" + ",".join(p.decode() for p in parts) + "]"
    joined = b"".join(parts)
    if sse_base64(content_type):
        return base64.b64encode(joined).decode()
    return joined.decode("utf-8", errors="replace")


def data_event(records: Sequence[StoredRecord], content_type: str) -> bytes:
    return event("data", data_text(payloads(records, content_type), content_type))


def control(next_offset: str, cursor: str | None, up_to_date: bool, closed: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"streamNextOffset": next_offset}
    if closed:
        body["streamClosed"] = True  # the final event: no cursor, nothing follows
    elif cursor is not None:
        body["streamCursor"] = cursor
    if up_to_date:
        body["upToDate"] = True
    return body


def control_event(next_offset: str, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    """Where to resume after the events before it, whether that is the tail, and whether it ended there."""
    return event("control", json.dumps(control(next_offset, cursor, up_to_date, closed), separators=(",", ":")))


def protocol_error_event(exc: StreamError) -> bytes:
    """The protocol's in-band error; a deleted stream just ends (nothing to say that a reconnect will not)."""
    if isinstance(exc, StreamNotFound):
        return b""
    safe = {k: v for k, v in exc.extra.items() if isinstance(v, (int, str, bool))}
    return event("error", json.dumps({"code": exc.code, **safe}))
