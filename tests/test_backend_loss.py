"""Postgres backends killed under load: appends are retried or answered 503, never 500; nothing lost or
doubled, and live subscribers still get every record once, in order.

``pg_terminate_backend`` is what a failover, an idle-session reaper or an operator's kill looks like to
the server's pooled connections. A connection killed inside the group commit's transaction used to
surface as asyncpg's ``InternalClientError`` from the COMMIT (its protocol still marked the previous
statement in progress), which no handler knew: a 500 for every request in the batch. Now a batch whose
connection is lost before its COMMIT is sent is tried again on another connection; lost during the
COMMIT, its callers get a 503 and retry with their Idempotency-Key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from tests.support import SseReader, StreamsApi, problem
from tests.test_sse import subscribe
from tests.waiting import eventually
from workflow_streams.shells.compose import create_app

APPENDERS = 12
APPENDS_EACH = 40
STREAMS = 3
KILL_EVERY = 4  # acknowledged appends between kills: connections die throughout, and work still progresses


async def _append_until_acknowledged(api: StreamsApi, stream: str, key: str, statuses: list[int]) -> None:
    """What a client does: retry a 503 with the same Idempotency-Key until the append is acknowledged."""
    answered_503 = False
    while True:
        resp = await api.append("r", stream, {"key": key}, key=key)
        statuses.append(resp.status)
        if resp.status == 201:
            return
        if resp.status == 200 and resp.headers.get("Idempotent-Replayed") == "true":
            # an earlier try was answered 503 (its connection lost during COMMIT) but had committed:
            # the retry with its key finds the receipt, as a client's would
            assert answered_503, "replayed before any try was refused: the key was used twice"
            return
        await problem(resp, 503, "database_unavailable")  # anything else fails the test here
        answered_503 = True
        assert resp.headers["Retry-After"] == "1"


async def test_killed_backends_cost_retries_not_errors(
    api: StreamsApi, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="workflow_streams")
    for s in range(STREAMS):
        assert (await api.create("r", f"s{s}")).status == 201
    statuses: list[int] = []
    progressed = asyncio.Event()
    done = False
    kills = 0

    async def appender(n: int) -> None:
        for i in range(APPENDS_EACH):
            await _append_until_acknowledged(api, f"s{(n + i) % STREAMS}", f"a{n}-{i}", statuses)
            if statuses.count(201) % KILL_EVERY == 0:
                progressed.set()

    async def killer() -> None:
        # every server connection (append pool, read pool, LISTEN, NOTIFY), each time appends progressed
        nonlocal kills
        while not done:
            await progressed.wait()
            progressed.clear()
            kills += await db.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name LIKE 'wfs-%' AND pid <> pg_backend_pid()"
            )

    # a live subscriber per stream, subscribed before the first append: its reads meet dead connections too
    readers = [SseReader(await subscribe(api, "r", f"s{s}")) for s in range(STREAMS)]
    per_stream = APPENDERS * APPENDS_EACH // STREAMS
    following = [asyncio.create_task(reader.records(per_stream)) for reader in readers]
    killing = asyncio.create_task(killer())
    try:
        await asyncio.gather(*(appender(n) for n in range(APPENDERS)))
    finally:
        done = True
        progressed.set()
        await killing
    for task in following:  # every record once, in order, no gaps: live delivery rode out the kills
        assert await task == list(range(1, per_stream + 1))
    for reader in readers:
        reader.resp.close()

    # the appends met dead connections: retried inside the server (lost before COMMIT) or answered 503
    met = [m for m in caplog.messages if "before COMMIT" in m or "database unavailable" in m]
    assert kills > 0 and met, "the test killed nothing an append noticed; it proved nothing"
    seen: list[str] = []
    for s in range(STREAMS):
        # the pool may still hand out a connection killed last: the read is run again on another
        records = await api.read_all("r", f"s{s}")
        sequences = [r["sequence"] for r in records]
        assert sequences == list(range(1, len(records) + 1))  # ascending, no gaps
        seen += [r["data"]["key"] for r in records]
    expected = [f"a{n}-{i}" for n in range(APPENDERS) for i in range(APPENDS_EACH)]
    assert sorted(seen) == sorted(expected)  # every acknowledged append exactly once


async def test_a_read_that_meets_a_killed_connection_is_run_again(
    api: StreamsApi, db: asyncpg.Connection, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Deterministic: the read is made to wait on a lock, and its backend is killed while it waits.
    Before, the request that drew a dead pooled connection got a 503."""
    caplog.set_level(logging.INFO, logger="workflow_streams")
    assert (await api.create("r", "s")).status == 201
    assert (await api.append("r", "s", {"n": 1})).status == 201

    async def waiting_reader(other_than: int = 0) -> int:
        return int(
            await db.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'wfs-pool'"
                " AND wait_event_type = 'Lock' AND pid <> $1",
                other_than,
            )
            or 0
        )

    holder = await asyncpg.connect(database_url)
    try:
        async with holder.transaction():
            await holder.execute("LOCK TABLE wfs_records IN ACCESS EXCLUSIVE MODE")
            reading = asyncio.create_task(api.read("r", "s", after=0))
            first = await eventually(waiting_reader, message="the read never waited on the lock")
            assert await db.fetchval("SELECT pg_terminate_backend($1)", first)
            # run again, on another connection, it waits on the lock once more
            await eventually(lambda: waiting_reader(other_than=first), message="the read was not run again")
        resp = await reading
    finally:
        await holder.close()
    assert resp.status == 200, await resp.text()
    assert [r["data"] for r in (await resp.json())["records"]] == [{"n": 1}]
    assert any("met a lost database connection" in m for m in caplog.messages)


class _Relay:
    """A TCP relay to Postgres that can hold back the end of a backend's connection: the server then
    reads a killed backend's last words (its FATAL) and not yet the close, as when the backend takes a
    while to exit. asyncpg's connection is then neither usable nor closed."""

    def __init__(self, port: int) -> None:
        self._port = port
        self.closing = asyncio.Event()  # released: closes pass through
        self.held = 0  # backends' closes being held back
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        self.closing.set()
        if self._server is not None:
            self._server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, hold: bool) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                if hold and not self.closing.is_set():
                    self.held += 1
                    await self.closing.wait()
            dst.close()

        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))


@pytest.fixture
async def relay(database_url: str) -> AsyncIterator[tuple[_Relay, str]]:
    """A relay to the test's database and the DSN through it (set up before the app, so it outlives it)."""
    dsn = urllib.parse.urlsplit(database_url)
    relay = _Relay(dsn.port or 5432)
    port = await relay.start()
    yield relay, dsn._replace(netloc=f"{dsn.username}@127.0.0.1:{port}").geturl()
    await relay.stop()


async def test_a_connection_whose_backend_died_is_not_used_again(
    relay: tuple[_Relay, str], aiohttp_client: Any, settings_for: Any, db: asyncpg.Connection
) -> None:
    """A killed backend's FATAL arrives before its close, and in between the connection refuses every
    statement (asyncpg's InternalClientError) without being closed. The pool gives out the connection
    given back last first, so each try of a read drew another dead one and the third answered 503. After
    one dead connection, every connection open now is replaced."""
    holding, relayed = relay
    # a pool of four, all open, all killed: more dead connections than a read has tries
    api = StreamsApi(await aiohttp_client(create_app(settings_for(relayed, pool_min=4, pool_max=4))))
    assert (await api.create("r", "s")).status == 201
    assert (await api.append("r", "s", {"n": 1})).status == 201
    killed = await db.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name LIKE 'wfs-%' AND datname = current_database()"
    )
    assert killed >= 4
    try:
        await eventually(lambda: holding.held == killed, message="the killed backends' closes never came")
        resp = await api.read("r", "s", after=0)
        assert resp.status == 200, await resp.text()
        assert [r["data"] for r in (await resp.json())["records"]] == [{"n": 1}]
        # the group commit's pool is smaller than its tries, so an append got through before too
        assert (await api.append("r", "s", {"n": 2})).status == 201
    finally:
        holding.closing.set()  # the closes arrive at last, before the app's shutdown waits for them
