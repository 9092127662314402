"""The OpenAPI 3.1 document of the HTTP surface, served at /api/workflow-streams/openapi.json.

Read it top to bottom: a small vocabulary for JSON Schema (``obj``, ``array``, ``string``, ...), the
problem codes, the headers and parameters, the component schemas (``SCHEMAS``, one entry each), then
the operations (``OPERATIONS``, one ``Operation`` per route); ``document()`` assembles them.

OpenAPI 3.1 because its schemas are JSON Schema 2020-12, which is what pydantic writes for the pins.
Pins' schema comes from the pydantic model the handlers validate pins with; the other bodies are
checked by hand in the handlers (``common.json_object`` and the domain's parsers), so their schemas
are written here. Each operation lists the problem ``code``s it can answer; their statuses come from
the same table the error responses use (``problems.codes``), so a code and its documented status
cannot drift apart. Tests validate the document with openapi-spec-validator, keep its paths equal to
the router's, and run schemathesis against a server with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from aiohttp import web

from .. import API_PREFIX
from ..domain.objects import MAX_OBJECT_BYTES, TRANSITIONS
from ..domain.pins import StreamPins
from ..domain.records import INLINE_LIMIT, MAX_BATCH
from ..domain.strictjson import MAX_DEPTH
from .common import STREAM
from .objects import INTENT
from .problems import codes
from .streams import DEFAULT_LIMIT, DEFAULT_READ_BYTES, MAX_LIMIT, MAX_READ_BYTES, MAX_READ_RECORDS

OPENAPI_VERSION = "3.1.0"
MAX_REQUEST_BYTES = "4 MiB"
REF = "#/components/schemas/"

Schema = dict[str, Any]
Properties = Mapping[str, Schema]

# --- a vocabulary for JSON Schema ---------------------------------------------------------------


def ref(name: str) -> Schema:
    return {"$ref": REF + name}


def _typed(type_: str | list[str], description: str, keywords: Mapping[str, Any]) -> Schema:
    return {"type": type_, **keywords, **({"description": description} if description else {})}


def string(description: str = "", **keywords: Any) -> Schema:
    return _typed("string", description, keywords)


def integer(description: str = "", **keywords: Any) -> Schema:
    return _typed("integer", description, keywords)


def boolean(description: str = "") -> Schema:
    return _typed("boolean", description, {})


def nullable(type_: str, description: str = "", **keywords: Any) -> Schema:
    return _typed([type_, "null"], description, keywords)


def array(items: Schema, description: str = "", **keywords: Any) -> Schema:
    return _typed("array", description, {"items": items, **keywords})


def described(schema: Schema, description: str) -> Schema:
    return {**schema, "description": description}


def obj(
    required: Properties | None = None,
    optional: Properties | None = None,
    *,
    closed: bool = False,
    description: str = "",
) -> Schema:
    """An object with these required and optional properties; ``closed``: no other properties."""
    schema: Schema = {"type": "object"}
    if description:
        schema["description"] = description
    if closed:
        schema["additionalProperties"] = False
    if required:
        schema["required"] = list(required)
    if required or optional:
        schema["properties"] = {**(required or {}), **(optional or {})}
    return schema


ID = string(pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SEQUENCE = integer(minimum=0, maximum=2**63 - 1)
TIMESTAMP = string(format="date-time")
UUID = string(format="uuid")

# --- problem codes ------------------------------------------------------------------------------

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
    "not_found": "no such object intent, no record at that sequence, or no such pins template",
    "pins_conflict": "the stream exists with other pins (`differing_fields` names them); pins are immutable",
    "stream_closed": "the stream is closed",
    "idempotency_key_reused": "the idempotency key was used for a different request",
    "ack_regression": "acknowledgements only advance",
    "quota_exhausted": "the stream's lifetime total is reached",
    "not_an_input_stream": "deliveries exist only for input streams",
    "object_evidence_mismatch": "what S3 holds disagrees with the intent",
    "intent_state": "the intent is in a state that does not allow this",
    "intent_expired": "the intent expired; prepare again",
    "stream_held": "a legal hold prevents this",
    "owned_elsewhere": "the stream belongs to a WorkflowStream object (`owner` names it): delete that object",
    "cursor_expired": "retention removed the records after the cursor: resync from `earliest`",
    "future_cursor": "the cursor is past the latest sequence",
    "future_sequence": "the acknowledged sequence is past the latest",
    "payload_too_large": f"the request body is over {MAX_REQUEST_BYTES}, an inline payload over "
    f"{INLINE_LIMIT} bytes, or an object over {MAX_OBJECT_BYTES} bytes",
    "request_timeout": "the body arrived too slowly",
    "invalid_definition": "the pins are invalid, or would make a stream nobody can read or append to, or whose "
    "regions this data plane cannot serve (`errors` lists each field)",
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

# --- headers and parameters ---------------------------------------------------------------------

HEADERS: dict[str, Schema] = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": integer(minimum=0)},
    "Location": {"description": "the stream's URL", "schema": string()},
    "Idempotent-Replayed": {
        "description": "`true`: a retry with the same Idempotency-Key; the original sequences are returned",
        "schema": string(enum=["true"]),
    },
    "WWW-Authenticate": {"description": "the bearer challenge", "schema": string()},
    "Content-Length": {"description": "the bytes in this response", "schema": integer(minimum=0)},
    "Content-Range": {
        "description": "the bytes sent, `bytes <first>-<last>/<size>`",
        "schema": string(pattern="^bytes [0-9]+-[0-9]+/[0-9]+$"),
    },
    "Repr-Digest": {
        "description": "the SHA-256 of the whole object (RFC 9530), `sha-256=:<base64>:`, on partial responses too",
        "schema": string(),
    },
    "Accept-Ranges": {"description": "`bytes`: one byte range may be asked for", "schema": string()},
}


def _parameter(where: str, name: str, description: str, schema: Schema, **more: Any) -> Schema:
    required = {"required": True} if where == "path" else {}
    return {"name": name, "in": where, **required, "description": description, "schema": schema, **more}


def _id_in_path(name: str, example: str) -> Schema:
    description = f"`{name}`: 1-128 characters, letters, digits, `.`, `_`, `-`; not starting with `.`/`_`/`-`"
    return _parameter("path", name, description, ID, example=example)


RUN = _id_in_path("run_id", "r")
STREAM_PARAMS = (RUN, _id_in_path("stream_id", "s"))
INTENT_PARAM = _parameter("path", "intent_id", "the intent's id, from prepare", UUID)
SEQUENCE_PARAM = _parameter(
    "path", "sequence", "the object record's sequence", integer(minimum=1, maximum=2**63 - 1), example=1
)
CONSUMER_PARAM = _parameter(
    "path", "consumer_id", "the consumer's id; it belongs to the first stream it acknowledged on", ID, example="c1"
)
AFTER = _parameter(
    "query", "after", "exclusive cursor: records with a sequence greater than this (default 0)", SEQUENCE
)
LIMIT = _parameter("query", "limit", f"page size (default {DEFAULT_LIMIT})", integer(minimum=1, maximum=MAX_LIMIT))
RECORDS_LIMIT = _parameter(
    "query",
    "limit",
    f"the most records a page holds (default {MAX_READ_RECORDS}: the page is sized by `max_bytes`)",
    integer(minimum=1, maximum=MAX_READ_RECORDS),
)
MAX_BYTES = _parameter(
    "query",
    "max_bytes",
    "about the most bytes of records a page holds (their stored sizes; at least one record)",
    integer(minimum=1, maximum=MAX_READ_BYTES, default=DEFAULT_READ_BYTES),
)
LIST_AFTER = _parameter(
    "query",
    "after",
    "exclusive cursor: streams whose id sorts after this one (`next_after` of the previous page)",
    ID,
)
RANGE = _parameter(
    "header",
    "Range",
    "one byte range, `bytes=<first>-[<last>]` or `bytes=-<suffix>` (RFC 9110); other forms are "
    "ignored and the whole object is sent",
    string(),
)
IDEMPOTENCY_KEY = _parameter(
    "header",
    "Idempotency-Key",
    "a retry with the same key and the same records appends nothing and answers the original "
    "sequences; the same key with other records is `409 idempotency_key_reused`",
    string(minLength=1, maxLength=255, pattern="^[\\x20-\\x7e]+$"),
)
LAST_EVENT_ID = _parameter(
    "header",
    "Last-Event-ID",
    "resume after this sequence; wins over `after` (a browser's EventSource sends it on reconnect)",
    string(pattern="^[0-9]+$"),
)
ACCESS_TOKEN = _parameter(
    "query",
    "access_token",
    "the bearer token, for browsers' EventSource, which cannot send headers (RFC 6750 §2.3); "
    "the Authorization header wins when both are sent",
    string(),
)

# --- component schemas: one entry each (the pins' come from their pydantic model) ---------------

STREAM_DETAIL = {
    "unread": obj(
        description="what waits unread after the slowest consumer's ack, against the credit ceilings: the "
        "numbers appends are refused by (`full`: at a ceiling, appends block or get `429 backpressure`)",
        required={
            "items": integer(minimum=0),
            "bytes": integer(minimum=0),
            "max_items": integer(minimum=1),
            "max_bytes": integer(minimum=1),
            "after_sequence": described(SEQUENCE, "unread starts after this sequence"),
            "full": boolean(),
        },
    ),
    "total": obj(
        description="what the stream appended in its life, against its lifetime ceilings (null: none)",
        required={
            "items": integer(minimum=0),
            "bytes": integer(minimum=0),
            "max_items": nullable("integer"),
            "max_bytes": nullable("integer"),
        },
    ),
    "consumers": array(
        obj(
            required={"consumer_id": ID, "acked_sequence": SEQUENCE, "lag": integer(minimum=0)},
            optional={"updated_at": TIMESTAMP, "updated_by": string()},
        ),
        "every consumer, slowest first; `lag` is how many records it has not acknowledged",
    ),
    "deliveries": {
        "description": "input streams: deliveries to the wait service by state; null for output streams",
        "oneOf": [
            {"type": "null"},
            obj(
                required={"pending": integer(minimum=0), "delivered": integer(minimum=0), "failed": integer(minimum=0)}
            ),
        ],
    },
    "objects_in_flight": obj(
        description="object intents not yet committed, by state",
        required={"prepared": integer(minimum=0), "uploaded": integer(minimum=0)},
    ),
    "owner": {
        "description": "the WorkflowStream object that owns the stream; null for a stream made over HTTP",
        "oneOf": [
            {"type": "null"},
            obj(required={"kind": string(), "namespace": string(), "name": string(), "uid": string()}),
        ],
    },
}
STREAM_STATE = obj(
    required={
        "last_sequence": described(SEQUENCE, "the latest sequence (0 before the first append)"),
        "earliest_sequence": described(SEQUENCE, "the earliest retained sequence"),
        "closed": boolean(),
        "legal_hold": boolean("any hold is active"),
    },
    optional={
        "appended_bytes": integer(minimum=0),
        "closed_at": nullable("string", format="date-time"),
        "closed_by": nullable("string"),
        "legal_holds": array(ref("LegalHoldEntry")),
        **STREAM_DETAIL,
    },
)
DEFINITION = obj(
    required={"run_id": ID, "stream_id": ID, "pins": ref("StreamPins"), "pins_digest": string()},
    optional={"created_at": TIMESTAMP, "created_by": string()},
)

SCHEMAS: dict[str, Schema] = {
    "Problem": obj(
        description="RFC 9457 problem details with a stable `code`; some codes add fields "
        "(`field`, `rule`, `limit`, `requested`, `earliest`, `latest`, `errors`, ...)",
        required={
            "type": string("`urn:workflow-streams:problem:<code>`"),
            "title": string(),
            "status": integer(),
            "code": string(),
            "detail": string(),
        },
        optional={
            "field": string("the parameter, header or field at fault"),
            "rule": string("`invalid_json`: which JSON rule the body breaks"),
        },
    ),
    "CreateStream": obj(
        closed=True,
        description="`stream_id` alone makes the stream from the default template; `template` names another "
        "(`GET /templates`); `pins` without a template are the whole pins, with one they are merged over it",
        required={"stream_id": ID},
        optional={
            "template": string("the name of a pins template", minLength=1, maxLength=128),
            "pins": {
                "type": "object",
                "description": "the whole pins (`StreamPins`), or with `template` the pins to change in it",
            },
        },
    ),
    "DeleteResult": obj(
        required={"run_id": ID, "stream_id": ID, "deleted": boolean(), "objects_queued": integer(minimum=0)}
    ),
    "RunList": obj(
        required={
            "runs": array(
                obj(
                    required={
                        "run_id": ID,
                        "streams": described(integer(minimum=1), "streams the caller may see in the run"),
                        "latest_created_at": TIMESTAMP,
                    }
                )
            ),
            "next_after": nullable("string", "pass as `after` for the next page; null on the last page"),
        }
    ),
    "TemplateList": obj(
        required={
            "templates": array(
                obj(
                    required={"name": string(), "description": string(), "pins": {"type": "object"}},
                    optional={
                        "namespaces": {
                            "description": "the namespaces whose WorkflowStreams may use it; null: all",
                            "oneOf": [{"type": "null"}, array(string())],
                        },
                        "resolved": ref("StreamPins"),
                    },
                )
            )
        }
    ),
    "Definition": DEFINITION,
    "LegalHoldEntry": obj(
        optional={"hold_id": ID, "reason": string(), "held_by": string(), "held_at": TIMESTAMP},
    ),
    "StreamState": STREAM_STATE,
    "Stream": {"allOf": [DEFINITION, obj(required={"state": STREAM_STATE})]},
    "StreamList": obj(
        required={
            "streams": array(ref("Stream")),
            "next_after": nullable("string", "pass as `after` for the next page; null on the last page"),
        },
    ),
    "RecordIn": obj(
        closed=True,
        description="exactly one of `data` or `data_base64`",
        optional={
            "content_type": string(maxLength=255, default="application/json"),
            "data": {"description": f"JSON payload, for JSON content types (at most {INLINE_LIMIT} bytes encoded)"},
            "data_base64": string("bytes of any content type", format="byte"),
        },
    ),
    "Append": {
        "oneOf": [
            ref("RecordIn"),
            obj(closed=True, required={"records": array(ref("RecordIn"), minItems=1, maxItems=MAX_BATCH)}),
        ]
    },
    "AppendResult": obj(
        required={"first_sequence": SEQUENCE, "last_sequence": SEQUENCE, "sequences": array(SEQUENCE)},
    ),
    "Record": obj(
        required={
            "sequence": SEQUENCE,
            "kind": string(enum=["inline", "object"]),
            "content_type": string(),
            "size": integer(minimum=0),
            "appended_at": TIMESTAMP,
        },
        optional={
            "data": {"description": "inline JSON content"},
            "data_base64": string("inline other content", format="byte"),
            "object": obj(description="where an object record's bytes are"),
        },
    ),
    "Page": obj(
        required={
            "records": array(ref("Record")),
            "next_after": described(SEQUENCE, "the cursor for the next page"),
            "earliest": SEQUENCE,
            "latest": SEQUENCE,
            "closed": boolean(),
        },
    ),
    "CloseEvent": obj(required={"last_sequence": SEQUENCE}),
    "ErrorEvent": obj(
        description="why the subscription ends, e.g. `cursor_expired` with `requested`, `earliest`, `latest`",
        required={"code": string(), "detail": string()},
    ),
    "Ack": obj(closed=True, required={"sequence": SEQUENCE}),
    "AckResult": obj(required={"consumer_id": ID, "acked_sequence": SEQUENCE}),
    "LegalHold": obj(
        closed=True,
        required={"enabled": boolean()},
        optional={"reason": string("required when enabling", maxLength=1024), "hold_id": {**ID, "default": "default"}},
    ),
    "Prepare": obj(
        closed=True,
        required={
            "idempotency_key": string(minLength=1, maxLength=255),
            "sha256": string(pattern="^[0-9a-f]{64}$"),
            "size": integer(minimum=1, maximum=MAX_OBJECT_BYTES),
        },
        optional={
            "content_type": string(maxLength=255, default="application/octet-stream"),
            "schema_ref": string(maxLength=512),
            "region": string("one of the stream's object regions"),
            "expires_in_seconds": integer(minimum=1, maximum=604800),
        },
    ),
    "Intent": obj(
        required={"intent_id": UUID, "state": string(enum=list(TRANSITIONS))},
        optional={
            "run_id": ID,
            "stream_id": ID,
            "idempotency_key": string(),
            "region": string(),
            "bucket": string(),
            "object_key": string(),
            "sha256": string(),
            "size": integer(),
            "content_type": string(),
            "schema_ref": nullable("string"),
            "authorization_receipt": {},
            "expires_at": TIMESTAMP,
            "committed_sequence": nullable("integer"),
            "upload_url": string("prepare only: where to PUT the bytes"),
        },
    ),
    "CommitResult": obj(required={"intent_id": UUID, "sequence": SEQUENCE}),
    "AbortResult": obj(required={"intent_id": UUID, "state": string()}),
    "Deliveries": obj(
        required={
            "counts": obj(optional={"pending": integer(), "delivered": integer(), "failed": integer()}),
            "failed": array(
                obj(
                    optional={
                        "sequence": SEQUENCE,
                        "event_id": UUID,
                        "attempts": integer(),
                        "last_error": nullable("string"),
                    }
                ),
                "failed rows (at most 100); they hold back the rows behind them",
            ),
            "next": {
                "description": "the next pending row, if any",
                "oneOf": [
                    {"type": "null"},
                    obj(
                        optional={
                            "sequence": SEQUENCE,
                            "attempts": integer(),
                            "next_attempt_at": TIMESTAMP,
                            "last_error": nullable("string"),
                        }
                    ),
                ],
            },
        },
    ),
    "Requeued": obj(required={"requeued": integer(minimum=0)}),
}


def _component_schemas() -> dict[str, Schema]:
    """The pins' schemas (StreamPins and the models it nests) from pydantic, then ``SCHEMAS``."""
    pins = StreamPins.model_json_schema(ref_template=REF + "{model}")
    return {**pins.pop("$defs", {}), "StreamPins": pins, **SCHEMAS}


# --- request bodies and responses ---------------------------------------------------------------


def json_body(schema_name: str, description: str) -> Schema:
    return {"required": True, "description": description, "content": {"application/json": {"schema": ref(schema_name)}}}


def ok(schema_name: str, description: str, *headers: str) -> Schema:
    """A JSON response with the named schema."""
    response: Schema = {"description": description, "content": {"application/json": {"schema": ref(schema_name)}}}
    if headers:
        response["headers"] = {name: HEADERS[name] for name in headers}
    return response


def binary(description: str, *headers: str) -> Schema:
    """Bytes of any content type: an object is served with the content type it was prepared with."""
    return {
        "description": description,
        "headers": {name: HEADERS[name] for name in headers},
        "content": {"*/*": {"schema": string(format="binary")}},
    }


def _problems(answered: tuple[str, ...]) -> dict[str, Schema]:
    """One response per status, listing its codes (in the description, and as an enum on ``code``)."""
    by_status: dict[int, list[str]] = {}
    for code in dict.fromkeys((*ALWAYS, *answered)):  # ordered, without repeats
        by_status.setdefault(CODE_STATUS[code], []).append(code)
    responses = {}
    for status, status_codes in sorted(by_status.items()):
        meanings = "; ".join(f"`{code}`: {CODE_MEANING[code]}" for code in status_codes)
        schema = {"allOf": [ref("Problem"), {"properties": {"code": {"enum": status_codes}}}]}
        response: Schema = {
            "description": f"problem: {meanings}",
            "content": {"application/problem+json": {"schema": schema}},
        }
        if status in (429, 503):
            response["headers"] = {"Retry-After": HEADERS["Retry-After"]}
        elif status == 401:
            response["headers"] = {"WWW-Authenticate": HEADERS["WWW-Authenticate"]}
        responses[str(status)] = response
    return responses


OBJECT_BYTES = {
    "required": True,
    "description": "exactly the prepared bytes",
    "content": {"application/octet-stream": {"schema": string(format="binary")}},
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

SSE_EVENTS = {
    "description": SSE_DESCRIPTION,
    "content": {
        "text/event-stream": {
            "schema": string(),
            "example": SSE_EXAMPLE,
            "x-sse-events": {
                "record": {"id": "the record's sequence", "data": ref("Record")},
                "close": {"data": ref("CloseEvent")},
                "error": {"data": ref("ErrorEvent")},
                "heartbeat": {"comment": ": heartbeat"},
            },
        }
    },
}

# --- the operations: one per route --------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    """One route: what it takes, what it answers on success, and the problem codes it can answer
    (besides ``ALWAYS``; their statuses come from ``CODE_STATUS``)."""

    method: str
    path: str
    operation_id: str
    tag: str
    _: KW_ONLY
    summary: str
    description: str
    parameters: tuple[Schema, ...]
    responses: Mapping[str, Schema]  # status -> response, for the successes
    problems: tuple[str, ...]
    body: Schema | None = None

    def openapi(self) -> Schema:
        operation: Schema = {
            "operationId": self.operation_id,
            "tags": [self.tag],
            "summary": self.summary,
            "description": self.description,
            "parameters": list(self.parameters),
            "responses": {**self.responses, **_problems(self.problems)},
        }
        if self.body is not None:
            operation["requestBody"] = self.body
        return operation


RUN_STREAMS = "/runs/{run_id}/streams"

OPERATIONS = (
    Operation(
        "POST",
        RUN_STREAMS,
        "createStream",
        "streams",
        summary="Create a stream definition (idempotent for the same pins)",
        description="Creates the stream, or answers the existing one if its pins are the same (200). Pins are "
        'immutable: other pins are `409 pins_conflict`. `{"stream_id": ...}` alone uses the default '
        "template: this data plane's regions and every right for the caller.",
        parameters=(RUN,),
        body=json_body("CreateStream", "the stream id, and a template or pins"),
        responses={
            "201": ok("Definition", "created", "Location"),
            "200": ok("Definition", "it already exists with these pins", "Location"),
        },
        problems=(
            *BODY,
            "forbidden",
            "placement_violation",
            "pins_conflict",
            "invalid_definition",
            "forbidden_content_class",
            "not_found",
        ),
    ),
    Operation(
        "GET",
        "/runs",
        "listRuns",
        "streams",
        summary="List the runs in which the caller may see a stream",
        description="Runs in run-id order, each with how many of its streams the caller may see. Runs with "
        "nothing visible are left out without a trace. Pass `next_after` as `after` for the next page.",
        parameters=(
            _parameter("query", "after", "exclusive cursor: runs whose id sorts after this one", ID),
            LIMIT,
        ),
        responses={"200": ok("RunList", "a page of runs")},
        problems=("invalid_input",),
    ),
    Operation(
        "GET",
        "/templates",
        "listTemplates",
        "streams",
        summary="The pins templates a create may name",
        description="Each template with the partial pins it sets and the whole pins it resolves to for the "
        "caller (`$creator` is the caller). `default` is used when a create names none.",
        parameters=(),
        responses={"200": ok("TemplateList", "the templates")},
        problems=("invalid_input",),
    ),
    Operation(
        "DELETE",
        STREAM,
        "deleteStream",
        "streams",
        summary="Delete a stream and its records",
        description="Needs the `delete` right (unset: the `close` subjects). Refused while a legal hold exists; "
        "a stream a WorkflowStream owns is deleted by deleting that object. Its objects are queued for deletion "
        "from S3; its name can be defined again.",
        parameters=STREAM_PARAMS,
        responses={"200": ok("DeleteResult", "deleted")},
        problems=(*ON_STREAM, "stream_held", "owned_elsewhere"),
    ),
    Operation(
        "GET",
        RUN_STREAMS,
        "listStreams",
        "streams",
        summary="List the run's streams the caller may see",
        description="Streams in stream-id order, each with its state. Streams the caller has no right on are "
        "left out without a trace. Pass `next_after` as `after` for the next page; it is null on "
        "the last page.",
        parameters=(RUN, LIST_AFTER, LIMIT),
        responses={"200": ok("StreamList", "a page of streams")},
        problems=("invalid_input",),
    ),
    Operation(
        "GET",
        STREAM,
        "getStream",
        "streams",
        summary="A definition and its state",
        description="Any right on the stream lets a principal read its definition.",
        parameters=STREAM_PARAMS,
        responses={"200": ok("Stream", "the definition and state")},
        problems=ON_STREAM,
    ),
    Operation(
        "POST",
        STREAM + "/records",
        "appendRecords",
        "records",
        summary="Append one record or a batch (all or nothing)",
        description=f'One record object, or `{{"records": [...]}}` with at most {MAX_BATCH}. Inline payloads '
        f"are at most {INLINE_LIMIT} bytes. The body must be strict JSON (no NaN or infinities, "
        f"no lone surrogates, at most {MAX_DEPTH} levels deep).",
        parameters=(*STREAM_PARAMS, IDEMPOTENCY_KEY),
        body=json_body("Append", "a record or a batch"),
        responses={
            "201": ok("AppendResult", "appended"),
            "200": ok("AppendResult", "an idempotent replay", "Idempotent-Replayed"),
        },
        problems=(
            *BODY,
            *ON_STREAM,
            "stream_closed",
            "idempotency_key_reused",
            "quota_exhausted",
            "batch_exceeds_credit",
            "backpressure",
        ),
    ),
    Operation(
        "GET",
        STREAM + "/records",
        "readRecords",
        "records",
        summary="Records with sequence > after, ascending",
        description="`after` past `latest` is `400 future_cursor`; if retention removed `after + 1`, "
        "`410 cursor_expired`: resync from `earliest`.",
        parameters=(*STREAM_PARAMS, AFTER, RECORDS_LIMIT, MAX_BYTES),
        responses={"200": ok("Page", "a page of records")},
        problems=(*ON_STREAM, "placement_violation", "future_cursor", "cursor_expired"),
    ),
    Operation(
        "GET",
        STREAM + "/subscribe",
        "subscribe",
        "records",
        summary="Follow the stream as Server-Sent Events",
        description="Backfills from the cursor, then follows. Cursor and rights errors are plain HTTP "
        "problems before the event stream starts.",
        parameters=(*STREAM_PARAMS, AFTER, LAST_EVENT_ID, ACCESS_TOKEN),
        responses={"200": SSE_EVENTS},
        problems=(*ON_STREAM, "placement_violation", "future_cursor", "cursor_expired", "too_many_subscriptions"),
    ),
    Operation(
        "POST",
        STREAM + "/consumers/{consumer_id}/ack",
        "ack",
        "consumers",
        summary="Acknowledge through a sequence",
        description="Acks only advance; an ack returns credit to producers.",
        parameters=(*STREAM_PARAMS, CONSUMER_PARAM),
        body=json_body("Ack", "the sequence acknowledged"),
        responses={"200": ok("AckResult", "acknowledged")},
        problems=(*BODY, *ON_STREAM, "consumer_scope_mismatch", "future_sequence", "ack_regression"),
    ),
    Operation(
        "POST",
        STREAM + "/close",
        "closeStream",
        "streams",
        summary="Close the stream",
        description="After close, appends are `409 stream_closed`; reads and subscriptions drain what is there.",
        parameters=STREAM_PARAMS,
        responses={"200": ok("StreamState", "closed (also if it already was)")},
        problems=ON_STREAM,
    ),
    Operation(
        "PUT",
        STREAM + "/legal-hold",
        "setLegalHold",
        "streams",
        summary="Place or release a legal hold",
        description="Holds stack (one per `hold_id`); while any is active the pruner leaves the stream alone.",
        parameters=STREAM_PARAMS,
        body=json_body("LegalHold", "the hold"),
        responses={"200": ok("StreamState", "the stream's state after the change")},
        problems=(*BODY, *ON_STREAM, "object_region_unavailable"),
    ),
    Operation(
        "GET",
        STREAM + "/deliveries",
        "getDeliveries",
        "deliveries",
        summary="Input delivery progress",
        description="Counts by state, failed rows (they block the stream) and the next due row. Input streams "
        "only: an output stream is `409 not_an_input_stream`.",
        parameters=STREAM_PARAMS,
        responses={"200": ok("Deliveries", "delivery progress")},
        problems=(*ON_STREAM, "not_an_input_stream"),
    ),
    Operation(
        "POST",
        STREAM + "/deliveries/requeue",
        "requeueDeliveries",
        "deliveries",
        summary="Retry failed deliveries",
        description="Failed rows become pending again, in order. Input streams only.",
        parameters=STREAM_PARAMS,
        responses={"200": ok("Requeued", "how many rows were requeued")},
        problems=(*ON_STREAM, "not_an_input_stream"),
    ),
    Operation(
        "POST",
        STREAM + "/objects/prepare",
        "prepareObject",
        "objects",
        summary="Prepare an object upload",
        description="Pins idempotency key, sha256, size and content type; the server picks bucket and key. An "
        "object that could never be committed (larger than `credit.max_unread_bytes`, or past a "
        "lifetime total) is refused here, before its bytes are sent.",
        parameters=STREAM_PARAMS,
        body=json_body("Prepare", "what will be uploaded"),
        responses={
            "201": ok("Intent", "prepared"),
            "200": ok("Intent", "already prepared with this idempotency key"),
        },
        problems=(
            *BODY,
            *ON_STREAM,
            "stream_closed",
            "idempotency_key_reused",
            "object_exceeds_credit",
            "quota_exhausted",
            "object_region_unavailable",
        ),
    ),
    Operation(
        "GET",
        STREAM + "/records/{sequence}/object",
        "readObject",
        "objects",
        summary="Download an object record's bytes",
        description="The bytes of the object record at `sequence`, streamed from S3, with its content type and "
        "`Repr-Digest` (SHA-256). The record is read as `GET …/records` reads it: the `read` right, "
        "then the caller's region against the stream's client-egress regions, and only committed, "
        "retained records (a pruned one is `410 cursor_expired`). One `Range` is honoured (`206`).",
        parameters=(*STREAM_PARAMS, SEQUENCE_PARAM, RANGE),
        responses={
            "200": binary("the object's bytes", "Content-Length", "Repr-Digest", "Accept-Ranges"),
            "206": binary("one range of the object's bytes", "Content-Length", "Content-Range", "Repr-Digest"),
        },
        problems=(
            *ON_STREAM,
            "placement_violation",
            "cursor_expired",
            "not_found",
            "not_an_object",
            "object_gone",
            "range_not_satisfiable",
            "object_region_unavailable",
        ),
    ),
    Operation(
        "GET",
        INTENT,
        "getIntent",
        "objects",
        summary="An object intent",
        description="The intent's state and pins.",
        parameters=(*STREAM_PARAMS, INTENT_PARAM),
        responses={"200": ok("Intent", "the intent")},
        problems=(*ON_STREAM, "not_found"),
    ),
    Operation(
        "PUT",
        INTENT + "/upload",
        "uploadObject",
        "objects",
        summary="Upload the object's bytes",
        description="Streamed to S3 in parts; size and sha256 are verified before anything becomes visible.",
        parameters=(*STREAM_PARAMS, INTENT_PARAM),
        body=OBJECT_BYTES,
        responses={"200": ok("Intent", "uploaded")},
        problems=(
            *ON_STREAM,
            "not_found",
            "request_timeout",
            "intent_state",
            "intent_expired",
            "object_mismatch",
            "object_region_unavailable",
        ),
    ),
    Operation(
        "POST",
        INTENT + "/commit",
        "commitObject",
        "objects",
        summary="Append the object record",
        description="Checks S3's evidence against the intent, then appends a record under the stream's credit.",
        parameters=(*STREAM_PARAMS, INTENT_PARAM),
        responses={
            "201": ok("CommitResult", "appended"),
            "200": ok("CommitResult", "already committed"),
        },
        problems=(
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
    ),
    Operation(
        "POST",
        INTENT + "/abort",
        "abortObject",
        "objects",
        summary="Abort an uncommitted upload",
        description="The object is queued for deletion.",
        parameters=(*STREAM_PARAMS, INTENT_PARAM),
        responses={"200": ok("AbortResult", "aborted")},
        problems=(*ON_STREAM, "not_found", "intent_state"),
    ),
)

INFO = {
    "title": "workflow-streams",
    "version": "v1",
    "description": "Durable, strictly ordered data streams for workflow runs. Errors are "
    "`application/problem+json` with a stable `code`; each operation lists its codes. Request "
    f"bodies are strict JSON (RFC 8259) of at most {MAX_REQUEST_BYTES}: NaN, infinities, lone "
    f"surrogates and nesting deeper than {MAX_DEPTH} levels are `400 invalid_json`.",
}

TAGS = {
    "streams": "definitions, listing, close, legal holds",
    "records": "append, read, subscribe",
    "consumers": "acknowledgements (they return credit)",
    "deliveries": "input streams' delivery outbox",
    "objects": "large payloads through S3",
}


def document() -> dict[str, Any]:
    paths: dict[str, dict[str, Schema]] = {}
    for operation in OPERATIONS:
        paths.setdefault(operation.path, {})[operation.method.lower()] = operation.openapi()
    return {
        "openapi": OPENAPI_VERSION,
        "info": INFO,
        "servers": [{"url": API_PREFIX}],
        "security": [{"bearer": []}],
        "tags": [{"name": name, "description": description} for name, description in TAGS.items()],
        "paths": paths,
        "components": {
            "schemas": _component_schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def serve(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


OPENAPI = web.AppKey("workflow_streams_openapi", dict[str, Any])
