"""Handlers for streams, records, consumers, close and legal hold."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import asyncpg
from aiohttp import web

from ..adapters import metrics, wire
from ..domain.admission import refusal
from ..domain.authz import Access, Action, Principal
from ..domain.cursor import parse_cursor
from ..domain.errors import InvalidInput, NotAnInputStream
from ..domain.ids import check_id
from ..domain.pins import StreamPins
from ..domain.placement import check_metadata_home
from ..domain.records import parse_append_body
from ..domain.templates import Templates
from ..runtime.group_commit import append_records
from ..runtime.holds import apply_legal_hold
from ..runtime.publish import committed
from ..runtime.reads import read_bodies
from ..store import consumers, definitions, deliveries, streams
from ..store.appends import AppendRequest
from ..store.bodies import Body
from .common import (
    JSON_HEADERS,
    STREAM,
    client_region_of,
    compressible,
    json_object,
    json_response,
    query,
    read_json,
    stream_key,
)
from .state import principal_of, state_of

log = logging.getLogger(__name__)
routes = web.RouteTableDef()

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# a read's page: records (``limit``) and about this many bytes of them (``max_bytes``)
MAX_READ_RECORDS = 100_000
DEFAULT_READ_BYTES = 1024 * 1024
MAX_READ_BYTES = 16 * 1024 * 1024

_REPLAYED_HEADERS = {**JSON_HEADERS, "Idempotent-Replayed": "true"}


async def _input_stream(
    conn: asyncpg.Connection, run_id: str, stream_id: str, principal: Principal, right: Action
) -> None:
    """Only input streams have deliveries; asked of an output stream, say so instead of answering zeros.
    The loader checks the caller's right on the row first (the one rights check of these handlers)."""
    stream = await streams.load(conn, run_id, stream_id, access=Access(principal, right))
    if stream.pins.direction != "input":
        raise NotAnInputStream(
            f"{stream.stream_id} is an {stream.pins.direction} stream; only input streams have deliveries"
        )


def _limit(request: web.Request, maximum: int = MAX_LIMIT) -> int:
    return _count(request, "limit", DEFAULT_LIMIT, maximum)


def _count(request: web.Request, name: str, default: int, maximum: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isascii() or not text.isdigit() or len(text) > 10 or not 1 <= int(text) <= maximum:
        raise InvalidInput(f"{name} must be an integer from 1 to {maximum}", field=name)
    return int(text)


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is not None and not (0 < len(key) <= 255 and key.isascii() and key.isprintable()):
        raise InvalidInput("Idempotency-Key must be 1-255 printable ASCII characters", field="Idempotency-Key")
    return key


# Appends and reads first: the router tries the routes under one static prefix ("/runs") in the order
# they were added, each a coroutine and a regular expression, so the most frequent requests match on
# the first try (after create/list and get_stream they took three).
@routes.post(STREAM + "/records")
@query()
async def append(request: web.Request) -> web.Response:
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    key = _idempotency_key(request)
    records = parse_append_body(await read_json(request))
    result = await append_records(app.appends, app.hub, AppendRequest(run_id, stream_id, records, principal, key))
    body = wire.append_bytes(result.first_sequence, result.last_sequence)
    if result.replayed:
        return web.Response(status=200, body=body, headers=_REPLAYED_HEADERS)
    return web.Response(status=201, body=body, headers=JSON_HEADERS)


@routes.get(STREAM + "/records")
@query("after", "limit", "max_bytes")
async def read(request: web.Request) -> web.StreamResponse:
    """A page of records assembled by Postgres (``runtime.reads.read_bodies``). A page of one part is
    answered whole, with its length; a larger one (a reader catching up asks for pages of megabytes) is
    written part by part as Postgres writes the next, so neither waits for the other. Such a page may end
    early (records pruned, the database lost part-way): its ``next_after`` says where to go on."""
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    after = parse_cursor(request.query.get("after"))
    each = read_bodies(
        app.pool,
        app.durability,
        run_id,
        stream_id,
        after,
        "records",
        # a page is sized by bytes unless the caller says otherwise: small records come many a page
        max_records=_count(request, "limit", MAX_READ_RECORDS, MAX_READ_RECORDS),
        max_bytes=_count(request, "max_bytes", DEFAULT_READ_BYTES, MAX_READ_BYTES),
        access=Access(principal, "read", client_region_of(request)),
    )
    async with contextlib.aclosing(each):
        body = await anext(each)  # refusals (rights, cursors) come before anything is written
        more = await anext(each, None)
        if more is None:
            metrics.READ_RECORDS.inc(body.count)
            data = body.joined(wire.PAGE_HEAD, wire.page_tail(body.next_after, body.bounds, body.closed))
            return compressible(web.Response(body=data, headers=JSON_HEADERS))
        response = web.StreamResponse(headers=JSON_HEADERS)
        response.enable_compression()  # if the request's Accept-Encoding asks for it
        await response.prepare(request)
        await response.write(wire.PAGE_HEAD)
        await _write_records(response, body)
        last = more
        await _write_records(response, more, body.separator)
        async for last in each:
            await _write_records(response, last, last.separator)
        await response.write(wire.page_tail(last.next_after, last.bounds, last.closed))
        await response.write_eof()
        return response


async def _write_records(response: web.StreamResponse, body: Body, before: bytes = b"") -> None:
    """A body's records, each part as Postgres joined it (not copied into one value), after ``before``."""
    metrics.READ_RECORDS.inc(body.count)
    for part in body.parts:
        await response.write(before)
        await response.write(part.data)
        before = body.separator


@routes.post("/runs/{run_id}/streams")
@query()
async def create_stream(request: web.Request) -> web.Response:
    """Define a stream: ``{"stream_id"}`` alone makes it from the default template, ``template`` names
    another, ``pins`` without a template are the whole pins (as before templates existed), and with one
    are merged over it. The stored pins are the whole resolved document."""
    app = state_of(request)
    principal = await principal_of(request)
    run_id = check_id("run_id", request.match_info["run_id"])
    body = json_object(await read_json(request), {"stream_id", "pins", "template"}, {"stream_id"})
    if not isinstance(body["stream_id"], str):
        raise InvalidInput("stream_id must be a string", field="stream_id")
    stream_id = check_id("stream_id", body["stream_id"])
    pins = _requested_pins(app.settings.templates, body, principal)
    check_metadata_home(pins, app.settings.metadata_region)
    async with app.pool.acquire() as conn:
        # only those who may see an existing stream learn of it (the store answers Forbidden otherwise)
        definition, created = await definitions.create_definition(
            conn, run_id, stream_id, pins, principal, refusal=refusal(pins, app.settings.served)
        )
    location = f"{request.app.router['get_stream'].url_for(run_id=run_id, stream_id=stream_id)}"
    return json_response(definition.to_json(), status=201 if created else 200, headers={"Location": location})


def _requested_pins(templates: Templates, body: dict[str, Any], principal: Principal) -> StreamPins:
    template, pins = body.get("template"), body.get("pins")
    if template is not None and not isinstance(template, str):
        raise InvalidInput("template must be the name of a pins template", field="template")
    if pins is not None and not isinstance(pins, dict):
        raise InvalidInput("pins must be a JSON object", field="pins")
    return templates.requested(template, pins, principal.name)


@routes.get("/runs")
@query("after", "limit")
async def list_runs(request: web.Request) -> web.Response:
    """The runs in which this principal may see at least one stream, ``limit`` at a time after ``after``."""
    app = state_of(request)
    principal = await principal_of(request)
    after = request.query.get("after", "")
    if after:
        check_id("after", after)
    async with app.pool.acquire() as conn:
        listing = await definitions.list_runs(conn, after, _limit(request), principal)
    return json_response({"runs": listing.runs, "next_after": listing.next_after})


@routes.get("/templates")
@query()
async def list_templates(request: web.Request) -> web.Response:
    """The pins templates a create may name, each with the pins it resolves to for this principal."""
    app = state_of(request)
    principal = await principal_of(request)
    templates = app.settings.templates
    names = ["default", *sorted(set(templates.named) - {"default"})]
    listed = []
    for name in names:
        template = templates.get(name)
        listed.append({**template.to_json(), "resolved": templates.resolve(name, principal.name).canonical()})
    return json_response({"templates": listed})


@routes.get("/runs/{run_id}/streams")
@query("after", "limit")
async def list_streams(request: web.Request) -> web.Response:
    """The run's streams this principal may see, ``limit`` at a time after ``after``
    (``definitions.list_streams`` says how invisible streams are skipped without a trace)."""
    app = state_of(request)
    principal = await principal_of(request)
    run_id = check_id("run_id", request.match_info["run_id"])
    after = request.query.get("after", "")
    if after:
        check_id("after", after)
    limit = _limit(request)
    async with app.pool.acquire() as conn:
        listing = await definitions.list_streams(conn, run_id, after, limit, principal)
    return json_response(
        {
            "streams": [{**d.to_json(), "state": s.to_json()} for d, s in listing.streams],
            "next_after": listing.next_after,
        }
    )


@routes.get(STREAM, name="get_stream")
@query()
async def get_stream(request: web.Request) -> web.Response:
    """The definition and what the database holds for it: unread against the ceilings, consumers and
    their lag, holds, input deliveries by state, objects in flight, the owner."""
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    async with app.pool.acquire() as conn:
        definition, detail = await definitions.get_stream(conn, run_id, stream_id, principal)
    return json_response({**definition.to_json(), "state": detail.to_json()})


@routes.delete(STREAM)
@query()
async def delete_stream(request: web.Request) -> web.Response:
    """Delete a stream and its records (the ``delete`` right; ``409 stream_held`` while a legal hold
    exists); its objects are queued for deletion from S3. Its name can be defined again."""
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    queued = await committed(
        app.pool, app.hub, lambda conn: definitions.delete_stream(conn, run_id, stream_id, principal)
    )
    log.info("stream %s/%s deleted by %s; %d objects queued", run_id, stream_id, principal.name, len(queued))
    return json_response({"run_id": run_id, "stream_id": stream_id, "deleted": True, "objects_queued": len(queued)})


@routes.post(STREAM + "/consumers/{consumer_id}/ack")
@query()
async def ack(request: web.Request) -> web.Response:
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    consumer_id = check_id("consumer_id", request.match_info["consumer_id"])
    body = json_object(await read_json(request), {"sequence"}, {"sequence"})
    sequence = body["sequence"]
    if type(sequence) is not int or not 0 <= sequence < 2**63:
        raise InvalidInput("sequence must be a non-negative integer", field="sequence")
    result = await committed(
        app.pool, app.hub, lambda conn: consumers.ack(conn, run_id, stream_id, consumer_id, sequence, principal)
    )
    return json_response(result)


@routes.post(STREAM + "/close")
@query()
async def close(request: web.Request) -> web.Response:
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    state = await committed(
        app.pool, app.hub, lambda conn: definitions.close_stream(conn, run_id, stream_id, principal)
    )
    return json_response(state.to_json())


@routes.put(STREAM + "/legal-hold")
@query()
async def legal_hold(request: web.Request) -> web.Response:
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    body = json_object(await read_json(request), {"enabled", "reason", "hold_id"}, {"enabled"})
    enabled, reason, hold_id = body["enabled"], body.get("reason", ""), body.get("hold_id", "default")
    if not isinstance(enabled, bool):
        raise InvalidInput("enabled must be a boolean", field="enabled")
    if not isinstance(reason, str) or len(reason) > 1024 or (enabled and not reason.strip()) or "\x00" in reason:
        raise InvalidInput("reason must be non-empty text of at most 1024 characters", field="reason")
    if not isinstance(hold_id, str):
        raise InvalidInput("hold_id must be a string", field="hold_id")
    check_id("hold_id", hold_id)
    state = await apply_legal_hold(app.pool, app.object_store, run_id, stream_id, hold_id, enabled, reason, principal)
    return json_response(state.to_json())


@routes.get(STREAM + "/deliveries")
@query()
async def delivery_status(request: web.Request) -> web.Response:
    """Input delivery progress: counts by state, failed rows (they block the stream), the next due."""
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    async with app.pool.acquire() as conn:
        await _input_stream(conn, run_id, stream_id, principal, "read")
        return json_response(await deliveries.summary(conn, run_id, stream_id))


@routes.post(STREAM + "/deliveries/requeue")
@query()
async def requeue_deliveries(request: web.Request) -> web.Response:
    """Once the wait service is fixed: failed deliveries are retried, in order."""
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    async with app.pool.acquire() as conn:
        await _input_stream(conn, run_id, stream_id, principal, "append")
        return json_response({"requeued": await deliveries.requeue_failed(conn, run_id, stream_id)})
