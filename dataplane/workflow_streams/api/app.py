"""The aiohttp application: routes, middleware and resource lifetimes."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram

from .. import API_PREFIX, metrics, payloadlog
from ..config import Settings
from ..objectstore import ObjectStore
from ..runtime.durability import Durability
from ..runtime.group_commit import GroupCommit
from ..runtime.interest import Interest
from ..runtime.listen_notify import ListenNotify
from ..runtime.live import Live
from ..runtime.reads import SharedReads
from ..runtime.supervisor import Supervisor
from ..runtime.wakes import PollOnly, WakeHub, WakeSource, process_id
from ..store.db import DB_UNAVAILABLE, Connecting, create_pool, missing_kept_functions
from ..workers.dispatcher import Dispatcher, DispatchSettings
from ..workers.metrics_sampler import run_sampler
from ..workers.objects import run_janitor
from ..workers.pruner import run_pruner
from . import events, objects, openapi, streams, subscribe
from .auth import TokenAuthenticator
from .durable import create_app as create_durable_app
from .kubeauth import TokenReviewer
from .problems import problem_middleware
from .state import STATE, AppState, remember_state

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


def dispatch_settings(settings: Settings) -> DispatchSettings:
    assert settings.wait_service_url
    return DispatchSettings(
        url=settings.wait_service_url,
        lease_seconds=settings.worker_lease_seconds,
        request_timeout_seconds=settings.delivery_timeout_seconds,
        backoff_base_seconds=settings.delivery_backoff_base_seconds,
        max_attempts=settings.delivery_max_attempts,
    )


def wake_source(settings: Settings) -> WakeSource:
    if settings.wake_source == "poll":
        return PollOnly()
    # never through a transaction pooler (config refuses LISTEN there without a direct DSN)
    connecting = Connecting(timeout_seconds=settings.database_timeout_seconds)
    return ListenNotify(
        settings.listen_url, process_id(), connecting=connecting, application_name=settings.listen_application_name
    )


def _add_routes(router: web.UrlDispatcher, prefix: str, table: web.RouteTableDef) -> None:
    """``table``'s routes on ``router`` under ``prefix``, names included (what a sub-app at ``prefix`` would
    serve, without a second router to walk)."""
    for route in table:
        assert isinstance(route, web.RouteDef)
        router.add_route(route.method, prefix + route.path, route.handler, **route.kwargs)


def create_app(settings: Settings, *, siblings: Siblings | None = None) -> web.Application:
    app = web.Application(
        client_max_size=settings.max_request_bytes, middlewares=[metrics_middleware, problem_middleware]
    )
    if siblings is not None:
        app[SIBLINGS] = siblings

    async def resources(app: web.Application) -> AsyncIterator[None]:
        payloadlog.install(settings.region)
        if settings.metadata_region is None:
            log.warning("WFS_METADATA_REGION is unset: metadata-home placement is not enforced")
        connecting = settings.connecting
        pool = await create_pool(settings.database_url, settings.pool_min, settings.pool_max, connecting=connecting)
        if settings.database_pooler == "transaction":  # its statements run as functions there (store.db.kept)
            async with pool.acquire() as conn:
                missing = await missing_kept_functions(conn)
            if missing:
                raise SystemExit(
                    f"the database lacks {len(missing)} function(s) of this release's statements"
                    f" ({', '.join(missing)}): run `workflow-streams migrate` of this release first"
                )
        # Group commit's own connections, one per transaction in flight, and one for the marks of watched
        # streams: their statements are planned under the settings they are written for (generic plans,
        # no sequential scans: store.appends.BEGIN says why), and each connection keeps its own plans.
        # On the main pool, Postgres would plan the marks' array statement afresh every time, most of what
        # a burst of subscribers costs Postgres (figures: bench/README.md, constants).
        append_pool = await create_pool(
            settings.database_url,
            1,
            GroupCommit.MAX_INFLIGHT + 1,
            connecting=connecting,
            application_name="wfs-appends",
        )
        supervisor = Supervisor()
        durability = Durability(pool)
        # with LISTEN/NOTIFY, the streams watched here are marked so that other processes announce their
        # commits (runtime.interest); poll-only mode announces nothing
        interest = Interest(append_pool) if settings.wake_source == "listen" else None
        hub = WakeHub(wake_source(settings), pool, settings.head_poll_seconds, interest=interest, durability=durability)
        await hub.start(supervisor)
        object_store = None
        if settings.s3_regions:
            object_store = ObjectStore(settings.s3_regions)
            await object_store.open()
        reviewer = TokenReviewer(settings.kube_auth) if settings.kube_auth else None
        authenticator = TokenAuthenticator(settings.tokens, reviewer)
        shared_reads = SharedReads(pool, hub, durability)
        live = Live(pool, hub, durability, shared_reads, supervisor, max_per_principal=settings.sse_max_per_principal)
        appends = GroupCommit(append_pool, hub, durability)
        app[STATE] = AppState(
            settings, pool, hub, authenticator, shared_reads, appends, live, supervisor, durability, object_store
        )
        supervisor.start("sampler", functools.partial(run_sampler, pool, settings.metrics_sample_seconds))
        if object_store is not None and settings.janitor_interval_seconds > 0:
            supervisor.start(
                "janitor",
                functools.partial(
                    run_janitor,
                    pool,
                    object_store,
                    settings.janitor_interval_seconds,
                    settings.deletion_outbox_retention_seconds,
                ),
            )
        if settings.prune_interval_seconds > 0:
            supervisor.start("pruner", functools.partial(run_pruner, pool, settings.prune_interval_seconds))
        if settings.wait_service_url:
            supervisor.start("dispatcher", Dispatcher(pool, hub, durability, dispatch_settings(settings)).run)
        yield
        await supervisor.stop()
        await live.close()
        await hub.stop()
        await durability.close()
        if reviewer is not None:
            await reviewer.close()
        if object_store is not None:
            await object_store.close()
        await appends.close()
        await append_pool.close()
        await pool.close()

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
