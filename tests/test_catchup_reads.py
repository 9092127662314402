"""Catch-up reads assembled by Postgres (store/bodies.py) say what the rows say: each form is, record for
record, the bytes wire.py makes of the same rows; pages keep their record and byte budgets; and the SQL
JSON rule is domain.media.is_json."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import ALICE, SseReader, StreamsApi
from tests.waiting import eventually
from workflow_streams.adapters import wire
from workflow_streams.domain.errors import CursorExpired
from workflow_streams.domain.media import is_json
from workflow_streams.runtime.durability import Durability
from workflow_streams.runtime.reads import (
    PART_CONNECTIONS,
    PART_LOOKAHEAD,
    PART_RECORDS,
    PART_SPARE_KEPT,
    read_bodies,
    whole,
)
from workflow_streams.store.bodies import Body, Form, fetch_part, plan
from workflow_streams.store.db import DIRECT, create_pool
from workflow_streams.store.reads import fetch_page

BIG = 10**9
DS = "/api/durable-streams/v1/stream"


async def fetch_body(
    conn: asyncpg.Connection,
    run: str,
    stream: str,
    after: int,
    form: Form,
    *,
    max_records: int,
    max_bytes: int,
    first_records: int = 3,
) -> Body:
    """A page planned and read on one connection, as runtime.reads does on several: its first records
    with the plan, the rest as one more part."""
    page = await plan(
        conn, run, stream, after, form, max_records=max_records, max_bytes=max_bytes, first_records=first_records
    )
    parts = [page.first] if page.first is not None else []
    if page.end > after + first_records:
        parts.append(await fetch_part(conn, page, form, after + first_records + 1, page.end))
    return page.body(form, parts)


async def _mixed_stream(api: StreamsApi, db: asyncpg.Connection) -> int:
    """A stream with every kind of record: JSON of several shapes and content types, bytes, an object."""
    await api.create("r", "mixed")
    records: list[dict[str, Any]] = [
        {"data": {"text": "line one\nline two", "n": 1, "unicode": "é✓"}},
        {"data": [1, 2.5, None, True]},
        {"data": "a string"},
        {"content_type": "application/vnd.example+json; charset=utf-8", "data": {"x": 1}},
        {"content_type": "application/octet-stream", "data_base64": base64.b64encode(bytes(range(256)) * 3).decode()},
        {"content_type": "text/plain", "data_base64": base64.b64encode(b"plain\r\ntext").decode()},
    ]
    resp = await api.append("r", "mixed", body={"records": records})
    assert resp.status == 201, await resp.text()
    # an object record as the objects API leaves it (its bytes would be in S3)
    key, last, total = await db.fetchrow(
        "SELECT stream_key, last_sequence, appended_bytes FROM wfs_streams WHERE run_id = 'r' AND stream_id = 'mixed'"
    )
    reference = {"region": "eu-west-1", "bucket": "b", "key": "k", "size": 5000, "sha256": "00", "content_type": "x/y"}
    await db.execute(
        """INSERT INTO wfs_records
               (stream_key, sequence, cumulative_bytes, appended_at, content_type, appended_by, object)
           VALUES ($1, $2, $3, now(), 'x/y', 'alice', $4::jsonb)""",
        key,
        last + 1,
        total + 5000,
        json.dumps(reference),
    )
    await db.execute(
        "UPDATE wfs_streams SET last_sequence = $2, appended_bytes = $3 WHERE stream_key = $1",
        key,
        last + 1,
        total + 5000,
    )
    return last + 1


async def test_every_form_is_what_the_rows_make(api: StreamsApi, db: asyncpg.Connection, database_url: str) -> None:
    last = await _mixed_stream(api, db)
    # whatever the database's time zone, the server's connections write timestamps in UTC
    await db.execute(f"ALTER DATABASE {await db.fetchval('SELECT current_database()')} SET timezone = 'Asia/Kolkata'")
    server = await asyncpg.connect(database_url, **DIRECT.connect_arguments("test"))
    # timestamps with whole seconds and trailing zeros, which both must write alike
    await db.execute(
        "UPDATE wfs_records SET appended_at = '2026-01-01T00:00:00Z'::timestamptz + sequence * '0.25 s'::interval"
    )
    # the server's connections decode jsonb (an object record's reference) as JSON
    await db.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")

    rows = (await fetch_page(db, "r", "mixed", 0, 100)).records
    assert len(rows) == last

    async def body(form: Any) -> bytes:
        fetched = await fetch_body(server, "r", "mixed", 0, form, max_records=BIG, max_bytes=BIG)
        assert (fetched.next_after, fetched.count) == (last, last)
        return fetched.joined()

    records = await body("records")
    assert json.loads(b"[" + records + b"]") == json.loads(b"[" + b",".join(map(wire.record_bytes, rows)) + b"]")
    # byte for byte where nothing needs reformatting (no object, ASCII content types)
    assert records.split(b',{"sequence":2,')[0] == wire.record_bytes(rows[0])
    messages = await body("messages")
    assert json.loads(b"[" + messages + b"]") == json.loads(b"[" + b",".join(map(wire.message, rows)) + b"]")
    assert await body("bytes") == b"".join(r.payload for r in rows if r.payload is not None)
    events = (await body("events")).split(b"\n\n")
    await server.close()
    expected = b"".join(map(wire.record_event, rows)).split(b"\n\n")
    assert len(events) == len(expected) == last + 1
    for got, want in zip(events[:-1], expected[:-1], strict=True):
        head, _, data = got.partition(b"data: ")
        want_head, _, want_data = want.partition(b"data: ")
        assert head == want_head and json.loads(data) == json.loads(want_data)


async def test_pages_keep_their_budgets(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "budget")
    for start in range(0, 1000, 250):
        resp = await api.append("r", "budget", *["x" * 98 for _ in range(start, start + 250)])  # 100 bytes each
        assert resp.status == 201

    async def read(after: int, **budget: int) -> Any:
        return await fetch_body(db, "r", "budget", after, "records", **{"max_records": BIG, **budget})

    assert (await read(0, max_bytes=10_000)).count == 100
    assert (await read(500, max_bytes=10_000)).next_after == 600
    assert (await read(0, max_bytes=10_050)).next_after == 100, "the budget is exact, not rounded up"
    assert (await read(0, max_bytes=BIG, max_records=7)).count == 7
    assert (await read(0, max_bytes=1)).count == 1, "a page holds at least one record"
    assert (await read(995, max_bytes=BIG)).count == 5
    assert (await read(1000, max_bytes=BIG)).parts == []
    whole = await fetch_body(db, "r", "budget", 0, "bytes", max_records=BIG, max_bytes=BIG, first_records=BIG)
    runs = list(whole.chunks(1000))  # 100-byte values, so ten each
    assert [last for last, _ in runs] == list(range(10, 1001, 10))
    assert b"".join(joined for _, joined in runs) == whole.joined() == (b'"' + b"x" * 98 + b'"') * 1000


async def test_a_body_after_pruned_records_counts_from_the_cursor(api: StreamsApi, db: asyncpg.Connection) -> None:
    from workflow_streams.store.retention import prune_stream

    await api.create("r", "pruned", retention={"max_records": 100})
    for _ in range(4):
        assert (await api.append("r", "pruned", *["y" * 98 for _ in range(100)])).status == 201
    await prune_stream(db, "r", "pruned")
    earliest = await db.fetchval("SELECT earliest_sequence FROM wfs_streams WHERE stream_id = 'pruned'")
    body = await fetch_body(db, "r", "pruned", earliest - 1, "bytes", max_records=BIG, max_bytes=1000)
    assert body.count == 10 and body.after == earliest - 1


_TYPES = st.one_of(
    st.sampled_from(
        [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            " application/json ;x=y",
            "application/ld+json",
            "application/vnd.a+JSON;q=1",
            "text/json",
            "application/jsonx",
            "+json",
            "application/octet-stream",
            "text/plain",
        ]
    ),
    st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), min_size=1, max_size=40).filter(str.isprintable),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content_types=st.lists(_TYPES, min_size=1, max_size=20))
async def test_the_sql_json_rule_is_the_domain_rule(database_url: str, content_types: list[str]) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        got = await conn.fetch("SELECT t, wfs_is_json(t) AS j FROM unnest($1::text[]) AS t", content_types)
    finally:
        await conn.close()
    assert {row["t"]: row["j"] for row in got} == {t: is_json(t) for t in content_types}


async def test_readers_far_behind_get_every_record_once_in_order(client: Any, api: StreamsApi) -> None:
    """A subscriber of either surface with a long backlog reads it as catch-up pages, then follows live:
    every record once, in order, and a record appended after it connected too."""
    await api.create("run-1", "long")
    for start in range(0, 3000, 500):
        assert (await api.append("run-1", "long", *range(start + 1, start + 501))).status == 201
    ours = SseReader(await client.get(api.url("run-1", "long", "/subscribe"), headers=api.headers))
    theirs = SseReader(await client.get(f"{DS}/run-1/long?offset=-1&live=sse", headers=ALICE))
    assert await ours.records(3000, seconds=30) == list(range(1, 3001))
    messages: list[int] = []
    while len(messages) < 3000:
        event = await theirs.next(30)
        assert event is not None
        if event.event == "data":
            messages += json.loads(event.data)
    assert messages == list(range(1, 3001))
    assert (await api.append("run-1", "long", 3001)).status == 201
    assert await ours.records(1) == [3001]
    while (event := await theirs.next()) is not None and event.event != "data":
        pass
    assert event is not None and json.loads(event.data) == [3001]


async def _long_stream(api: StreamsApi, stream: str, records: int, **definition: Any) -> None:
    await api.create("r", stream, **definition)
    for start in range(0, records, 1000):
        resp = await api.append("r", stream, *[{"n": n} for n in range(start, min(start + 1000, records))])
        assert resp.status == 201, await resp.text()


async def test_a_page_of_many_parts_is_every_record_in_order(api: StreamsApi) -> None:
    """A page longer than one part (Postgres joins each part) is its records in order, one after the
    other across the parts, gzip when asked, as pages of one part each give."""
    records = 3 * PART_RECORDS + 5
    await _long_stream(api, "long", records)
    url = api.url("r", "long", f"/records?after=0&limit={records}&max_bytes={16 * 1024 * 1024}")
    for encoding in ("identity", "gzip"):
        resp = await api.client.get(url, headers={**api.headers, "Accept-Encoding": encoding})
        assert resp.status == 200, await resp.text()
        assert resp.headers.get("Content-Encoding", "identity") == encoding
        page = await resp.json()
        assert [r["data"]["n"] for r in page["records"]] == list(range(records))
        assert [r["sequence"] for r in page["records"]] == list(range(1, records + 1))
        assert (page["next_after"], page["latest"]) == (records, records)
    assert [r["data"] for r in await api.read_all("r", "long")] == [r["data"] for r in page["records"]]


async def test_a_closed_stream_far_behind_closes_only_after_its_last_record(client: Any, api: StreamsApi) -> None:
    """A closed stream's catch-up is written part by part; the close comes once, after the last record,
    on both surfaces."""
    await api.create("run-1", "ended")
    records = 2 * PART_RECORDS + 7
    for start in range(0, records, 1000):
        assert (await api.append("run-1", "ended", *range(start + 1, min(start + 1000, records) + 1))).status == 201
    assert (await api.close("run-1", "ended")).status == 200
    ours = SseReader(await client.get(api.url("run-1", "ended", "/subscribe"), headers=api.headers))
    seen: list[int] = []
    while (event := await ours.next(30)) is not None and event.event == "record":
        seen.append(json.loads(event.data)["data"])
    assert seen == list(range(1, records + 1)) and event is not None and event.event == "close", event
    theirs = SseReader(await client.get(f"{DS}/run-1/ended?offset=-1&live=sse", headers=ALICE))
    messages: list[int] = []
    controls: list[dict[str, Any]] = []
    while (event := await theirs.next(30)) is not None:
        if event.event == "data":
            messages += json.loads(event.data)
        elif event.event == "control":
            controls.append(json.loads(event.data))
    assert messages == list(range(1, records + 1))
    assert [bool(c.get("streamClosed")) for c in controls] == [False] * (len(controls) - 1) + [True]


async def test_a_page_leaves_the_pools_last_connections_to_others(api: StreamsApi, database_url: str) -> None:
    """A page of many parts reads on more than one connection only with what the pool has to spare beyond
    PART_SPARE_KEPT, which it leaves to appends and live reads: in a pool that small, on one."""
    records = 4 * PART_CONNECTIONS * PART_RECORDS  # every lane would still be reading after the first part
    await _long_stream(api, "narrow", records)
    pool = await create_pool(database_url, 1, PART_SPARE_KEPT)
    held, most = 0, 0
    acquire = pool.acquire

    @contextlib.asynccontextmanager
    async def counted(*args: Any, **kwargs: Any) -> AsyncIterator[asyncpg.Connection]:
        nonlocal held, most
        async with acquire(*args, **kwargs) as conn:
            held += 1
            most = max(most, held)
            try:
                yield conn
            finally:
                held -= 1

    pool.acquire = counted  # type: ignore[method-assign]
    try:
        each = read_bodies(pool, Durability(pool), "r", "narrow", 0, "records", max_records=BIG, max_bytes=BIG)
        async with contextlib.aclosing(each):
            got = [body async for body in each]
        assert most == 1, "the parts after the plan's were read on one connection"
        assert len(got) > PART_LOOKAHEAD
        assert got[-1].next_after == records
        values = json.loads(b"[" + b",".join(body.joined() for body in got) + b"]")
        assert [r["data"]["n"] for r in values] == list(range(records))
    finally:
        await pool.close()


async def test_a_page_pruned_part_way_ends_where_what_was_given_out_ends(
    api: StreamsApi, db: asyncpg.Connection, database_url: str
) -> None:
    """Records pruned while a catch-up page is read, after its first part was given out: what was given
    out stands and the page ends there, whole records in order; reading on says they are gone (410)."""
    from workflow_streams.store.retention import prune_stream

    records = 20 * PART_RECORDS
    await _long_stream(api, "shrinking", records, retention={"max_records": 100})
    pool = await create_pool(database_url, 1, 1)  # one lane: it reads the parts one after another
    try:
        durability = Durability(pool)
        each = read_bodies(pool, durability, "r", "shrinking", 0, "records", max_records=BIG, max_bytes=BIG)
        async with contextlib.aclosing(each):
            got = [await anext(each)]
            # the lane is reading the next part or two: it waits for the lock, then finds the records gone
            async with db.transaction():
                await db.execute("LOCK TABLE wfs_records IN ACCESS EXCLUSIVE MODE")
                assert await prune_stream(db, "r", "shrinking") == records - 100
            got += [body async for body in each]
        assert all(later.after == earlier.next_after for earlier, later in itertools.pairwise(got))
        given = got[-1].next_after
        assert PART_RECORDS <= given < records - 100 and given % PART_RECORDS == 0
        values = json.loads(b"[" + b",".join(body.joined() for body in got) + b"]")
        assert [r["sequence"] for r in values] == list(range(1, given + 1))
        with pytest.raises(CursorExpired):
            await whole(read_bodies(pool, durability, "r", "shrinking", given, "records", max_records=BIG, max_bytes=9))
    finally:
        await pool.close()


async def test_a_reader_that_stops_has_only_the_lookahead_read_for_it(
    api: StreamsApi, db: asyncpg.Connection, database_url: str
) -> None:
    """Parts are read at most PART_LOOKAHEAD ahead of the one handed on, and a reader that stops reading
    holds no connection meanwhile: records pruned while it stopped end its page right after those parts."""
    from workflow_streams.store.retention import prune_stream

    records = (PART_LOOKAHEAD + 4) * PART_RECORDS
    await _long_stream(api, "slow", records, retention={"max_records": 100})
    size = PART_SPARE_KEPT + PART_CONNECTIONS  # room for every lane
    pool = await create_pool(database_url, 1, size)
    try:
        each = read_bodies(pool, Durability(pool), "r", "slow", 0, "records", max_records=BIG, max_bytes=BIG)
        async with contextlib.aclosing(each):
            got = [await anext(each)]
            await eventually(lambda: pool.spare() == size, message="the lanes still hold connections")
            assert await prune_stream(db, "r", "slow") == records - 100
            got += [body async for body in each]
        assert got[-1].next_after == PART_LOOKAHEAD * PART_RECORDS
    finally:
        await pool.close()
