"""Connections to Postgres: pools whose every use has a deadline, the transaction-pooler mode, and
transactions whose COMMIT is never cancelled.

Deadlines. A connection taken from a ``Pool`` is held under a deadline (``WFS_DATABASE_TIMEOUT_SECONDS``
by default): taking it waits at most until then, and a connection still held at the deadline is closed,
so whatever waits on it fails with ``DatabaseTimeout`` (a 503 for a request). Closed, not cancelled: a
cancelled COMMIT that waits for a synchronous standby stays committed on the primary, visible and not
replicated (Postgres says so in a WARNING), which a failover then erases; closing the socket leaves the
backend waiting, so the commit becomes visible only once the standby has it (or by the primary's crash
recovery, which ``runtime.durability`` guards readers against). An unknown outcome is the client's to
settle with its Idempotency-Key. Every TCP connection also has keepalives and a user timeout, so an idle
pooled connection to a peer that went away is found dead and replaced instead of hanging its next user.

The pooler mode (``WFS_DATABASE_POOLER=transaction``: PgBouncer, CloudNativePG's Pooler). A server
connection belongs to a client only for one transaction, so nothing may outlive one: no startup
parameters (stock PgBouncer refuses all but a few), no session settings (planner settings are ``SET
LOCAL`` inside the transactions that need them, in both modes: ``store.appends.BEGIN``), no named
prepared statements (another client's transaction would find them, or miss them): asyncpg's statement
cache is off, and ``PoolerConnection`` runs every statement unnamed, parsed with each execution in one
round trip. No session advisory locks (``store.migrate`` locks per transaction). LISTEN is never sent
through a pooler (``config``: a direct DSN for it, or polling).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from ..domain.errors import StreamError

POOLERS = ("none", "transaction")
Pooler = Literal["none", "transaction"]

DEFAULT_TIMEOUT_SECONDS = 5.0

# Dead-peer detection on every TCP connection to Postgres: probes after 5 s of silence, 2 s apart, 3 of
# them; and data sent but not acknowledged for 10 s closes the connection (TCP_USER_TIMEOUT, which also
# bounds the probes). A network that drops packets otherwise leaves a connection hanging for the whole
# cut plus TCP's retransmission backoff, minutes at worst. A Postgres busy on a long statement still
# acknowledges at the TCP level, so none of this limits how long a statement may run.
KEEPALIVE_IDLE_SECONDS = 5
KEEPALIVE_INTERVAL_SECONDS = 2
KEEPALIVE_PROBES = 3
USER_TIMEOUT_SECONDS = 10


class DatabaseTimeout(ConnectionError):
    """Postgres did not answer within the deadline: unreachable, as far as the caller can tell. A
    ``ConnectionError`` (so among ``DB_UNAVAILABLE``), and never worth an immediate retry: the retries
    for lost connections check for it."""


# what a Postgres restart or network loss looks like to a caller: worth a retry, not a bug
DB_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    # A backend killed inside a transaction: asyncpg's protocol can still mark the previous statement in
    # progress, and refuses the next one (the COMMIT, mostly) with this before sending it, so nothing
    # was committed and a retry is right (tests/test_backend_loss.py).
    asyncpg.InternalClientError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
)


@dataclass(frozen=True)
class Connecting:
    """How this process reaches Postgres, besides the DSN."""

    pooler: Pooler = "none"
    # the longest a request waits for Postgres: connecting, taking a pooled connection, its statements
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS

    def connect_arguments(self, application_name: str) -> dict[str, Any]:
        """asyncpg's ``connect`` arguments for this mode."""
        arguments: dict[str, Any] = {
            "timeout": self.timeout_seconds,
            # UTC whatever the database's default: Postgres writes catch-up records' timestamps in the
            # session's time zone (store.bodies), as wire.timestamp writes them, in UTC. A pooler keeps
            # both per client (PgBouncer tracks TimeZone and application_name).
            "server_settings": {"application_name": application_name, "TimeZone": "UTC"},
        }
        if self.pooler == "transaction":
            arguments["statement_cache_size"] = 0
        return arguments


# a direct connection with the default deadline
DIRECT = Connecting()


def set_keepalive(conn: asyncpg.Connection) -> None:
    """Keepalives and a user timeout on ``conn``'s TCP socket (Unix sockets need none).

    asyncpg offers no socket options of its own, so they are set on its transport's socket, which
    asyncio's ``get_extra_info`` hands out."""
    transport = conn._transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_SECONDS)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_SECONDS)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_SECONDS * 1000)


async def connect(dsn: str, connecting: Connecting, application_name: str) -> asyncpg.Connection:
    """One connection outside any pool (LISTEN, NOTIFY, migrations), set up as pooled ones are."""
    conn = await asyncpg.connect(dsn, **connecting.connect_arguments(application_name))
    set_keepalive(conn)
    return conn


@contextlib.contextmanager
def deadline(conn: asyncpg.Connection, at: float) -> Iterator[None]:
    """Until the block ends, ``conn`` is closed at loop time ``at`` if still in use: whatever waits on it
    fails, as ``DatabaseTimeout``. Closed, never cancelled (the module docstring says why)."""
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        conn.terminate()

    handle = asyncio.get_running_loop().call_at(at, expire)
    try:
        yield
    except Exception as exc:
        # Whatever a statement raises once its connection was closed under it is the deadline's doing:
        # asyncpg may say so with an AttributeError (a statement that awaited its description while
        # the connection went). A domain error is the caller's own, whenever it came.
        if expired and not isinstance(exc, DatabaseTimeout | StreamError):
            raise DatabaseTimeout("Postgres did not answer in time; the connection was closed") from exc
        raise
    finally:
        handle.cancel()


async def commit(conn: asyncpg.Connection, statement: str = "COMMIT") -> None:
    """Send COMMIT (or ``statement``, which starts with it) and wait for it, never cancelling it: a caller
    cancelled meanwhile closes the connection instead, and the commit's outcome is Postgres' to decide
    (the module docstring says why)."""
    sent = asyncio.ensure_future(conn.execute(statement))
    try:
        await asyncio.shield(sent)
    except asyncio.CancelledError:
        conn.terminate()
        raise


@contextlib.asynccontextmanager
async def transaction(conn: asyncpg.Connection, begin: str = "BEGIN") -> AsyncIterator[None]:
    """A transaction on ``conn``: ``begin`` (which may add ``SET LOCAL``s), then COMMIT (``commit``) if
    the block ends normally, ROLLBACK if it raises. Inside a transaction already open on ``conn`` the
    block joins it: the outer transaction commits or rolls back both."""
    if conn.is_in_transaction():
        yield
        return
    await conn.execute(begin)
    try:
        yield
    except BaseException:
        if not conn.is_closed() and conn.is_in_transaction():
            with contextlib.suppress(*DB_UNAVAILABLE, asyncpg.PostgresError):
                await conn.execute("ROLLBACK")
        raise
    await commit(conn)


class _OneLine(logging.Filter):
    """asyncpg's pool keeps its minimum size by reconnecting in the background, and logs a traceback for
    every try while Postgres is away (a restart, a failover, a partition): expected, so one line each."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], DB_UNAVAILABLE):
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()} ({type(exc).__name__}: {exc})"
            record.args = None
            record.exc_info = None
        return True


logging.getLogger("asyncpg.pool").addFilter(_OneLine())


async def _init_connection(conn: asyncpg.Connection) -> None:
    set_keepalive(conn)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """What a released connection needs beyond asyncpg's own rollback of an open transaction: nothing.

    asyncpg's default reset sends ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`` on
    every release: a round trip for every read, ack and group commit. Pooled connections here hold no
    session state to undo: no advisory locks (migrations lock per transaction), no cursors outside a
    transaction, no LISTEN (the wake source has its own connection), no SET (settings are SET LOCAL)."""


# The hot path's statements whose plans Postgres keeps behind a transaction pooler, by their SQL: the
# function each one runs as there, and the statement that calls it (``kept``).
_KEPT: dict[str, tuple[str, str]] = {}
_PARAMETER = re.compile(r"\$(\d+)")


def kept(sql: str) -> str:
    """Mark ``sql`` (a statement of the hot path) as one whose plan must not be made again on every
    execution; returns it unchanged.

    On a direct connection asyncpg keeps it prepared, and Postgres its plan, for the connection's life.
    Behind a transaction pooler nothing prepared outlives a transaction, and planning the append path's
    statements anew on every execution costs Postgres more than running them (figures: bench/README.md,
    constants). So ``migrate`` also makes each kept statement a PL/pgSQL function named by the hash of its
    SQL (PL/pgSQL keeps a function's plans per backend, across transactions and clients:
    ``kept_functions``), and a ``PoolerConnection`` calls the function instead. Named by hash, a changed
    statement is a new function, and the processes of the previous release keep calling theirs during a
    rolling upgrade."""
    function = "wfs_kept_" + hashlib.sha256(sql.encode()).hexdigest()[:16]
    count = max((int(n) for n in _PARAMETER.findall(sql)), default=0)
    _KEPT[sql] = (function, f"SELECT * FROM {function}({', '.join(f'${n}' for n in range(1, count + 1))})")
    return sql


def _call(sql: str) -> str:
    """What a pooled connection runs for ``sql``: the call of its function, if it is kept."""
    kept = _KEPT.get(sql)
    return sql if kept is None else kept[1]


async def kept_functions(conn: asyncpg.Connection) -> None:
    """Make (or keep) the function of every kept statement, with the parameter and column types Postgres
    describes for the statement itself (``migrate`` runs this after the migrations, in a transaction that
    holds its lock)."""
    for sql, (function, _) in _KEPT.items():
        statement = await conn.prepare(sql)
        types = await conn.fetch(
            "SELECT t.i, format_type(t.oid, NULL) AS name FROM unnest($1::oid[]) WITH ORDINALITY AS t(oid, i)",
            [p.oid for p in statement.get_parameters()] + [a.type.oid for a in statement.get_attributes()],
        )
        names = [row["name"] for row in sorted(types, key=lambda row: row["i"])]
        parameters = names[: len(statement.get_parameters())]
        columns = [f'"{a.name}" {t}' for a, t in zip(statement.get_attributes(), names[len(parameters) :], strict=True)]
        await conn.execute(
            f"CREATE OR REPLACE FUNCTION {function}({', '.join(parameters)}) RETURNS TABLE ({', '.join(columns)})"
            f" LANGUAGE plpgsql AS $wfs$\n#variable_conflict use_column\nBEGIN\nRETURN QUERY {sql};\nEND\n$wfs$"
        )


async def missing_kept_functions(conn: asyncpg.Connection) -> list[str]:
    """The kept statements' functions this database lacks (``migrate`` of this release makes them)."""
    rows = await conn.fetch(
        "SELECT f FROM unnest($1::text[]) AS f WHERE NOT EXISTS (SELECT FROM pg_proc WHERE proname = f)",
        [function for function, _ in _KEPT.values()],
    )
    return [row["f"] for row in rows]


class PoolerConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg is untyped here
    """A connection through a transaction pooler: every statement is an unnamed one, parsed again with
    each execution, and only its description (parameter and column types) is kept here.

    asyncpg with its statement cache off describes every statement before executing it: two round trips a
    statement. Through PgBouncer that doubles the append transaction's round trips (figures:
    bench/README.md, constants). Kept descriptions make each execution one round trip again: Parse, Bind,
    Execute and Sync go together, on whatever server connection the pooler gives the transaction, and a
    statement prepared by another client cannot be bound by mistake (an unnamed statement lives until the
    next Parse). The hot statements run as functions whose plans Postgres keeps per backend (``kept``), so
    the parse each time is cheap. asyncpg has no public hook for this: it overrides ``_get_statement``,
    which tests/test_pgbouncer.py exercises through a real PgBouncer."""

    # descriptions kept per connection: the statements the data plane runs are a few dozen
    MAX_STATEMENTS = 256

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unnamed: dict[tuple[Any, ...], Any] = {}

    async def _get_statement(
        self,
        query: str,
        timeout: float | None,  # noqa: ASYNC109 (asyncpg's signature)
        *,
        named: str | bool | None = False,
        use_cache: bool = True,
        ignore_custom_codec: bool = False,
        record_class: Any = None,
    ) -> Any:
        query = _call(query)
        key = (query, record_class, ignore_custom_codec)
        statement = self._unnamed.get(key) if not named else None
        if statement is not None:
            statement.mark_unprepared()  # parsed again, with its Bind, in the execution's round trip
            return statement
        statement = await super()._get_statement(
            query,
            timeout,
            named=named,
            use_cache=use_cache,
            ignore_custom_codec=ignore_custom_codec,
            record_class=record_class,
        )
        if not named and not statement.name:
            if len(self._unnamed) >= self.MAX_STATEMENTS:
                del self._unnamed[next(iter(self._unnamed))]
            self._unnamed[key] = statement
        return statement


class Pool:
    """asyncpg's pool, with a deadline on every use (``acquire``)."""

    def __init__(self, pool: asyncpg.Pool, connecting: Connecting) -> None:
        self._pool = pool
        self.connecting = connecting

    @contextlib.asynccontextmanager
    async def acquire(self, *, until: float | None = None) -> AsyncIterator[asyncpg.Connection]:
        """A connection for one unit of work, held until loop time ``until`` at most (by default the
        pool's deadline from now), its wait for a free connection included. A caller that waited before
        (queued behind other work) passes the deadline it started with, so that no request waits for
        Postgres longer than one deadline in all. (A pooled connection is asyncpg's
        ``PoolConnectionProxy``, which stands for a ``Connection``.)"""
        if until is None:
            until = self.deadline()
        conn = await self.take(until)
        try:
            with deadline(conn, until):
                yield conn
        finally:
            await self._pool.release(conn)

    def deadline(self) -> float:
        """The loop time by which work starting now must be done."""
        return asyncio.get_running_loop().time() + self.connecting.timeout_seconds

    async def take(self, until: float) -> asyncpg.Connection:
        """A connection, waited for until loop time ``until`` at most, to hold under ``deadline`` and give
        back with ``release`` (for a holder that outlives one block: the group commit keeps a begun
        transaction)."""
        seconds = until - asyncio.get_running_loop().time()
        if seconds <= 0:
            raise DatabaseTimeout("the deadline passed while the request waited for earlier work")
        try:
            # asyncio's timeout, not asyncpg's: that one runs every acquire in a task of its own (wait_for),
            # a turn of the event loop on the append path's every fresh connection
            async with asyncio.timeout_at(until):
                conn: asyncpg.Connection = await self._pool.acquire()
        except TimeoutError:
            raise DatabaseTimeout(f"no database connection within {max(seconds, 0):.3g} s") from None
        return conn

    async def release(self, conn: asyncpg.Connection) -> None:
        await self._pool.release(conn)

    def spare(self) -> int:
        """Connections that can be taken now without waiting for a holder to give one back: the idle
        ones, and those the pool has yet to open."""
        pool = self._pool
        spare: int = pool.get_idle_size() + pool.get_max_size() - pool.get_size()
        return spare

    async def replace_connections(self) -> None:
        """After a connection of this pool was found lost, and before trying again: every connection
        open now is replaced when it is next taken (or closed when given back).

        When Postgres loses backends (a failover, a restart, an operator killing them) it mostly loses
        them all, and each sends its FATAL before its connection closes. Between the two an idle pooled
        connection is neither usable nor closed: asyncpg refuses every statement on it
        (``InternalClientError``, "another operation (2) is in progress"), and the pool hands out the
        most recently given-back connection first, so each retry would draw the next dead one.
        SQLAlchemy invalidates its whole pool on a disconnect for the same reason; asyncpg's
        ``expire_connections`` does it lazily, with no round trip."""
        await self._pool.expire_connections()

    async def close(self) -> None:
        await self._pool.close()

    def terminate(self) -> None:
        self._pool.terminate()


async def create_pool(
    dsn: str,
    min_size: int = 2,
    max_size: int = 20,
    *,
    connecting: Connecting = DIRECT,
    application_name: str = "wfs-pool",
    **kwargs: Any,
) -> Pool:
    arguments = connecting.connect_arguments(application_name)
    if connecting.pooler == "transaction":
        arguments["connection_class"] = PoolerConnection
    if "server_settings" in kwargs:  # tests that look at settings given at connect
        arguments["server_settings"] = {**arguments["server_settings"], **kwargs.pop("server_settings")}
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        reset=_keep_session,
        **arguments,
        **kwargs,
    )
    assert pool is not None
    return Pool(pool, connecting)
