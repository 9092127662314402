"""Large objects: prepare -> upload -> commit (or abort); readers download an object record's bytes.
Bytes go to S3 and come back through here; records carry the metadata."""

from __future__ import annotations

import datetime as dt
import logging
import uuid

from aiohttp import web

from ..adapters.objectstore import ObjectStore
from ..domain.authz import Access
from ..domain.errors import FutureCursor, InvalidInput, NotAnObject, NotFound, ObjectRegionUnavailable
from ..domain.objects import byte_range, parse_prepare, repr_digest, served_content_type
from ..runtime.group_commit import with_credit_wait
from ..runtime.publish import committed
from ..runtime.reads import read_page
from ..store import objects, retention
from ..store.appends import AppendResult
from .common import STREAM, chunks_with_idle_timeout, client_region_of, json_response, query, read_json, stream_key
from .state import STREAMING, AppState, principal_of, state_of

log = logging.getLogger(__name__)

routes = web.RouteTableDef()
INTENT = STREAM + "/objects/{intent_id}"


# how much of an object is held in memory while it streams to a reader
DOWNLOAD_CHUNK_BYTES = 256 * 1024


def _object_store(app: AppState) -> ObjectStore:
    if app.object_store is None:
        raise ObjectRegionUnavailable(app.settings.objects_pending or "this data plane has no object store configured")
    return app.object_store


def _intent_id(request: web.Request) -> str:
    text = request.match_info["intent_id"]
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise NotFound("no such object intent") from None


@routes.post(STREAM + "/objects/prepare")
@query()
async def prepare(request: web.Request) -> web.Response:
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    pins = parse_prepare(await read_json(request))
    object_store = _object_store(app)
    async with app.pool.acquire() as conn:
        intent, created = await objects.prepare(conn, run_id, stream_id, pins, principal, object_store.bucket)
    body = intent.to_json()
    body["upload_url"] = str(
        request.app.router["upload_object"].url_for(run_id=run_id, stream_id=stream_id, intent_id=body["intent_id"])
    )
    return json_response(body, status=201 if created else 200)


@routes.get(INTENT)
@query()
async def get(request: web.Request) -> web.Response:
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    async with app.pool.acquire() as conn:
        intent = await objects.get_intent(conn, run_id, stream_id, _intent_id(request), principal)
    return json_response(intent.to_json())


@routes.put(INTENT + "/upload", name="upload_object")
@query()
async def upload(request: web.Request) -> web.Response:
    """Streams the body to S3 in parts; size and sha256 are verified before anything becomes visible."""
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    intent_id = _intent_id(request)
    object_store = _object_store(app)
    async with app.pool.acquire() as conn:
        intent = await objects.get_intent(conn, run_id, stream_id, intent_id, principal)
        objects.check_uploadable(intent, dt.datetime.now(dt.UTC))
        held = await retention.is_held(conn, run_id, stream_id)
    if request.content_length is not None and request.content_length != intent.size:
        raise InvalidInput(
            f"Content-Length {request.content_length} differs from the prepared size {intent.size}",
            field="Content-Length",
        )
    chunks = chunks_with_idle_timeout(request, app.settings.body_timeout_seconds)
    checksum = await object_store.upload(intent.region, intent.object_key, chunks, intent.size, intent.sha256, held)
    async with app.pool.acquire() as conn:
        # the caller was authorized on this intent above; store.objects hands back the intent as it now is
        intent = await objects.mark_uploaded(conn, intent_id, checksum)
    return json_response(intent.to_json())


@routes.post(INTENT + "/commit")
@query()
async def commit(request: web.Request) -> web.Response:
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    intent_id = _intent_id(request)
    object_store = _object_store(app)
    async with app.pool.acquire() as conn:
        intent = await objects.get_intent(conn, run_id, stream_id, intent_id, principal)
    evidence = await object_store.evidence(intent.region, intent.object_key)

    async def attempt() -> AppendResult:
        return await committed(
            app.pool,
            app.hub,
            lambda conn: objects.commit(
                conn,
                run_id,
                stream_id,
                intent_id,
                principal,
                evidence.size if evidence else None,
                evidence.checksum if evidence else None,
            ),
        )

    result = await with_credit_wait(app.hub, run_id, stream_id, attempt)
    async with app.pool.acquire() as conn:
        held = await retention.is_held(conn, run_id, stream_id)
    if held:  # a hold placed while the upload was in flight still covers this object
        await object_store.set_legal_hold(intent.region, intent.object_key, True)
    return json_response(
        {"intent_id": intent_id, "sequence": result.first_sequence}, status=200 if result.replayed else 201
    )


@routes.post(INTENT + "/abort")
@query()
async def abort(request: web.Request) -> web.Response:
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    intent_id = _intent_id(request)
    async with app.pool.acquire() as conn:
        state = await objects.abort(conn, run_id, stream_id, intent_id, principal)
    return json_response({"intent_id": intent_id, "state": state})


def _sequence(request: web.Request) -> int:
    text = request.match_info["sequence"]
    if not text.isascii() or not text.isdigit() or len(text) > 19 or not 1 <= int(text) < 2**63:
        raise InvalidInput("sequence must be a positive integer", field="sequence")
    return int(text)


@routes.get(STREAM + "/records/{sequence}/object")
@query()
async def download(request: web.Request) -> web.StreamResponse:
    """An object record's bytes, streamed from S3. The record is read as every read is (the read right,
    then client egress, then only what is durable), so a caller learns nothing it could not read; an
    object exists for a reader only once its record does (committed, not yet pruned)."""
    app = state_of(request)
    principal = await principal_of(request)
    run_id, stream_id = stream_key(request)
    sequence = _sequence(request)
    try:
        page = await read_page(
            app.pool,
            app.durability,
            run_id,
            stream_id,
            sequence - 1,
            1,
            access=Access(principal, "read", client_region_of(request)),
        )
    except FutureCursor as exc:
        raise NotFound(f"no record {sequence} in the stream", latest=exc.extra.get("latest")) from None
    record = page.records[0] if page.records and page.records[0].sequence == sequence else None
    if record is None:
        raise NotFound(f"no record {sequence} in the stream", latest=page.bounds.latest)
    if record.object is None:
        raise NotAnObject(f"record {sequence} holds its payload inline; read it with GET …/records")
    meta = record.object
    size = int(meta["size"])
    wanted = byte_range(request.headers.get("Range"), size)
    first, last = wanted if wanted is not None else (0, size - 1)
    headers = {
        "Content-Type": served_content_type(meta["content_type"]),
        "Repr-Digest": repr_digest(meta["sha256"]),
        "Accept-Ranges": "bytes",
        # what a caller stored is never rendered as a page of this origin
        "Content-Disposition": "attachment",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
    }
    if wanted is not None:
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    response = web.StreamResponse(status=206 if wanted is not None else 200, headers=headers)
    response.content_length = last - first + 1
    body = await _object_store(app).get(meta["region"], meta["key"], wanted)
    async with body:
        await response.prepare(request)
        request[STREAMING] = True  # from here an error can only cut the response short
        async for chunk in body.iter_chunks(DOWNLOAD_CHUNK_BYTES):
            await response.write(chunk)
    await response.write_eof()
    return response
