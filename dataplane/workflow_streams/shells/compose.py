"""The composition root of a data plane: one process's pools, wake hub, durability, live reads, group
commit and background workers, made when its HTTP application starts (``api.app.http_app``) and released
when it stops. ``serve`` runs it in each worker process; ``dev`` and the tests in theirs."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from ..adapters import payloadlog
from ..adapters.config import Settings
from ..adapters.objectstore import ObjectStore
from ..api.app import Siblings, http_app
from ..api.auth import TokenAuthenticator
from ..api.kubeauth import TokenReviewer
from ..api.state import STATE, AppState
from ..runtime.durability import Durability
from ..runtime.group_commit import GroupCommit
from ..runtime.interest import Interest
from ..runtime.listen_notify import ListenNotify
from ..runtime.live import Live
from ..runtime.reads import SharedReads
from ..runtime.supervisor import Supervisor
from ..runtime.wakes import PollOnly, WakeHub, WakeSource, process_id
from ..store.db import Connecting, create_pool, missing_kept_functions
from ..workers.dispatcher import Dispatcher, DispatchSettings
from ..workers.metrics_sampler import run_sampler
from ..workers.objects import run_janitor
from ..workers.pruner import run_pruner

log = logging.getLogger(__name__)


def create_app(settings: Settings, *, siblings: Siblings | None = None) -> web.Application:
    """A data plane's HTTP application with everything it serves from."""
    return http_app(settings, functools.partial(_resources, settings), siblings=siblings)


async def _resources(settings: Settings, app: web.Application) -> AsyncIterator[None]:
    """Made on startup, released in reverse on cleanup (an aiohttp cleanup context)."""
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
