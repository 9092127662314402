"""The aiohttp application of both HTTP surfaces: routes, middleware, health and readiness. What it
serves from (pools, wake hub, live reads, workers) is made by the composition root, ``shells.compose``."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram

from .. import API_PREFIX
from ..adapters import metrics
from ..adapters.config import Settings
from ..store.db import DB_UNAVAILABLE
from . import events, objects, openapi, streams, subscribe
from .durable import create_app as create_durable_app
from .problems import problem_middleware
from .state import STATE, remember_state

log = logging.getLogger(__name__)


@web.middleware
async def metrics_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    remember_state(request)
    route = request.match_info.route.resource
    name = route.canonical if route is not None else "unmatched"
    started = time.perf_counter()
    status = 500
    try:
        response: web.StreamResponse = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        requests, seconds = _http_metrics(name, request.method, status)
        requests.inc()
        if seconds is not None:
            seconds.observe(time.perf_counter() - started)


@functools.lru_cache(maxsize=1024)  # routes x methods x statuses: a few dozen in practice
def _http_metrics(route: str, method: str, status: int) -> tuple[Counter, Histogram | None]:
    """The labelled children for one kind of request, found once: ``labels()`` takes a lock and builds
    the key on every call, which costs more than the increment itself (figures: bench/README.md, constants)."""
    requests = metrics.HTTP_REQUESTS.labels(route, method, str(status))
    # a subscription's duration is not a latency
    seconds = None if route.endswith("/subscribe") else metrics.HTTP_SECONDS.labels(route, method)
    return requests, seconds


async def _metrics(request: web.Request) -> web.Response:
    # of every worker under `serve --workers N` (metrics.exposition), else of this process
    return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


# the application's resources: made on startup (an ``AppState`` at ``STATE``), released on cleanup
Resources = Callable[[web.Application], AsyncIterator[None]]


class Siblings(Protocol):
    """The other worker processes of ``serve --workers N`` (``serving``), as readiness sees them."""

    def started(self) -> None:
        """This worker is listening and its startup is done."""

    def starting(self) -> int:
        """Workers (of all N) not yet started."""


SIBLINGS = web.AppKey("workflow_streams_siblings", Siblings)


# /readyz waits at most this long for Postgres: a probe must answer, and answer 503, while Postgres is
# unreachable (the chart's probe allows 3 s)
READY_TIMEOUT_SECONDS = 2.0


async def _ready(request: web.Request) -> web.Response:
    """Ready: every worker serves, the background tasks live delivery needs run, and Postgres answers."""
    # Ready once every worker serves, not only the one answering: keep-alive connections opened while
    # another still starts would all stay on the first (the kernel gives a new connection only to a
    # socket that listens then), for as long as they live.
    siblings = request.app.get(SIBLINGS)
    if siblings is not None and (starting := siblings.starting()):
        return _unready(f"{starting} worker process(es) still starting")
    state = request.app[STATE]
    if down := state.supervisor.down():
        return _unready(f"background task(s) down: {', '.join(down)}")
    if not state.hub.connected.is_set():
        return _unready("listen connection down")
    try:
        timeout = min(READY_TIMEOUT_SECONDS, state.settings.database_timeout_seconds)
        async with state.pool.acquire(until=asyncio.get_running_loop().time() + timeout) as conn:
            await conn.fetchval("SELECT 1")
    except DB_UNAVAILABLE as exc:
        return _unready(f"database unreachable: {exc}")
    return web.json_response({"status": "ready"})


def _unready(status: str) -> web.Response:
    return web.json_response({"status": status}, status=503)


def _add_routes(router: web.UrlDispatcher, prefix: str, table: web.RouteTableDef) -> None:
    """``table``'s routes on ``router`` under ``prefix``, names included (what a sub-app at ``prefix`` would
    serve, without a second router to walk)."""
    for route in table:
        assert isinstance(route, web.RouteDef)
        router.add_route(route.method, prefix + route.path, route.handler, **route.kwargs)


def http_app(settings: Settings, resources: Resources, *, siblings: Siblings | None = None) -> web.Application:
    """Both HTTP surfaces, their middleware and the health, readiness and metrics endpoints. ``resources``
    (an aiohttp cleanup context, ``shells.compose``) makes the pools, wake hub and workers and puts the
    ``AppState`` the handlers use at ``STATE``."""
    app = web.Application(
        client_max_size=settings.max_request_bytes, middlewares=[metrics_middleware, problem_middleware]
    )
    if siblings is not None:
        app[SIBLINGS] = siblings

    # The API's routes sit on the root app under its prefix. As a sub-app they would cost every request a
    # second walk of the router and one more middleware layer (figures: bench/README.md, constants).
    for table in (streams.routes, subscribe.routes, objects.routes):
        _add_routes(app.router, API_PREFIX, table)
    app.router.add_get(API_PREFIX + "/openapi.json", openapi.serve)
    app[openapi.OPENAPI] = openapi.document()
    app[events.OPEN_STREAMS] = weakref.WeakSet()
    app.on_shutdown.append(events.close_open_streams)
    app.cleanup_ctx.append(resources)
    if siblings is not None:

        async def started(app: web.Application) -> None:  # after the cleanup contexts' startup
            siblings.started()

        app.on_startup.append(started)
    app.router.add_get("/healthz", _health)
    app.router.add_get("/readyz", _ready)
    app.router.add_get("/metrics", _metrics)
    if settings.durable_prefix:  # the Durable Streams protocol over the same store and wakes
        app.add_subapp(settings.durable_prefix, create_durable_app())
    return app
