"""Request and response helpers shared by the handlers."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from ..domain import strictjson
from ..domain.errors import InvalidInput, InvalidJson, RequestTimeout
from ..domain.ids import check_id
from ..domain.placement import client_region
from .state import principal_of, state_of

STREAM = "/runs/{run_id}/streams/{stream_id}"


# Responses get bytes and this header (aiohttp copies it): given text and ``content_type=``, aiohttp
# parses the content type and encodes the text on every response, and every append and read answers
# with one (figures: bench/README.md, constants).
JSON_HEADERS = {"Content-Type": "application/json"}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(body).encode(), headers={**JSON_HEADERS, **headers} if headers else JSON_HEADERS
    )


async def read_body(request: web.Request) -> bytes:
    """The whole body, within ``body_timeout_seconds`` and the app's ``client_max_size``."""
    content = request.content
    if content.is_eof():
        # All of it arrived with the headers (most appends): taken as it lies, with read()'s size check.
        # read() reads the stream until an empty chunk, a second pass through the reader (figures:
        # bench/README.md, constants).
        raw = content.read_nowait()
        if len(raw) > request.client_max_size:
            raise web.HTTPRequestEntityTooLarge(request.client_max_size, len(raw))
        return raw
    seconds = state_of(request).settings.body_timeout_seconds
    try:
        async with asyncio.timeout(seconds):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {seconds:g} s") from None


async def read_json(request: web.Request) -> Any:
    """The body as strict JSON (``domain.strictjson``): UTF-8 only, as RFC 8259 requires between systems."""
    if request.content_type != "application/json":
        raise InvalidInput("the request body must be application/json", field="Content-Type")
    if (request.charset or "utf-8").lower() not in ("utf-8", "utf8"):
        raise InvalidJson("JSON bodies are UTF-8", field="Content-Type", rule="encoding")
    raw = await read_body(request)
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise InvalidJson("the request body is not UTF-8", field="/", rule="encoding") from None
    return strictjson.loads(text)


def json_object(body: Any, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object", field="/")
    unknown = set(body) - allowed
    if unknown:
        raise InvalidInput(f"unknown field(s): {', '.join(sorted(unknown))}", field=min(unknown))
    missing = required - set(body)
    if missing:
        raise InvalidInput(f"missing field(s): {', '.join(sorted(missing))}", field=min(missing))
    return body


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def query(*names: str) -> Callable[[Handler], Handler]:
    """A handler that takes only the query parameters ``names``: any other is ``400 invalid_input``
    naming it, so a typo (``?afer=1``) is not silently read as no parameter at all. The caller is
    authenticated first, as the handler would (a route that takes ``access_token`` takes it as its token)."""
    allowed = frozenset(names)
    query_token = "access_token" in allowed

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def checked(request: web.Request) -> web.StreamResponse:
            if request.query_string:
                unknown = sorted(set(request.query) - allowed)
                if unknown:
                    await principal_of(request, query_token)  # without a valid token, nothing more is said
                    known = f"; it takes {', '.join(sorted(allowed))}" if allowed else "; it takes none"
                    detail = f"unknown query parameter(s): {', '.join(unknown)}{known}"
                    raise InvalidInput(detail, field=unknown[0], allowed=sorted(allowed))
            return await handler(request)

        return checked

    return wrap


def stream_key(request: web.Request) -> tuple[str, str]:
    return (
        check_id("run_id", request.match_info["run_id"]),
        check_id("stream_id", request.match_info["stream_id"]),
    )


async def chunks_with_idle_timeout(request: web.Request, seconds: float) -> AsyncIterator[bytes]:
    """The body in chunks; a body that stalls longer than ``seconds`` between chunks is abandoned."""
    while True:
        try:
            async with asyncio.timeout(seconds):
                chunk = await request.content.readany()
        except TimeoutError:
            raise RequestTimeout(f"the upload stalled for more than {seconds:g} s") from None
        if not chunk:
            return
        yield chunk


def client_region_of(request: web.Request) -> str:
    settings = state_of(request).settings
    return client_region(
        request.remote,
        request.headers.get("X-Forwarded-For"),
        settings.region_cidrs,
        settings.trusted_proxies,
        settings.region,
    )


# bodies smaller than this go as they are: compressing them costs more than it saves
COMPRESS_MIN_BYTES = 1024


def compressible(response: web.Response) -> web.Response:
    """Compressed with gzip or deflate if the request's Accept-Encoding asks for one (aiohttp chooses at
    prepare; nothing changes for a client that asks for neither) and the body is large enough."""
    body = response.body
    if isinstance(body, bytes | bytearray) and len(body) >= COMPRESS_MIN_BYTES:
        response.enable_compression()
    return response
