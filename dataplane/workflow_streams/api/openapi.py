"""The OpenAPI 3 document of the HTTP surface, served at /api/workflow-streams/openapi.json.

Pins' schema comes from the pydantic model itself; the rest is written here, next to nothing else,
and a test keeps the paths in step with the router.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .. import API_PREFIX
from ..domain.objects import MAX_OBJECT_BYTES
from ..domain.pins import StreamPins
from ..domain.records import INLINE_LIMIT, MAX_BATCH

ID = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"}
SEQUENCE = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


def _path_param(name: str, example: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": ID, "example": example}


STREAM_PARAMS = [_path_param("run_id", "r"), _path_param("stream_id", "s")]
INTENT_PARAM = {"name": "intent_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _ok(status: str, schema: dict[str, Any], description: str = "success") -> dict[str, Any]:
    return {status: {"description": description, "content": {"application/json": {"schema": schema}}}}


def _problems(*statuses: int) -> dict[str, Any]:
    content = {"application/problem+json": {"schema": _ref("Problem")}}
    return {str(s): {"description": "problem", "content": content} for s in (401, 403, *statuses)}


def _operation(summary: str, params: list[dict[str, Any]], responses: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"summary": summary, "parameters": params, "responses": responses, **more}


def _schemas() -> dict[str, Any]:
    pins = StreamPins.model_json_schema(ref_template=REF + "{model}")
    defs = pins.pop("$defs", {})
    record_in = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "content_type": {"type": "string", "maxLength": 255, "default": "application/json"},
            "data": {"description": f"JSON payload (at most {INLINE_LIMIT} bytes encoded)"},
            "data_base64": {"type": "string", "format": "byte"},
        },
    }
    return {
        **defs,
        "StreamPins": pins,
        "Problem": {
            "type": "object",
            "required": ["type", "title", "status", "code", "detail"],
            "properties": {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "code": {"type": "string"},
                "detail": {"type": "string"},
            },
        },
        "CreateStream": {
            "type": "object",
            "additionalProperties": False,
            "required": ["stream_id", "pins"],
            "properties": {"stream_id": ID, "pins": _ref("StreamPins")},
        },
        "Definition": {
            "type": "object",
            "properties": {
                "run_id": ID,
                "stream_id": ID,
                "pins": _ref("StreamPins"),
                "pins_digest": {"type": "string"},
            },
        },
        "RecordIn": record_in,
        "Append": {
            "oneOf": [
                record_in,
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["records"],
                    "properties": {
                        "records": {"type": "array", "items": record_in, "minItems": 1, "maxItems": MAX_BATCH}
                    },
                },
            ]
        },
        "AppendResult": {
            "type": "object",
            "properties": {
                "first_sequence": SEQUENCE,
                "last_sequence": SEQUENCE,
                "sequences": {"type": "array", "items": SEQUENCE},
            },
        },
        "Record": {
            "type": "object",
            "properties": {
                "sequence": SEQUENCE,
                "kind": {"type": "string", "enum": ["inline", "object"]},
                "content_type": {"type": "string"},
                "size": {"type": "integer"},
                "appended_at": {"type": "string", "format": "date-time"},
                "data": {},
                "data_base64": {"type": "string"},
                "object": {"type": "object"},
            },
        },
        "Page": {
            "type": "object",
            "properties": {
                "records": {"type": "array", "items": _ref("Record")},
                "next_after": SEQUENCE,
                "earliest": SEQUENCE,
                "latest": SEQUENCE,
                "closed": {"type": "boolean"},
            },
        },
        "StreamState": {"type": "object"},
        "Ack": {
            "type": "object",
            "additionalProperties": False,
            "required": ["sequence"],
            "properties": {"sequence": SEQUENCE},
        },
        "LegalHold": {
            "type": "object",
            "additionalProperties": False,
            "required": ["enabled"],
            "properties": {
                "enabled": {"type": "boolean"},
                "reason": {"type": "string", "maxLength": 1024},
                "hold_id": ID,
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
                "content_type": {"type": "string", "maxLength": 255},
                "schema_ref": {"type": "string", "maxLength": 512},
                "region": {"type": "string"},
                "expires_in_seconds": {"type": "integer", "minimum": 1, "maximum": 604800},
            },
        },
        "Intent": {"type": "object"},
        "Deliveries": {"type": "object"},
    }


def document() -> dict[str, Any]:
    s = "/runs/{run_id}/streams/{stream_id}"
    intent = s + "/objects/{intent_id}"
    consumer = {"name": "consumer_id", "in": "path", "required": True, "schema": ID, "example": "c1"}
    after = {"name": "after", "in": "query", "schema": SEQUENCE}
    limit = {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}
    key = {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string", "minLength": 1, "maxLength": 255}}
    last_id = {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}}
    paths: dict[str, Any] = {
        "/runs/{run_id}/streams": {
            "post": _operation(
                "Create a stream definition (idempotent for the same pins)",
                [_path_param("run_id", "r")],
                {**_ok("201", _ref("Definition")), **_ok("200", _ref("Definition")), **_problems(400, 409, 422)},
                requestBody=_json_body(_ref("CreateStream")),
            ),
        },
        s: {
            "get": _operation(
                "A definition and its state", STREAM_PARAMS, {**_ok("200", _ref("Definition")), **_problems(400)}
            )
        },
        s + "/records": {
            "post": _operation(
                "Append one record or a batch",
                [*STREAM_PARAMS, key],
                {
                    **_ok("201", _ref("AppendResult")),
                    **_ok("200", _ref("AppendResult")),
                    **_problems(400, 408, 409, 413, 422, 429),
                },
                requestBody=_json_body(_ref("Append")),
            ),
            "get": _operation(
                "Records with sequence > after, ascending",
                [*STREAM_PARAMS, after, limit],
                {**_ok("200", _ref("Page")), **_problems(400, 410)},
            ),
        },
        s + "/subscribe": {
            "get": _operation(
                "Follow the stream as Server-Sent Events",
                [*STREAM_PARAMS, after, last_id],
                {
                    "200": {
                        "description": "text/event-stream",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    **_problems(400, 410, 429),
                },
            ),
        },
        s + "/consumers/{consumer_id}/ack": {
            "post": _operation(
                "Acknowledge through a sequence",
                [*STREAM_PARAMS, consumer],
                {**_ok("200", {"type": "object"}), **_problems(400, 409)},
                requestBody=_json_body(_ref("Ack")),
            ),
        },
        s + "/close": {
            "post": _operation("Close the stream", STREAM_PARAMS, {**_ok("200", _ref("StreamState")), **_problems(400)})
        },
        s + "/legal-hold": {
            "put": _operation(
                "Place or release a legal hold",
                STREAM_PARAMS,
                {**_ok("200", _ref("StreamState")), **_problems(400)},
                requestBody=_json_body(_ref("LegalHold")),
            ),
        },
        s + "/deliveries": {
            "get": _operation(
                "Input delivery progress", STREAM_PARAMS, {**_ok("200", _ref("Deliveries")), **_problems(400)}
            )
        },
        s + "/deliveries/requeue": {
            "post": _operation(
                "Retry failed deliveries", STREAM_PARAMS, {**_ok("200", {"type": "object"}), **_problems(400)}
            )
        },
        s + "/objects/prepare": {
            "post": _operation(
                "Prepare an object upload",
                STREAM_PARAMS,
                {**_ok("201", _ref("Intent")), **_ok("200", _ref("Intent")), **_problems(400, 409, 413, 503)},
                requestBody=_json_body(_ref("Prepare")),
            ),
        },
        intent: {
            "get": _operation(
                "An object intent",
                [*STREAM_PARAMS, INTENT_PARAM],
                {**_ok("200", _ref("Intent")), **_problems(400, 404, 503)},
            )
        },
        intent + "/upload": {
            "put": _operation(
                "Upload the object's bytes",
                [*STREAM_PARAMS, INTENT_PARAM],
                {**_ok("200", _ref("Intent")), **_problems(400, 404, 408, 409, 422, 503)},
                requestBody={
                    "required": True,
                    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                },
            ),
        },
        intent + "/commit": {
            "post": _operation(
                "Append the object record",
                [*STREAM_PARAMS, INTENT_PARAM],
                {
                    **_ok("201", {"type": "object"}),
                    **_ok("200", {"type": "object"}),
                    **_problems(400, 404, 409, 429, 503),
                },
            )
        },
        intent + "/abort": {
            "post": _operation(
                "Abort an uncommitted upload",
                [*STREAM_PARAMS, INTENT_PARAM],
                {**_ok("200", {"type": "object"}), **_problems(400, 404, 409, 503)},
            )
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "workflow-streams",
            "version": "v1",
            "description": "Durable, strictly ordered data streams for workflow runs.",
        },
        "servers": [{"url": API_PREFIX}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def serve(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


OPENAPI = web.AppKey("workflow_streams_openapi", dict[str, Any])
