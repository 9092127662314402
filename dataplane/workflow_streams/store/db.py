"""Connection pool setup shared by the data plane, workers and operator."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

# what a Postgres restart or network loss looks like to a caller: worth a retry, not a bug
DB_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
)


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def create_pool(dsn: str, min_size: int = 2, max_size: int = 20, **kwargs: Any) -> asyncpg.Pool:
    kwargs.setdefault("server_settings", {"application_name": "wfs-pool"})
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=_init_connection, **kwargs)
    assert pool is not None
    return pool
