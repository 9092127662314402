"""The protocol's operations on ``/v1/stream/<name>``: PUT creates, HEAD reports, GET reads (catch-up,
long-poll, SSE), POST appends and closes, DELETE removes. Thin: rules live in ``domain.durable``, SQL in
``store.durable`` (on the one stream loader, which checks the caller's rights); appends go through the
shared append path, live reads through the live-read engine, and what a store entry point changed is
published by ``runtime.publish``, so credit, wakes, rights and the cursor rule are our own API's."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from ...adapters import metrics
from ...domain import durable as rules
from ...domain.authz import Access, Principal
from ...domain.durable_pins import default_template, pins_from_template
from ...domain.errors import (
    Backpressure,
    BatchExceedsCredit,
    InvalidInput,
    QuotaExhausted,
    StreamClosed,
    StreamError,
)
from ...domain.pins import StreamPins
from ...domain.records import RecordIn
from ...runtime import group_commit
from ...runtime.publish import committed
from ...store import durable as store
from ...store.appends import AppendRequest
from ..common import client_region_of, read_body
from ..state import AppState, principal_of, state_of
from . import headers as h
from . import live
from .pages import body_response, read_records

STREAM_PATH = "/v1/stream/{name:.+}"
ANONYMOUS = Principal("anonymous")


@dataclass(frozen=True)
class Call:
    """Who is asking about which stream."""

    app: AppState
    principal: Principal
    run_id: str
    stream_id: str


async def _call(request: web.Request) -> Call:
    app = state_of(request)
    # anonymous only when the server was started to allow it; a token that is sent is always checked
    if app.settings.durable_anonymous and "Authorization" not in request.headers:
        principal = ANONYMOUS
    else:
        # EventSource cannot send headers: SSE also takes ?access_token=, as our subscribe does
        principal = await principal_of(request, allow_query_token=request.query.get("live") == "sse")
    run_id, stream_id = rules.stream_key(request.match_info["name"], app.settings.durable_run_id)
    return Call(app, principal, run_id, stream_id)


def _stream_headers(meta: store.Meta) -> dict[str, str]:
    headers = {"Content-Type": meta.content_type}
    ttl = meta.lifetime.remaining_ttl(meta.accessed_at, meta.now)
    if ttl is not None:
        headers[h.TTL] = str(meta.lifetime.ttl_seconds)
    if meta.lifetime.expires_at is not None:
        headers[h.EXPIRES_AT] = rules.format_rfc3339(meta.lifetime.expires_at)
    return headers


async def options(request: web.Request) -> web.Response:
    return h.preflight(request)


async def put(request: web.Request) -> web.Response:
    call = await _call(request)
    settings = call.app.settings
    fork = rules.parse_fork(
        request.headers.get(h.FORKED_FROM),
        request.headers.get(h.FORK_OFFSET),
        request.headers.get(h.FORK_SUB_OFFSET),
        settings.durable_prefix,
    )
    lifetime = rules.parse_lifetime(request.headers.get(h.TTL), request.headers.get(h.EXPIRES_AT))
    closed = request.headers.get(h.CLOSED, "").lower() == "true"
    body = await read_body(request)
    template = settings.durable_template or default_template(settings.region, settings.metadata_region)
    pins = pins_from_template(template, call.principal.name)
    if fork is not None:
        return await _fork(request, call, fork, pins, lifetime, closed, body)
    content_type = rules.check_content_type(request.headers.get("Content-Type") or rules.DEFAULT_CONTENT_TYPE)
    initial = rules.records(content_type, body, allow_empty=True) if body else []
    async with call.app.pool.acquire() as conn:
        await store.sweep_expired(conn)
    created = await committed(
        call.app.pool,
        call.app.hub,
        lambda conn: store.create(
            conn, call.run_id, call.stream_id, pins, call.principal, content_type, lifetime, closed, initial
        ),
    )
    return _created(request, created)


async def _fork(
    request: web.Request,
    call: Call,
    fork: rules.Fork,
    pins: StreamPins,
    lifetime: rules.Lifetime,
    closed: bool,
    body: bytes,
) -> web.Response:
    """PUT with ``Stream-Forked-From``: a new stream that starts as a copy of another's records."""
    source_key = rules.stream_key(fork.source, call.app.settings.durable_run_id)
    named = request.headers.get("Content-Type")
    content_type = rules.check_content_type(named) if named else None
    created = await committed(
        call.app.pool,
        call.app.hub,
        lambda conn: store.fork(
            conn,
            call.run_id,
            call.stream_id,
            source_key,
            fork,
            pins,
            call.principal,
            client_region_of(request),
            content_type,
            lifetime,
            closed,
            body,
        ),
    )
    return _created(request, created)


def _created(request: web.Request, created: store.Created) -> web.Response:
    """201 for a stream made now, 200 for the same one found again."""
    meta = created.meta
    headers = {**_stream_headers(meta), h.NEXT_OFFSET: rules.encode_offset(meta.last_sequence)}
    if meta.closed:
        headers[h.CLOSED] = "true"
    if created.created:
        headers["Location"] = str(request.url.with_query(None))
    return web.Response(status=201 if created.created else 200, headers=headers)


async def head(request: web.Request) -> web.Response:
    call = await _call(request)
    async with call.app.pool.acquire() as conn:
        meta = await store.load(conn, call.run_id, call.stream_id, access=Access(call.principal, "read"))
    headers = {
        **_stream_headers(meta),
        h.NEXT_OFFSET: rules.encode_offset(meta.last_sequence),
        # the stream as it stands: its incarnation, tail and closed state
        "ETag": rules.etag(meta.incarnation, meta.last_sequence, meta.last_sequence, meta.closed),
        "Cache-Control": h.NO_STORE,
    }
    if meta.closed:
        headers[h.CLOSED] = "true"
    return web.Response(status=200, headers=headers)


async def delete(request: web.Request) -> web.Response:
    call = await _call(request)
    await committed(
        call.app.pool, call.app.hub, lambda conn: store.delete(conn, call.run_id, call.stream_id, call.principal)
    )
    return web.Response(status=204)


async def get(request: web.Request) -> web.StreamResponse:
    call = await _call(request)
    offset = rules.parse_offset(request.query.getall("offset", []))
    mode = request.query.get("live")
    if mode not in (None, "long-poll", "sse"):
        raise InvalidInput("live must be long-poll or sse", field="live")
    if mode is not None and "offset" not in request.query:
        raise InvalidInput(f"live={mode} needs an offset", field="offset")
    access = Access(call.principal, "read" if mode is None else "subscribe", client_region_of(request))
    async with call.app.pool.acquire() as conn:
        meta = await store.load(conn, call.run_id, call.stream_id, access=access)
        await store.touch(conn, meta)
    after = offset.resolve(meta.earliest_sequence, meta.last_sequence)
    if mode == "long-poll":
        return await live.long_poll(request, call.app, call.principal, meta, after)
    if mode == "sse":
        return await live.sse(request, call.app, call.principal, meta, after)
    if offset.is_now:
        return _now(meta)
    body = await read_records(call.app, meta, after, access)
    metrics.READ_RECORDS.inc(body.count)
    return body_response(request, meta, after, body)


def _now(meta: store.Meta) -> web.Response:
    """``offset=now``: no data, the tail, and nothing a cache may keep (PROTOCOL.md 6)."""
    headers = {
        "Content-Type": meta.content_type,
        h.NEXT_OFFSET: rules.encode_offset(meta.last_sequence),
        h.UP_TO_DATE: "true",
        "Cache-Control": h.NO_STORE,
    }
    if meta.closed:
        headers[h.CLOSED] = "true"
    return web.Response(body=b"[]" if rules.is_json_mode(meta.content_type) else b"", headers=headers)


async def post(request: web.Request) -> web.Response:
    call = await _call(request)
    closing = request.headers.get(h.CLOSED, "").lower() == "true"
    producer = rules.parse_producer(request.headers)
    stream_seq = request.headers.get(h.SEQ)
    content_type = request.headers.get("Content-Type")  # not request.content_type: absent must stay absent
    body = await read_body(request)
    if body and content_type and producer is None and stream_seq is None and not closing:
        # a plain append, most of them: one group-committed transaction that also checks what the
        # protocol asks of the stream; one it refuses is answered by the full path below, which orders
        # the protocol's errors
        outcome = await _plain_append(call, content_type, body)
        if outcome is not None:
            return _appended(outcome, None, wrote=True)
    if not body and not closing:
        raise InvalidInput("an append needs a body (or Stream-Closed: true to close)", field="/")
    if body and not content_type:
        raise InvalidInput("an append needs a Content-Type", field="Content-Type")
    async with call.app.pool.acquire() as conn:
        meta = await store.load(conn, call.run_id, call.stream_id, access=Access(call.principal))
    # a closed stream answers that first, whatever else is wrong with the request (the locked path
    # decides again; this only orders the errors as the protocol does)
    retry_of_close = producer is not None and meta.closed_by == producer
    if meta.closed and not retry_of_close and not (closing and not body and producer is None):
        raise store.ClosedStream(meta.last_sequence)
    records: list[RecordIn] = []
    if body:
        assert content_type is not None
        if rules.media_type(content_type) != rules.media_type(meta.content_type):
            raise rules.ContentTypeMismatch(
                f"the stream's content type is {meta.content_type}, not {content_type}",
                stream_content_type=meta.content_type,
            )
        records = rules.records(meta.content_type, body, allow_empty=False)
    plan = store.AppendPlan(records, content_type, producer, stream_seq, closing)
    outcome = await _append(call, meta, plan)
    return _appended(outcome, producer, wrote=bool(records))


# refusals the plain path answers itself: credit is decided alike on both paths, after the protocol's checks
_CREDIT_REFUSALS = (Backpressure, QuotaExhausted, BatchExceedsCredit)


async def _plain_append(call: Call, content_type: str, body: bytes) -> store.AppendOutcome | None:
    """A plain append through the shared path (group commit, credit waits) like any append of our API,
    its stream loaded once, under the row lock (``AppendRequest.durable``); None when it was refused for
    anything but credit (nothing was written), for the full path to answer."""
    try:
        records = rules.records(content_type, body, allow_empty=False)
    except StreamError:
        return None  # a body bad for its own content type: the stream's may be another (409 first)
    request = AppendRequest(call.run_id, call.stream_id, records, call.principal, durable=content_type)
    try:
        result = await group_commit.append_records(call.app.appends, call.app.hub, request)
    except _CREDIT_REFUSALS:
        raise
    except StreamError:
        return None
    return store.AppendOutcome(result.last_sequence, False, False, None)


async def _append(call: Call, meta: store.Meta, plan: store.AppendPlan) -> store.AppendOutcome:
    app, run_id, stream_id = call.app, call.run_id, call.stream_id
    if plan.producer is None and plan.stream_seq is None and not plan.close:
        # what the plain path refused, decided again after the load: one refusal answered in its order
        request = AppendRequest(run_id, stream_id, plan.records, call.principal, durable=meta.content_type)
        try:
            result = await group_commit.append_records(app.appends, app.hub, request)
        except (StreamClosed, rules.PlainAppendRefused) as exc:
            # closed, deleted, expired or made again since the load: the stream as it is now answers
            async with app.pool.acquire() as conn:
                now = await store.load(conn, run_id, stream_id)  # gone, expired: that is the answer
            if isinstance(exc, StreamClosed):
                raise store.ClosedStream(now.last_sequence) from None
            raise rules.ContentTypeMismatch(
                f"the stream's content type is {now.content_type}, not {meta.content_type}",
                stream_content_type=now.content_type,
            ) from None
        return store.AppendOutcome(result.last_sequence, False, False, None)

    async def attempt() -> store.AppendOutcome:
        return await committed(
            app.pool, app.hub, lambda conn: store.append_guarded(conn, run_id, stream_id, plan, call.principal)
        )

    # the producer, Stream-Seq and close decisions need the append's own transaction; credit waits
    # are the shared ones
    return await group_commit.with_credit_wait(app.hub, run_id, stream_id, attempt)


def _appended(outcome: store.AppendOutcome, producer: rules.Producer | None, wrote: bool) -> web.Response:
    headers = {h.NEXT_OFFSET: rules.encode_offset(outcome.last_sequence)}
    if outcome.closed:
        headers[h.CLOSED] = "true"
    if producer is None:
        return web.Response(status=204, headers=headers)
    state = outcome.producer
    headers[h.PRODUCER_EPOCH] = str(state.epoch if state else producer.epoch)
    # the highest sequence accepted for this epoch, also on a duplicate
    headers[h.PRODUCER_SEQ] = str(state.last_seq if state else producer.seq)
    # a producer's new records are 200; a duplicate, or a close without records, 204
    return web.Response(status=200 if wrote and not outcome.duplicate else 204, headers=headers)


async def not_found(request: web.Request) -> web.Response:
    raise web.HTTPNotFound(reason="streams are at /v1/stream/<name>")
