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
    # A backend killed inside a transaction: asyncpg's protocol can still mark the previous statement in
    # progress, and refuses the next one (the COMMIT, mostly) with this before sending it, so nothing
    # was committed and a retry is right (tests/test_backend_loss.py; it was a 500 for the whole batch).
    asyncpg.InternalClientError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
)


async def replace_connections(pool: asyncpg.Pool) -> None:
    """After a connection of ``pool`` was found lost, and before trying again: every connection open now
    is replaced when it is next taken (or closed when given back).

    When Postgres loses backends (a failover, a restart, an operator killing them) it mostly loses them
    all, and each sends its FATAL before its connection closes. Between the two an idle pooled
    connection is neither usable nor closed: asyncpg refuses every statement on it
    (``InternalClientError``, "another operation (2) is in progress"). The pool hands out the most
    recently given-back connection first, so a retry drew the next dead one: three tries of a read met
    three and answered 503 (the rare failure of tests/test_backend_loss.py). SQLAlchemy invalidates its
    whole pool on a disconnect for the same reason; asyncpg's ``expire_connections`` does it lazily,
    with no round trip."""
    await pool.expire_connections()


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """What a released connection needs beyond asyncpg's own rollback of an open transaction: nothing.

    asyncpg's default reset sends ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`` on
    every release: a round trip for every read, ack and group commit (the append transaction's fifth,
    after BEGIN, the lock, the write and COMMIT). Pooled connections here hold no session state to undo:
    no advisory locks (migrations lock on a connection of their own), no cursors outside a transaction,
    no LISTEN (the wake source has its own connection), no SET (settings are fixed at connect)."""


async def create_pool(dsn: str, min_size: int = 2, max_size: int = 20, **kwargs: Any) -> asyncpg.Pool:
    kwargs.setdefault("server_settings", {"application_name": "wfs-pool"})
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=_init_connection, reset=_keep_session, **kwargs
    )
    assert pool is not None
    return pool
