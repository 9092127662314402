"""What handlers share: typed application state and the caller's identity."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from ..adapters.config import Settings
from ..adapters.objectstore import ObjectStore
from ..domain.authz import Principal
from ..runtime.durability import Durability
from ..runtime.group_commit import GroupCommit
from ..runtime.live import Live
from ..runtime.reads import SharedReads
from ..runtime.supervisor import Supervisor
from ..runtime.wakes import WakeHub
from ..store.db import Pool
from .auth import TokenAuthenticator


@dataclass
class AppState:
    settings: Settings
    pool: Pool
    hub: WakeHub
    authenticator: TokenAuthenticator
    shared_reads: SharedReads
    appends: GroupCommit
    live: Live
    supervisor: Supervisor
    durability: Durability
    object_store: ObjectStore | None = None


STATE = web.AppKey("workflow_streams_state", AppState)
# set on a request once its streaming response has started: errors can no longer become responses
STREAMING = web.RequestKey("workflow_streams_streaming", bool)


# the state, kept on the request by the root app's first middleware: handlers of a sub-app (Durable
# Streams) would otherwise reach the root's keys through config_dict, a chain that raises and catches
# KeyError in the sub-app first, on every lookup of every request (figures: bench/README.md, constants)
_REQUEST_STATE = web.RequestKey("workflow_streams_request_state", AppState)


def remember_state(request: web.Request) -> None:
    """Called by the root app's first middleware, where ``request.app`` is the root app."""
    request[_REQUEST_STATE] = request.app[STATE]


def state_of(request: web.Request) -> AppState:
    state = request.get(_REQUEST_STATE)
    return state if state is not None else request.config_dict[STATE]


async def principal_of(request: web.Request, allow_query_token: bool = False) -> Principal:
    return await state_of(request).authenticator.authenticate(request, allow_query_token)
