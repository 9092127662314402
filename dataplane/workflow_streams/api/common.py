"""Request and response helpers shared by the handlers."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..domain.errors import InvalidInput
from ..domain.ids import check_id

STREAM = "/runs/{run_id}/streams/{stream_id}"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(body), content_type="application/json", headers=headers)


async def read_json(request: web.Request) -> Any:
    if request.content_type != "application/json":
        raise InvalidInput("the request body must be application/json", field="Content-Type")
    text = await request.text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"malformed JSON: {exc.msg} at position {exc.pos}", field="/") from None


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


def stream_key(request: web.Request) -> tuple[str, str]:
    return (
        check_id("run_id", request.match_info["run_id"]),
        check_id("stream_id", request.match_info["stream_id"]),
    )
