"""Errors as RFC 9457 ``application/problem+json`` with a stable ``code``."""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from ..domain import errors
from ..runtime.retries import lost_connection
from ..store.db import DB_UNAVAILABLE
from .state import STREAMING, state_of

log = logging.getLogger(__name__)

PROBLEM_TYPE = "application/problem+json"

STATUS: dict[type[errors.StreamError], int] = {
    errors.InvalidInput: 400,
    errors.FutureCursor: 400,
    errors.FutureAck: 400,
    errors.Unauthenticated: 401,
    errors.Forbidden: 403,
    errors.ConsumerScopeMismatch: 403,
    errors.NotFound: 404,
    errors.PinsConflict: 409,
    errors.StreamClosed: 409,
    errors.NotAnInputStream: 409,
    errors.IdempotencyKeyReused: 409,
    errors.AckRegression: 409,
    errors.QuotaExhausted: 409,
    errors.CursorExpired: 410,
    errors.PayloadTooLarge: 413,
    errors.InvalidDefinition: 422,
    errors.ForbiddenContentClass: 422,
    errors.BatchExceedsCredit: 422,
    errors.ObjectExceedsCredit: 422,
    errors.NotAnObject: 409,
    errors.ObjectGone: 410,
    errors.RangeNotSatisfiable: 416,
    errors.Backpressure: 429,
    errors.ObjectMismatch: 422,
    errors.ObjectEvidenceMismatch: 409,
    errors.IntentState: 409,
    errors.IntentExpired: 409,
    # 421 Misdirected Request: the stream pins object regions this data plane does not serve; retrying
    # here never helps (a 503 told clients to), a data plane serving the region can answer
    errors.ObjectRegionUnavailable: 421,
    errors.StreamHeld: 409,
    errors.OwnedElsewhere: 409,
    errors.RequestTimeout: 408,
    errors.PlacementViolation: 403,
    errors.AuthUnavailable: 503,
    errors.TooManySubscriptions: 429,
}

_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def problem(status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any) -> web.Response:
    body = {
        "type": f"urn:workflow-streams:problem:{code}",
        "title": code.replace("_", " "),
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return web.Response(status=status, body=json.dumps(body), content_type=PROBLEM_TYPE, headers=headers)


def status_of(error: type[errors.StreamError]) -> int:
    """An error's status: its own, else its nearest base class's."""
    return next((STATUS[cls] for cls in error.__mro__ if cls in STATUS), 400)


def codes() -> dict[str, int]:
    """Every problem code a domain error can carry, with its status (for the OpenAPI document)."""
    out: dict[str, int] = {}
    pending: list[type[errors.StreamError]] = [errors.StreamError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is not errors.StreamError:
            out.setdefault(cls.code, status_of(cls))
    return out


# One answer for "no such stream" and "not yours": nothing is revealed about streams a caller cannot see.
NOT_VISIBLE = "the stream does not exist, or this principal may not do this on it"


def from_error(exc: errors.StreamError) -> web.Response:
    if isinstance(exc, errors.StreamNotFound) or type(exc) is errors.Forbidden:
        return problem(403, errors.Forbidden.code, NOT_VISIBLE)
    status = status_of(type(exc))
    headers = {}
    if isinstance(exc, errors.Backpressure | errors.TooManySubscriptions):
        headers["Retry-After"] = str(getattr(exc, "retry_after", 5))
    if isinstance(exc, errors.Unauthenticated):
        headers["WWW-Authenticate"] = 'Bearer realm="workflow-streams"'
    if isinstance(exc, errors.RangeNotSatisfiable):
        headers["Content-Range"] = f"bytes */{exc.extra['size']}"
    return problem(status, exc.code, exc.detail, headers, **exc.extra)


# A pooled connection that died while idle (a restarted or failed-over Postgres, a killed backend) is found
# only when it is used, and every such connection cost the request that drew it a 503. A read meets it
# before it has answered or changed anything, so it is simply run again, on a new connection (the pool's
# connections are all replaced first: they mostly die together); writes have their own retries (the group
# commit's, or the client's with an Idempotency-Key). A deadline that passed is not retried: the caller's
# time is up.
_READ_METHODS = frozenset(("GET", "HEAD"))
_READ_TRIES = 3


@web.middleware
async def problem_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        try:
            response: web.StreamResponse = await handler(request)
        except Exception as exc:
            if request.method not in _READ_METHODS or not _retryable(request, exc):
                raise
            # the first try runs bare (every request pays it); only a retry pays for the retry loop
            log.info("%s %s met a lost database connection (%s); running it again", request.method, request.path, exc)
            response = await _read_again(request, handler)
        return response
    except Exception as exc:
        # redirects pass through; a started stream can no longer become a problem response
        if request.get(STREAMING) or (isinstance(exc, web.HTTPException) and exc.status < 400):
            raise
        return problem_for(request, exc)


async def _read_again(request: web.Request, handler: Any) -> web.StreamResponse:
    async def replace_connections(_state: RetryCallState) -> None:
        await state_of(request).pool.replace_connections()

    async for attempt in AsyncRetrying(
        stop=stop_after_attempt(_READ_TRIES - 1),
        retry=retry_if_exception(lambda exc: _retryable(request, exc)),
        before=replace_connections,
        reraise=True,
    ):
        with attempt:
            response: web.StreamResponse = await handler(request)
    return response


def _retryable(request: web.Request, exc: BaseException) -> bool:
    return not request.get(STREAMING) and lost_connection(exc)


def problem_for(request: web.Request, exc: Exception) -> web.Response:
    if isinstance(exc, errors.StreamError):
        return from_error(exc)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = request.client_max_size
        return problem(
            413,
            "payload_too_large",
            f"the request body is larger than this server takes ({limit} bytes); "
            "send fewer records per request, or a large payload as an object (the objects API)",
            field="/",
            limit_bytes=limit,
        )
    if isinstance(exc, web.HTTPException):
        code = _HTTP_CODES.get(exc.status, f"http_{exc.status}")
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return problem(exc.status, code, exc.reason, headers)
    if isinstance(exc, DB_UNAVAILABLE):
        log.warning("database unavailable on %s %s: %s", request.method, request.path, exc)
        return problem(
            503,
            "database_unavailable",
            "the database is unavailable; retry (appends with an Idempotency-Key are safe to retry)",
            {"Retry-After": "1"},
        )
    log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return problem(500, "internal_error", "the server failed; the request may be retried")
