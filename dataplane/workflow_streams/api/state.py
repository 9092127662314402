"""What handlers share: typed application state and the caller's identity."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
from aiohttp import web

from ..config import Settings
from ..domain.authz import Principal
from ..store.wakes import WakeHub
from .auth import TokenAuthenticator


@dataclass
class AppState:
    settings: Settings
    pool: asyncpg.Pool
    hub: WakeHub
    authenticator: TokenAuthenticator


STATE = web.AppKey("workflow_streams_state", AppState)


def state_of(request: web.Request) -> AppState:
    return request.config_dict[STATE]


def principal_of(request: web.Request) -> Principal:
    return state_of(request).authenticator.authenticate(request)
