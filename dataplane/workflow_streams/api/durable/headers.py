"""The protocol's headers, the security and CORS headers every response of this surface carries, and
how our errors become the protocol's status codes."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ...domain import errors
from ...domain.durable import (
    ContentTypeMismatch,
    DurableConflict,
    NotDeletableHere,
    StaleProducerEpoch,
    StreamGone,
    encode_offset,
)
from ...store.db import DB_UNAVAILABLE
from ...store.durable import ClosedStream
from ..problems import from_error, problem
from ..state import STREAMING

NEXT_OFFSET = "Stream-Next-Offset"
UP_TO_DATE = "Stream-Up-To-Date"
CURSOR = "Stream-Cursor"
CLOSED = "Stream-Closed"
TTL = "Stream-TTL"
EXPIRES_AT = "Stream-Expires-At"
SEQ = "Stream-Seq"
FORKED_FROM = "Stream-Forked-From"
FORK_OFFSET = "Stream-Fork-Offset"
FORK_SUB_OFFSET = "Stream-Fork-Sub-Offset"
SSE_ENCODING = "Stream-SSE-Data-Encoding"
PRODUCER_EPOCH = "Producer-Epoch"
PRODUCER_SEQ = "Producer-Seq"
PRODUCER_EXPECTED_SEQ = "Producer-Expected-Seq"
PRODUCER_RECEIVED_SEQ = "Producer-Received-Seq"

NO_STORE = "no-store"
# a page that ends before the tail never changes (until retention removes it: then 410)
IMMUTABLE_PAGE = "private, max-age=60, stale-while-revalidate=300"

_EXPOSED = ", ".join(
    (
        NEXT_OFFSET,
        UP_TO_DATE,
        CURSOR,
        CLOSED,
        TTL,
        EXPIRES_AT,
        SSE_ENCODING,
        PRODUCER_EPOCH,
        PRODUCER_SEQ,
        PRODUCER_EXPECTED_SEQ,
        PRODUCER_RECEIVED_SEQ,
        "ETag",
        "Location",
        "Retry-After",
    )
)
_ALLOWED_HEADERS = (
    "Authorization, Content-Type, If-None-Match, Last-Event-ID, Stream-Seq, Stream-TTL, Stream-Expires-At, "
    "Stream-Closed, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset, Producer-Id, Producer-Epoch, "
    "Producer-Seq"
)
_METHODS = "GET, HEAD, POST, PUT, DELETE, OPTIONS"


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every response of this surface, errors and event streams included (PROTOCOL.md 10.7): no MIME
    sniffing, fetchable cross-origin (callers authenticate with bearer tokens, never cookies)."""
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers.setdefault("Cross-Origin-Resource-Policy", "cross-origin")
    response.headers.setdefault("Access-Control-Allow-Origin", "*")
    response.headers.setdefault("Access-Control-Expose-Headers", _EXPOSED)


def preflight(request: web.Request) -> web.Response:
    requested = request.headers.get("Access-Control-Request-Headers")
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Methods": _METHODS,
            "Access-Control-Allow-Headers": f"{_ALLOWED_HEADERS}, {requested}" if requested else _ALLOWED_HEADERS,
            "Access-Control-Max-Age": "86400",
        },
    )


def _with(response: web.Response, headers: dict[str, str]) -> web.Response:
    response.headers.update(headers)
    return response


def error_response(exc: errors.StreamError) -> web.Response:
    """Our errors with the protocol's status codes: a stream that does not exist, or that this caller
    may not see, is 404 (as the protocol's clients expect), never a hint that it exists."""
    if isinstance(exc, errors.StreamNotFound) or type(exc) is errors.Forbidden:
        return problem(404, errors.NotFound.code, "no such stream (or not visible to this caller)")
    if isinstance(exc, StreamGone):
        return problem(410, exc.code, exc.detail)
    if isinstance(exc, NotDeletableHere):
        return problem(405, exc.code, exc.detail, {"Allow": "GET, HEAD, POST, PUT"})
    if isinstance(exc, ClosedStream):
        return _with(
            problem(409, exc.code, exc.detail),
            {CLOSED: "true", NEXT_OFFSET: encode_offset(exc.last_sequence)},
        )
    if isinstance(exc, StaleProducerEpoch):
        return _with(problem(403, exc.code, exc.detail, **exc.extra), {PRODUCER_EPOCH: str(exc.extra["current_epoch"])})
    if isinstance(exc, DurableConflict):
        extra: dict[str, Any] = dict(exc.extra)
        response = problem(409, exc.code, exc.detail, **extra)
        if "expected_seq" in extra:
            response.headers[PRODUCER_EXPECTED_SEQ] = str(extra["expected_seq"])
            response.headers[PRODUCER_RECEIVED_SEQ] = str(extra["received_seq"])
        if isinstance(exc, ContentTypeMismatch):
            response.headers["Accept-Post"] = str(extra["stream_content_type"])
        return response
    if isinstance(exc, errors.StreamClosed):  # from the shared append path
        return problem(409, exc.code, exc.detail, headers={CLOSED: "true"})
    return from_error(exc)


@web.middleware
async def durable_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Errors become responses here, so they carry this surface's status codes and headers."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except errors.StreamError as exc:
        if request.get(STREAMING):
            raise  # an event stream has begun: it can no longer become an error response
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400 or request.get(STREAMING):
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return problem(exc.status, f"http_{exc.status}", exc.reason, headers)
    except DB_UNAVAILABLE:
        if request.get(STREAMING):
            raise
        return problem(503, "database_unavailable", "the database is unavailable; retry", {"Retry-After": "1"})
