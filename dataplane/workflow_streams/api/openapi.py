"""The OpenAPI 3.1 document of the HTTP surface, served at /api/workflow-streams/openapi.json.

OpenAPI 3.1 because its schemas are JSON Schema 2020-12, which is what pydantic writes for the pins.
Pins' schema comes from the pydantic model itself; the rest is written here. Each operation lists the
problem ``code``s it can answer; their statuses come from the same table the error responses use
(``problems.codes``), so a code and its documented status cannot drift apart. Tests validate the
document with openapi-spec-validator and keep its paths equal to the router's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .. import API_PREFIX
from ..domain.objects import MAX_OBJECT_BYTES
from ..domain.pins import StreamPins
from ..domain.records import INLINE_LIMIT, MAX_BATCH
from ..domain.strictjson import MAX_DEPTH
from .problems import codes
from .streams import DEFAULT_READ_BYTES, MAX_READ_BYTES, MAX_READ_RECORDS

OPENAPI_VERSION = "3.1.0"
ID = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"}
SEQUENCE = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
TIMESTAMP = {"type": "string", "format": "date-time"}
REF = "#/components/schemas/"
MAX_REQUEST_BYTES = "4 MiB"

# code -> HTTP status, for every problem code the surface answers
CODE_STATUS: dict[str, int] = {**codes(), "database_unavailable": 503}  # the latter: problems.problem_for

# what each code means, for the response descriptions
CODE_MEANING: dict[str, str] = {
    "invalid_input": "a parameter, header or field is malformed or of the wrong type (`field` names it)",
    "invalid_json": f"the body is not strict JSON: `rule` is `syntax`, `encoding` (not UTF-8), "
    f"`non_finite_number` (NaN, Infinity, or a number overflowing to infinity), `lone_surrogate`, "
    f"`number_too_long` or `too_deep` (more than {MAX_DEPTH} nested arrays/objects)",
    "unauthenticated": "no bearer token, or one that is not valid",
    "authentication_unavailable": "the token could not be verified right now (TokenReview failed); retry",
    "database_unavailable": "Postgres is unavailable; retry after `Retry-After`",
    "forbidden": "no such stream, or the caller may not do this on it (the same answer for both)",
    "placement_violation": "the pins do not allow this from here (client egress region, metadata home)",
    "consumer_scope_mismatch": "the consumer id belongs to another stream",
    "not_found": "no such object intent, or no record at that sequence",
    "pins_conflict": "the stream exists with other pins; pins are immutable",
    "stream_closed": "the stream is closed",
    "idempotency_key_reused": "the idempotency key was used for a different request",
    "ack_regression": "acknowledgements only advance",
    "quota_exhausted": "the stream's lifetime total is reached",
    "not_an_input_stream": "deliveries exist only for input streams",
    "object_evidence_mismatch": "what S3 holds disagrees with the intent",
    "intent_state": "the intent is in a state that does not allow this",
    "intent_expired": "the intent expired; prepare again",
    "stream_held": "a legal hold prevents this",
    "cursor_expired": "retention removed the records after the cursor: resync from `earliest`",
    "future_cursor": "the cursor is past the latest sequence",
    "future_sequence": "the acknowledged sequence is past the latest",
    "payload_too_large": f"the request body is over {MAX_REQUEST_BYTES}, an inline payload over "
    f"{INLINE_LIMIT} bytes, or an object over {MAX_OBJECT_BYTES} bytes",
    "request_timeout": "the body arrived too slowly",
    "invalid_definition": "the pins are invalid (`errors` lists each field)",
    "forbidden_content_class": "this content class may not be stored",
    "batch_exceeds_credit": "the batch alone is larger than the unread ceiling: split it",
    "object_mismatch": "the uploaded bytes are not what was prepared (size or sha256)",
    "backpressure": "the unread ceiling is reached: retry after `Retry-After`",
    "too_many_subscriptions": "too many open subscriptions for this principal on this replica",
    "object_region_unavailable": "no object store is configured for the region (in `workflow-streams dev`: "
    "not yet, while MinIO is being built)",
    "object_exceeds_credit": "the object is larger than the stream's `credit.max_unread_bytes`: it could never "
    "be committed (`limit` is the ceiling)",
    "not_an_object": "the record holds its payload inline (read it with `GET …/records`)",
    "object_gone": "the record was pruned and its object deleted since it was read",
    "range_not_satisfiable": "the `Range` starts past the object's end (`Content-Range: bytes */<size>`)",
}

# every operation can answer these
ALWAYS = ("unauthenticated", "authentication_unavailable", "database_unavailable")
# every operation with a JSON body
BODY = ("invalid_input", "invalid_json", "payload_too_large", "request_timeout")
# every operation on one stream: its path ids, and a stream that does not exist or is not visible
ON_STREAM = ("invalid_input", "forbidden")

HEADERS = {
    "Retry-After": {
        "description": "seconds to wait before retrying",
        "schema": {"type": "integer", "minimum": 0},
    },
    "Location": {"description": "the stream's URL", "schema": {"type": "string"}},
    "Idempotent-Replayed": {
        "description": "`true`: a retry with the same Idempotency-Key; the original sequences are returned",
        "schema": {"type": "string", "enum": ["true"]},
    },
    "WWW-Authenticate": {"description": "the bearer challenge", "schema": {"type": "string"}},
    "Content-Length": {"description": "the bytes in this response", "schema": {"type": "integer", "minimum": 0}},
    "Content-Range": {
        "description": "the bytes sent, `bytes <first>-<last>/<size>`",
        "schema": {"type": "string", "pattern": "^bytes [0-9]+-[0-9]+/[0-9]+$"},
    },
    "Repr-Digest": {
        "description": "the SHA-256 of the whole object (RFC 9530), `sha-256=:<base64>:`, on partial responses too",
        "schema": {"type": "string"},
    },
    "Accept-Ranges": {"description": "`bytes`: one byte range may be asked for", "schema": {"type": "string"}},
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


def _path_param(name: str, example: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": f"`{name}`: 1-128 characters, letters, digits, `.`, `_`, `-`; not starting with `.`/`_`/`-`",
        "schema": ID,
        "example": example,
    }


RUN = _path_param("run_id", "r")
STREAM_PARAMS = [RUN, _path_param("stream_id", "s")]
INTENT_PARAM = {
    "name": "intent_id",
    "in": "path",
    "required": True,
    "description": "the intent's id, from prepare",
    "schema": {"type": "string", "format": "uuid"},
}
SEQUENCE_PARAM = {
    "name": "sequence",
    "in": "path",
    "required": True,
    "description": "the object record's sequence",
    "schema": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    "example": 1,
}
RANGE = {
    "name": "Range",
    "in": "header",
    "description": "one byte range, `bytes=<first>-[<last>]` or `bytes=-<suffix>` (RFC 9110); other forms are "
    "ignored and the whole object is sent",
    "schema": {"type": "string"},
}
CONSUMER_PARAM = {
    "name": "consumer_id",
    "in": "path",
    "required": True,
    "description": "the consumer's id; it belongs to the first stream it acknowledged on",
    "schema": ID,
    "example": "c1",
}
AFTER = {
    "name": "after",
    "in": "query",
    "description": "exclusive cursor: records with a sequence greater than this (default 0)",
    "schema": SEQUENCE,
}
LIMIT = {
    "name": "limit",
    "in": "query",
    "description": "page size (default 100)",
    "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
}
RECORDS_LIMIT = {
    "name": "limit",
    "in": "query",
    "description": "the most records a page holds (default 100); a reader catching up asks for many",
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_READ_RECORDS},
}
MAX_BYTES = {
    "name": "max_bytes",
    "in": "query",
    "description": "about the most bytes of records a page holds (their stored sizes; at least one record)",
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_READ_BYTES, "default": DEFAULT_READ_BYTES},
}
LIST_AFTER = {
    "name": "after",
    "in": "query",
    "description": "exclusive cursor: streams whose id sorts after this one (`next_after` of the previous page)",
    "schema": ID,
}
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "description": "a retry with the same key and the same records appends nothing and answers the original "
    "sequences; the same key with other records is `409 idempotency_key_reused`",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x20-\\x7e]+$"},
}
LAST_EVENT_ID = {
    "name": "Last-Event-ID",
    "in": "header",
    "description": "resume after this sequence; wins over `after` (a browser's EventSource sends it on reconnect)",
    "schema": {"type": "string", "pattern": "^[0-9]+$"},
}
ACCESS_TOKEN = {
    "name": "access_token",
    "in": "query",
    "description": "the bearer token, for browsers' EventSource, which cannot send headers (RFC 6750 §2.3); "
    "the Authorization header wins when both are sent",
    "schema": {"type": "string"},
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"required": True, "description": description, "content": _json(schema)}


def _ok(
    status: str, schema: dict[str, Any], description: str, headers: tuple[str, ...] = ()
) -> dict[str, dict[str, Any]]:
    response: dict[str, Any] = {"description": description, "content": _json(schema)}
    if headers:
        response["headers"] = {name: HEADERS[name] for name in headers}
    return {status: response}


def _binary(status: str, description: str, headers: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Bytes of any content type: an object is served with the content type it was prepared with."""
    return {
        status: {
            "description": description,
            "headers": {name: HEADERS[name] for name in headers},
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        }
    }


def _problems(*codes: str) -> dict[str, dict[str, Any]]:
    """One response per status, listing its codes (in the description, and as an enum on ``code``)."""
    by_status: dict[int, list[str]] = {}
    for code in dict.fromkeys((*ALWAYS, *codes)):  # ordered, without repeats
        by_status.setdefault(CODE_STATUS[code], []).append(code)
    responses = {}
    for status, status_codes in sorted(by_status.items()):
        described = "; ".join(f"`{code}`: {CODE_MEANING[code]}" for code in status_codes)
        schema = {"allOf": [_ref("Problem"), {"properties": {"code": {"enum": status_codes}}}]}
        response: dict[str, Any] = {
            "description": f"problem: {described}",
            "content": {"application/problem+json": {"schema": schema}},
        }
        if status in (429, 503):
            response["headers"] = {"Retry-After": HEADERS["Retry-After"]}
        elif status == 401:
            response["headers"] = {"WWW-Authenticate": HEADERS["WWW-Authenticate"]}
        responses[str(status)] = response
    return responses


def _operation(
    operation_id: str,
    tag: str,
    summary: str,
    description: str,
    params: list[dict[str, Any]],
    responses: dict[str, Any],
    **more: Any,
) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "tags": [tag],
        "summary": summary,
        "description": description,
        "parameters": params,
        "responses": responses,
        **more,
    }


def _schemas() -> dict[str, Any]:
    pins = StreamPins.model_json_schema(ref_template=REF + "{model}")
    defs = pins.pop("$defs", {})
    record_in = {
        "type": "object",
        "additionalProperties": False,
        "description": "exactly one of `data` or `data_base64`",
        "properties": {
            "content_type": {"type": "string", "maxLength": 255, "default": "application/json"},
            "data": {"description": f"JSON payload, for JSON content types (at most {INLINE_LIMIT} bytes encoded)"},
            "data_base64": {"type": "string", "format": "byte", "description": "bytes of any content type"},
        },
    }
    state = {
        "type": "object",
        "required": ["last_sequence", "earliest_sequence", "closed", "legal_hold"],
        "properties": {
            "last_sequence": {**SEQUENCE, "description": "the latest sequence (0 before the first append)"},
            "earliest_sequence": {**SEQUENCE, "description": "the earliest retained sequence"},
            "appended_bytes": {"type": "integer", "minimum": 0},
            "closed": {"type": "boolean"},
            "closed_at": {"type": ["string", "null"], "format": "date-time"},
            "closed_by": {"type": ["string", "null"]},
            "legal_hold": {"type": "boolean", "description": "any hold is active"},
            "legal_holds": {"type": "array", "items": _ref("LegalHoldEntry")},
        },
    }
    definition = {
        "type": "object",
        "required": ["run_id", "stream_id", "pins", "pins_digest"],
        "properties": {
            "run_id": ID,
            "stream_id": ID,
            "pins": _ref("StreamPins"),
            "pins_digest": {"type": "string"},
            "created_at": TIMESTAMP,
            "created_by": {"type": "string"},
        },
    }
    return {
        **defs,
        "StreamPins": pins,
        "Problem": {
            "type": "object",
            "description": "RFC 9457 problem details with a stable `code`; some codes add fields "
            "(`field`, `rule`, `limit`, `requested`, `earliest`, `latest`, `errors`, ...)",
            "required": ["type", "title", "status", "code", "detail"],
            "properties": {
                "type": {"type": "string", "description": "`urn:workflow-streams:problem:<code>`"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "code": {"type": "string"},
                "detail": {"type": "string"},
                "field": {"type": "string", "description": "the parameter, header or field at fault"},
                "rule": {"type": "string", "description": "`invalid_json`: which JSON rule the body breaks"},
            },
        },
        "CreateStream": {
            "type": "object",
            "additionalProperties": False,
            "required": ["stream_id", "pins"],
            "properties": {"stream_id": ID, "pins": _ref("StreamPins")},
        },
        "Definition": definition,
        "LegalHoldEntry": {
            "type": "object",
            "properties": {
                "hold_id": ID,
                "reason": {"type": "string"},
                "held_by": {"type": "string"},
                "held_at": TIMESTAMP,
            },
        },
        "StreamState": state,
        "Stream": {
            "allOf": [definition, {"type": "object", "required": ["state"], "properties": {"state": state}}],
        },
        "StreamList": {
            "type": "object",
            "required": ["streams", "next_after"],
            "properties": {
                "streams": {"type": "array", "items": _ref("Stream")},
                "next_after": {
                    "type": ["string", "null"],
                    "description": "pass as `after` for the next page; null on the last page",
                },
            },
        },
        "RecordIn": record_in,
        "Append": {
            "oneOf": [
                _ref("RecordIn"),
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["records"],
                    "properties": {
                        "records": {"type": "array", "items": _ref("RecordIn"), "minItems": 1, "maxItems": MAX_BATCH}
                    },
                },
            ]
        },
        "AppendResult": {
            "type": "object",
            "required": ["first_sequence", "last_sequence", "sequences"],
            "properties": {
                "first_sequence": SEQUENCE,
                "last_sequence": SEQUENCE,
                "sequences": {"type": "array", "items": SEQUENCE},
            },
        },
        "Record": {
            "type": "object",
            "required": ["sequence", "kind", "content_type", "size", "appended_at"],
            "properties": {
                "sequence": SEQUENCE,
                "kind": {"type": "string", "enum": ["inline", "object"]},
                "content_type": {"type": "string"},
                "size": {"type": "integer", "minimum": 0},
                "appended_at": TIMESTAMP,
                "data": {"description": "inline JSON content"},
                "data_base64": {"type": "string", "format": "byte", "description": "inline other content"},
                "object": {"type": "object", "description": "where an object record's bytes are"},
            },
        },
        "Page": {
            "type": "object",
            "required": ["records", "next_after", "earliest", "latest", "closed"],
            "properties": {
                "records": {"type": "array", "items": _ref("Record")},
                "next_after": {**SEQUENCE, "description": "the cursor for the next page"},
                "earliest": SEQUENCE,
                "latest": SEQUENCE,
                "closed": {"type": "boolean"},
            },
        },
        "CloseEvent": {
            "type": "object",
            "required": ["last_sequence"],
            "properties": {"last_sequence": SEQUENCE},
        },
        "ErrorEvent": {
            "type": "object",
            "description": "why the subscription ends, e.g. `cursor_expired` with `requested`, `earliest`, `latest`",
            "required": ["code", "detail"],
            "properties": {"code": {"type": "string"}, "detail": {"type": "string"}},
        },
        "Ack": {
            "type": "object",
            "additionalProperties": False,
            "required": ["sequence"],
            "properties": {"sequence": SEQUENCE},
        },
        "AckResult": {
            "type": "object",
            "required": ["consumer_id", "acked_sequence"],
            "properties": {"consumer_id": ID, "acked_sequence": SEQUENCE},
        },
        "LegalHold": {
            "type": "object",
            "additionalProperties": False,
            "required": ["enabled"],
            "properties": {
                "enabled": {"type": "boolean"},
                "reason": {"type": "string", "maxLength": 1024, "description": "required when enabling"},
                "hold_id": {**ID, "default": "default"},
            },
        },
        "Prepare": {
            "type": "object",
            "additionalProperties": False,
            "required": ["idempotency_key", "sha256", "size"],
            "properties": {
                "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 255},
                "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                "size": {"type": "integer", "minimum": 1, "maximum": MAX_OBJECT_BYTES},
                "content_type": {"type": "string", "maxLength": 255, "default": "application/octet-stream"},
                "schema_ref": {"type": "string", "maxLength": 512},
                "region": {"type": "string", "description": "one of the stream's object regions"},
                "expires_in_seconds": {"type": "integer", "minimum": 1, "maximum": 604800},
            },
        },
        "Intent": {
            "type": "object",
            "required": ["intent_id", "state"],
            "properties": {
                "intent_id": {"type": "string", "format": "uuid"},
                "state": {"type": "string", "enum": ["prepared", "uploaded", "committed", "aborted", "expired"]},
                "run_id": ID,
                "stream_id": ID,
                "idempotency_key": {"type": "string"},
                "region": {"type": "string"},
                "bucket": {"type": "string"},
                "object_key": {"type": "string"},
                "sha256": {"type": "string"},
                "size": {"type": "integer"},
                "content_type": {"type": "string"},
                "schema_ref": {"type": ["string", "null"]},
                "authorization_receipt": {},
                "expires_at": TIMESTAMP,
                "committed_sequence": {"type": ["integer", "null"]},
                "upload_url": {"type": "string", "description": "prepare only: where to PUT the bytes"},
            },
        },
        "CommitResult": {
            "type": "object",
            "required": ["intent_id", "sequence"],
            "properties": {"intent_id": {"type": "string", "format": "uuid"}, "sequence": SEQUENCE},
        },
        "AbortResult": {
            "type": "object",
            "required": ["intent_id", "state"],
            "properties": {"intent_id": {"type": "string", "format": "uuid"}, "state": {"type": "string"}},
        },
        "Deliveries": {
            "type": "object",
            "required": ["counts", "failed", "next"],
            "properties": {
                "counts": {
                    "type": "object",
                    "properties": {
                        "pending": {"type": "integer"},
                        "delivered": {"type": "integer"},
                        "failed": {"type": "integer"},
                    },
                },
                "failed": {
                    "type": "array",
                    "description": "failed rows (at most 100); they hold back the rows behind them",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sequence": SEQUENCE,
                            "event_id": {"type": "string", "format": "uuid"},
                            "attempts": {"type": "integer"},
                            "last_error": {"type": ["string", "null"]},
                        },
                    },
                },
                "next": {
                    "description": "the next pending row, if any",
                    "oneOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "properties": {
                                "sequence": SEQUENCE,
                                "attempts": {"type": "integer"},
                                "next_attempt_at": TIMESTAMP,
                                "last_error": {"type": ["string", "null"]},
                            },
                        },
                    ],
                },
            },
        },
        "Requeued": {
            "type": "object",
            "required": ["requeued"],
            "properties": {"requeued": {"type": "integer", "minimum": 0}},
        },
    }


SSE_DESCRIPTION = """A `text/event-stream` (Server-Sent Events). It opens with `retry: 1000`, then:

- `event: record`, `id: <sequence>`, `data: <Record as JSON>` for each record after the cursor, in order;
- `: heartbeat` comments while the stream is idle (every `WFS_SSE_HEARTBEAT_SECONDS`);
- `event: close`, `data: {"last_sequence": N}` once a closed stream is drained; the response ends;
- `event: error`, `data: {"code": ..., "detail": ...}` when the subscription cannot go on (e.g.
  `cursor_expired` once retention pruned past it); the response ends.

The response also ends after `WFS_SSE_MAX_CONNECTION_SECONDS`; reconnect with `Last-Event-ID` to
resume without a gap or a duplicate. The `x-sse-events` extension names each event's data schema."""

SSE_EXAMPLE = 'retry: 1000\n\nid: 1\nevent: record\ndata: {"sequence":1,"kind":"inline",...}\n\n: heartbeat\n\n'


def document() -> dict[str, Any]:
    s = "/runs/{run_id}/streams/{stream_id}"
    intent = s + "/objects/{intent_id}"
    paths: dict[str, Any] = {
        "/runs/{run_id}/streams": {
            "post": _operation(
                "createStream",
                "streams",
                "Create a stream definition (idempotent for the same pins)",
                "Creates the stream, or answers the existing one if its pins are the same (200). Pins are "
                "immutable: other pins are `409 pins_conflict`.",
                [RUN],
                {
                    **_ok("201", _ref("Definition"), "created", ("Location",)),
                    **_ok("200", _ref("Definition"), "it already exists with these pins", ("Location",)),
                    **_problems(
                        *BODY,
                        "forbidden",
                        "placement_violation",
                        "pins_conflict",
                        "invalid_definition",
                        "forbidden_content_class",
                    ),
                },
                requestBody=_json_body(_ref("CreateStream"), "the stream id and its pins"),
            ),
            "get": _operation(
                "listStreams",
                "streams",
                "List the run's streams the caller may see",
                "Streams in stream-id order, each with its state. Streams the caller has no right on are "
                "left out without a trace. Pass `next_after` as `after` for the next page; it is null on "
                "the last page.",
                [RUN, LIST_AFTER, LIMIT],
                {**_ok("200", _ref("StreamList"), "a page of streams"), **_problems("invalid_input")},
            ),
        },
        s: {
            "get": _operation(
                "getStream",
                "streams",
                "A definition and its state",
                "Any right on the stream lets a principal read its definition.",
                STREAM_PARAMS,
                {**_ok("200", _ref("Stream"), "the definition and state"), **_problems(*ON_STREAM)},
            )
        },
        s + "/records": {
            "post": _operation(
                "appendRecords",
                "records",
                "Append one record or a batch (all or nothing)",
                f'One record object, or `{{"records": [...]}}` with at most {MAX_BATCH}. Inline payloads '
                f"are at most {INLINE_LIMIT} bytes. The body must be strict JSON (no NaN or infinities, "
                f"no lone surrogates, at most {MAX_DEPTH} levels deep).",
                [*STREAM_PARAMS, IDEMPOTENCY_KEY],
                {
                    **_ok("201", _ref("AppendResult"), "appended"),
                    **_ok("200", _ref("AppendResult"), "an idempotent replay", ("Idempotent-Replayed",)),
                    **_problems(
                        *BODY,
                        *ON_STREAM,
                        "stream_closed",
                        "idempotency_key_reused",
                        "quota_exhausted",
                        "batch_exceeds_credit",
                        "backpressure",
                    ),
                },
                requestBody=_json_body(_ref("Append"), "a record or a batch"),
            ),
            "get": _operation(
                "readRecords",
                "records",
                "Records with sequence > after, ascending",
                "`after` past `latest` is `400 future_cursor`; if retention removed `after + 1`, "
                "`410 cursor_expired`: resync from `earliest`.",
                [*STREAM_PARAMS, AFTER, RECORDS_LIMIT, MAX_BYTES],
                {
                    **_ok("200", _ref("Page"), "a page of records"),
                    **_problems(*ON_STREAM, "placement_violation", "future_cursor", "cursor_expired"),
                },
            ),
        },
        s + "/subscribe": {
            "get": _operation(
                "subscribe",
                "records",
                "Follow the stream as Server-Sent Events",
                "Backfills from the cursor, then follows. Cursor and rights errors are plain HTTP "
                "problems before the event stream starts.",
                [*STREAM_PARAMS, AFTER, LAST_EVENT_ID, ACCESS_TOKEN],
                {
                    "200": {
                        "description": SSE_DESCRIPTION,
                        "content": {
                            "text/event-stream": {
                                "schema": {"type": "string"},
                                "example": SSE_EXAMPLE,
                                "x-sse-events": {
                                    "record": {"id": "the record's sequence", "data": _ref("Record")},
                                    "close": {"data": _ref("CloseEvent")},
                                    "error": {"data": _ref("ErrorEvent")},
                                    "heartbeat": {"comment": ": heartbeat"},
                                },
                            }
                        },
                    },
                    **_problems(
                        *ON_STREAM, "placement_violation", "future_cursor", "cursor_expired", "too_many_subscriptions"
                    ),
                },
            ),
        },
        s + "/consumers/{consumer_id}/ack": {
            "post": _operation(
                "ack",
                "consumers",
                "Acknowledge through a sequence",
                "Acks only advance; an ack returns credit to producers.",
                [*STREAM_PARAMS, CONSUMER_PARAM],
                {
                    **_ok("200", _ref("AckResult"), "acknowledged"),
                    **_problems(*BODY, *ON_STREAM, "consumer_scope_mismatch", "future_sequence", "ack_regression"),
                },
                requestBody=_json_body(_ref("Ack"), "the sequence acknowledged"),
            ),
        },
        s + "/close": {
            "post": _operation(
                "closeStream",
                "streams",
                "Close the stream",
                "After close, appends are `409 stream_closed`; reads and subscriptions drain what is there.",
                STREAM_PARAMS,
                {**_ok("200", _ref("StreamState"), "closed (also if it already was)"), **_problems(*ON_STREAM)},
            )
        },
        s + "/legal-hold": {
            "put": _operation(
                "setLegalHold",
                "streams",
                "Place or release a legal hold",
                "Holds stack (one per `hold_id`); while any is active the pruner leaves the stream alone.",
                STREAM_PARAMS,
                {
                    **_ok("200", _ref("StreamState"), "the stream's state after the change"),
                    **_problems(*BODY, *ON_STREAM, "object_region_unavailable"),
                },
                requestBody=_json_body(_ref("LegalHold"), "the hold"),
            ),
        },
        s + "/deliveries": {
            "get": _operation(
                "getDeliveries",
                "deliveries",
                "Input delivery progress",
                "Counts by state, failed rows (they block the stream) and the next due row. Input streams "
                "only: an output stream is `409 not_an_input_stream`.",
                STREAM_PARAMS,
                {
                    **_ok("200", _ref("Deliveries"), "delivery progress"),
                    **_problems(*ON_STREAM, "not_an_input_stream"),
                },
            )
        },
        s + "/deliveries/requeue": {
            "post": _operation(
                "requeueDeliveries",
                "deliveries",
                "Retry failed deliveries",
                "Failed rows become pending again, in order. Input streams only.",
                STREAM_PARAMS,
                {
                    **_ok("200", _ref("Requeued"), "how many rows were requeued"),
                    **_problems(*ON_STREAM, "not_an_input_stream"),
                },
            )
        },
        s + "/objects/prepare": {
            "post": _operation(
                "prepareObject",
                "objects",
                "Prepare an object upload",
                "Pins idempotency key, sha256, size and content type; the server picks bucket and key. An "
                "object that could never be committed (larger than `credit.max_unread_bytes`, or past a "
                "lifetime total) is refused here, before its bytes are sent.",
                STREAM_PARAMS,
                {
                    **_ok("201", _ref("Intent"), "prepared"),
                    **_ok("200", _ref("Intent"), "already prepared with this idempotency key"),
                    **_problems(
                        *BODY,
                        *ON_STREAM,
                        "stream_closed",
                        "idempotency_key_reused",
                        "object_exceeds_credit",
                        "quota_exhausted",
                        "object_region_unavailable",
                    ),
                },
                requestBody=_json_body(_ref("Prepare"), "what will be uploaded"),
            ),
        },
        s + "/records/{sequence}/object": {
            "get": _operation(
                "readObject",
                "objects",
                "Download an object record's bytes",
                "The bytes of the object record at `sequence`, streamed from S3, with its content type and "
                "`Repr-Digest` (SHA-256). The record is read as `GET …/records` reads it: the `read` right, "
                "then the caller's region against the stream's client-egress regions, and only committed, "
                "retained records (a pruned one is `410 cursor_expired`). One `Range` is honoured (`206`).",
                [*STREAM_PARAMS, SEQUENCE_PARAM, RANGE],
                {
                    **_binary("200", "the object's bytes", ("Content-Length", "Repr-Digest", "Accept-Ranges")),
                    **_binary(
                        "206", "one range of the object's bytes", ("Content-Length", "Content-Range", "Repr-Digest")
                    ),
                    **_problems(
                        *ON_STREAM,
                        "placement_violation",
                        "cursor_expired",
                        "not_found",
                        "not_an_object",
                        "object_gone",
                        "range_not_satisfiable",
                        "object_region_unavailable",
                    ),
                },
            )
        },
        intent: {
            "get": _operation(
                "getIntent",
                "objects",
                "An object intent",
                "The intent's state and pins.",
                [*STREAM_PARAMS, INTENT_PARAM],
                {**_ok("200", _ref("Intent"), "the intent"), **_problems(*ON_STREAM, "not_found")},
            )
        },
        intent + "/upload": {
            "put": _operation(
                "uploadObject",
                "objects",
                "Upload the object's bytes",
                "Streamed to S3 in parts; size and sha256 are verified before anything becomes visible.",
                [*STREAM_PARAMS, INTENT_PARAM],
                {
                    **_ok("200", _ref("Intent"), "uploaded"),
                    **_problems(
                        *ON_STREAM,
                        "not_found",
                        "request_timeout",
                        "intent_state",
                        "intent_expired",
                        "object_mismatch",
                        "object_region_unavailable",
                    ),
                },
                requestBody={
                    "required": True,
                    "description": "exactly the prepared bytes",
                    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                },
            ),
        },
        intent + "/commit": {
            "post": _operation(
                "commitObject",
                "objects",
                "Append the object record",
                "Checks S3's evidence against the intent, then appends a record under the stream's credit.",
                [*STREAM_PARAMS, INTENT_PARAM],
                {
                    **_ok("201", _ref("CommitResult"), "appended"),
                    **_ok("200", _ref("CommitResult"), "already committed"),
                    **_problems(
                        *ON_STREAM,
                        "not_found",
                        "stream_closed",
                        "intent_state",
                        "intent_expired",
                        "object_evidence_mismatch",
                        "quota_exhausted",
                        "batch_exceeds_credit",
                        "backpressure",
                        "object_region_unavailable",
                    ),
                },
            )
        },
        intent + "/abort": {
            "post": _operation(
                "abortObject",
                "objects",
                "Abort an uncommitted upload",
                "The object is queued for deletion.",
                [*STREAM_PARAMS, INTENT_PARAM],
                {**_ok("200", _ref("AbortResult"), "aborted"), **_problems(*ON_STREAM, "not_found", "intent_state")},
            )
        },
    }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "workflow-streams",
            "version": "v1",
            "description": "Durable, strictly ordered data streams for workflow runs. Errors are "
            "`application/problem+json` with a stable `code`; each operation lists its codes. Request "
            f"bodies are strict JSON (RFC 8259) of at most {MAX_REQUEST_BYTES}: NaN, infinities, lone "
            f"surrogates and nesting deeper than {MAX_DEPTH} levels are `400 invalid_json`.",
        },
        "servers": [{"url": API_PREFIX}],
        "security": [{"bearer": []}],
        "tags": [
            {"name": "streams", "description": "definitions, listing, close, legal holds"},
            {"name": "records", "description": "append, read, subscribe"},
            {"name": "consumers", "description": "acknowledgements (they return credit)"},
            {"name": "deliveries", "description": "input streams' delivery outbox"},
            {"name": "objects", "description": "large payloads through S3"},
        ],
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def serve(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


OPENAPI = web.AppKey("workflow_streams_openapi", dict[str, Any])
