"""The Durable Streams protocol (github.com/durable-streams/durable-streams, PROTOCOL.md) over the
same Postgres store, append path and wake hub as our own API, mounted at ``WFS_DS_PREFIX``
(``/api/durable-streams``): streams live at ``<prefix>/v1/stream/<name>``."""

from __future__ import annotations

from aiohttp import web

from . import headers, routes


def create_app() -> web.Application:
    """The sub-application; its handlers find the shared state through ``request.config_dict``."""
    app = web.Application(middlewares=[headers.durable_errors])
    app.on_response_prepare.append(headers.add_security_headers)
    app.router.add_route("PUT", routes.STREAM_PATH, routes.put)
    app.router.add_route("HEAD", routes.STREAM_PATH, routes.head)
    app.router.add_get(routes.STREAM_PATH, routes.get, allow_head=False)
    app.router.add_route("POST", routes.STREAM_PATH, routes.post)
    app.router.add_route("DELETE", routes.STREAM_PATH, routes.delete)
    app.router.add_route("OPTIONS", routes.STREAM_PATH, routes.options)
    # everything else under the prefix still answers with this surface's headers
    app.router.add_route("*", "/{tail:.*}", routes.not_found)
    return app
