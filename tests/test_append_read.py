"""Ordered append and exclusive-cursor reads over HTTP."""

from __future__ import annotations

import asyncio
import base64

import asyncpg

from tests.support import BOB, EVE, StreamsApi, pins, problem


async def test_append_and_read_after_cursor(api: StreamsApi) -> None:
    await api.create("r", "s")
    one = await api.append("r", "s", {"n": 1})
    assert one.status == 201
    assert (await one.json())["sequences"] == [1]
    batch = await api.append("r", "s", {"n": 2}, {"n": 3}, {"n": 4})
    assert (await batch.json()) == {"first_sequence": 2, "last_sequence": 4, "sequences": [2, 3, 4]}

    page = await (await api.read("r", "s", after=1, limit=2)).json()
    assert [r["sequence"] for r in page["records"]] == [2, 3]
    assert [r["data"] for r in page["records"]] == [{"n": 2}, {"n": 3}]
    assert page["next_after"] == 3 and page["latest"] == 4 and page["earliest"] == 1

    page = await (await api.read("r", "s", after=page["next_after"])).json()
    assert [r["sequence"] for r in page["records"]] == [4]
    tail = await (await api.read("r", "s", after=4)).json()
    assert tail["records"] == [] and tail["next_after"] == 4


async def test_binary_records_round_trip(api: StreamsApi) -> None:
    await api.create("r", "s")
    payload = bytes(range(256))
    body = {"content_type": "application/octet-stream", "data_base64": base64.b64encode(payload).decode()}
    assert (await api.append("r", "s", body=body)).status == 201
    (record,) = (await (await api.read("r", "s")).json())["records"]
    assert base64.b64decode(record["data_base64"]) == payload
    assert record["size"] == 256


async def test_cursor_errors(api: StreamsApi) -> None:
    await api.create("r", "s")
    await api.append("r", "s", 1, 2)
    body = await problem(await api.read("r", "s", after=3), 400, "future_cursor")
    assert body["latest"] == 2
    for bad in ("-1", "abc", "1.5", "99999999999999999999", "0x10", " 1"):
        await problem(await api.read("r", "s", after=bad), 400, "invalid_input")
    for bad in ("0", "100001", "-3"):
        await problem(await api.read("r", "s", limit=bad), 400, "invalid_input")
    for bad in ("0", str(16 * 1024 * 1024 + 1), "1e3"):
        url = api.url("r", "s", "/records")
        await problem(await api.client.get(url, params={"max_bytes": bad}, headers=api.headers), 400, "invalid_input")
    await problem(await api.read("r", "missing"), 403, "forbidden")


async def test_inline_limit_is_64_kib_and_oversize_appends_nothing(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    exact = "x" * (64 * 1024 - 2)  # JSON string quotes make it exactly 64 KiB
    assert (await api.append("r", "s", exact)).status == 201
    body = await problem(await api.append("r", "s", exact + "y"), 413, "payload_too_large")
    assert body["limit"] == 65536
    # all-or-nothing: one oversized record sinks the whole batch
    await problem(await api.append("r", "s", "small", exact + "y"), 413, "payload_too_large")
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 1


async def test_malformed_batches_append_nothing(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    bad_bodies = [
        {"records": []},
        {"records": [{"data": 1}, {"data": 2, "extra": 1}]},
        {"records": [{"data": 1}, {"data_base64": "***"}]},
        {"records": [{"data": 1}, {"data": 1, "data_base64": "AA=="}]},
        {"records": [{"data": 1}, "not an object"]},
        {"content_type": "text/plain", "data": "json data needs a JSON content type"},
    ]
    for body in bad_bodies:
        await problem(await api.append("r", "s", body=body), 400, "invalid_input")
    resp = await api.client.post(
        api.url("r", "s", "/records"),
        data=b"{not json",
        headers={**api.headers, "Content-Type": "application/json"},
    )
    await problem(resp, 400, "invalid_json")
    assert await db.fetchval("SELECT last_sequence FROM wfs_streams") == 0
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 0


async def test_idempotent_retry_returns_original_sequences(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    first = await api.append("r", "s", "a", "b", key="k-1")
    assert first.status == 201
    await api.append("r", "s", "c")
    retry = await api.append("r", "s", "a", "b", key="k-1")
    assert retry.status == 200
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert (await retry.json())["sequences"] == [1, 2]
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 3
    await problem(await api.append("r", "s", "other", key="k-1"), 409, "idempotency_key_reused")


async def test_concurrent_same_key_appends_once(api: StreamsApi, db: asyncpg.Connection) -> None:
    await api.create("r", "s")
    responses = await asyncio.gather(*(api.append("r", "s", "once", key="same") for _ in range(10)))
    bodies = [await r.json() for r in responses]
    assert all(b["sequences"] == [1] for b in bodies)
    assert sorted(r.status for r in responses) == [200] * 9 + [201]
    assert await db.fetchval("SELECT count(*) FROM wfs_records") == 1


async def test_32_concurrent_producers_strict_order(api: StreamsApi, db: asyncpg.Connection) -> None:
    """No gaps, no duplicates, strictly ascending; each producer's records keep their order."""
    await api.create("r", "s")
    producers, rounds = 32, 10

    async def produce(p: int) -> list[int]:
        got = []
        for i in range(rounds):
            if i % 3 == 0:
                resp = await api.append("r", "s", {"p": p, "i": i, "part": 0}, {"p": p, "i": i, "part": 1})
            else:
                resp = await api.append("r", "s", {"p": p, "i": i, "part": 0})
            assert resp.status == 201, await resp.text()
            got.extend((await resp.json())["sequences"])
        return got

    assigned = await asyncio.gather(*(produce(p) for p in range(producers)))
    records = await api.read_all("r", "s")
    sequences = [r["sequence"] for r in records]
    total = producers * (rounds + (rounds + 2) // 3)
    assert sequences == list(range(1, total + 1))
    assert sorted(s for seqs in assigned for s in seqs) == sequences
    for p in range(producers):
        mine = [(r["data"]["i"], r["data"]["part"]) for r in records if r["data"]["p"] == p]
        assert mine == sorted(mine)
    # concurrent appends to one stream were group-committed: rows of one transaction share an xmin
    transactions = await db.fetchval("SELECT count(DISTINCT xmin::text) FROM wfs_records")
    assert transactions < producers * rounds
    # reading from every cursor returns exactly the suffix
    for cursor in (0, 1, total // 2, total - 1, total):
        page = await (await api.read("r", "s", after=cursor, limit=5)).json()
        assert [r["sequence"] for r in page["records"]] == list(range(cursor + 1, min(cursor + 5, total) + 1))


async def test_read_requires_read_right(api: StreamsApi) -> None:
    await api.create("r", "s", authorization={"read": ["alice"]})
    await api.append("r", "s", 1)
    await problem(await api.as_(BOB).read("r", "s"), 403, "forbidden")
    await problem(await api.as_(BOB).append("r", "s", 2), 403, "forbidden")
    await problem(await api.as_({}).read("r", "s"), 401, "unauthenticated")


async def test_metrics_are_exposed(api: StreamsApi) -> None:
    await api.create("r", "s")
    before = await (await api.client.get("/metrics")).text()
    await api.append("r", "s", 1, 2)
    await api.read("r", "s")
    text = await (await api.client.get("/metrics")).text()
    assert 'wfs_appended_records_total{kind="inline"}' in text
    assert "wfs_read_records_total" in text
    assert 'route="/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"' in text
    # append latency is the request histogram's series for the POST of records: one append, one observation
    assert _append_latency_count(text) == _append_latency_count(before) + 1
    # a lone append is a group-commit transaction of one request
    for series in ("wfs_group_commit_requests_count", "wfs_group_commit_requests_sum"):
        assert _sample(text, series) == _sample(before, series) + 1
    for name in (
        "wfs_subscriptions_open",
        "wfs_credit_waits_total",
        "wfs_backlog_unread_items",
        "wfs_delivery_outbox_lag_seconds",
        "wfs_worker_claims_total",
    ):
        assert name in text


def _append_latency_count(text: str) -> float:
    route = "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"
    return _sample(text, f'wfs_http_request_seconds_count{{method="POST",route="{route}"}}')


def _sample(text: str, series: str) -> float:
    """The value of one series (name and labels as exposed) in a scrape; 0 before its first write."""
    prefix = series + " "
    values = [float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix)]
    return values[0] if values else 0.0


async def test_rendered_records_match_the_decoded_form(api: StreamsApi, db: asyncpg.Connection) -> None:
    """The spliced JSON rendering says exactly what decoding and re-encoding would."""
    import json

    from workflow_streams.adapters import wire
    from workflow_streams.store.reads import RECORD_COLUMNS, stored_record

    await api.create("r", "s")
    values = [{"a": [1, 2.5, None, True]}, "line\nbreak \u2028 \u00e9 \U0001f600", 0, [], {"q": '"quoted"'}]
    await api.append("r", "s", *values)
    body = {"content_type": "text/plain; charset=utf-8", "data_base64": "aGk="}
    await api.append("r", "s", body=body)
    rows = await db.fetch(f"SELECT {RECORD_COLUMNS} FROM wfs_records r ORDER BY r.sequence")
    for record in map(stored_record, rows):
        assert json.loads(wire.record_bytes(record)) == wire.record_json(record)
    page = await (await api.read("r", "s")).json()
    assert [r.get("data") for r in page["records"][:5]] == values
    assert page["records"][5]["data_base64"] == "aGk="


async def test_a_record_row_does_not_store_what_its_stream_already_says(
    api: StreamsApi, db: asyncpg.Connection
) -> None:
    """Migration 483: the default content type and the stream's creator are NULL in the row, and every
    record still reads back with its content type; another appender is stored by name."""
    authorization = {**pins()["authorization"], "append": ["alice", "eve"]}
    assert (await api.create("r", "s", authorization=authorization)).status == 201
    assert (await api.append("r", "s", {"n": 1})).status == 201  # alice, the creator; JSON by default
    text = {"content_type": "text/plain; charset=utf-8", "data_base64": "aGk="}
    assert (await api.append("r", "s", body=text)).status == 201
    assert (await api.as_(EVE).append("r", "s", {"n": 3})).status == 201
    stored = await db.fetch("SELECT sequence, content_type, appended_by FROM wfs_records ORDER BY sequence")
    assert [tuple(row) for row in stored] == [
        (1, None, None),
        (2, "text/plain; charset=utf-8", None),
        (3, None, "eve"),
    ]
    read = await api.read_all("r", "s")
    assert [r["content_type"] for r in read] == ["application/json", "text/plain; charset=utf-8", "application/json"]


async def test_pages_of_many_streams_in_one_statement_are_the_single_reads(
    api: StreamsApi, db: asyncpg.Connection
) -> None:
    """``fetch_pages`` (a burst's batched reads) answers each key as ``fetch_page`` does, errors too."""
    from workflow_streams.domain.errors import StreamError
    from workflow_streams.store.reads import fetch_page, fetch_pages

    await api.create("r", "a")
    await api.create("r", "b")
    await api.append("r", "a", 1, 2, 3)
    await api.append("r", "b", 4)
    keys = [
        ("r", "a", 0, 2),  # a page cut by its limit
        ("r", "b", 0, 10),
        ("r", "a", 1, 10),  # the same stream again, at another cursor
        ("r", "missing", 0, 10),  # no such stream: 404
        ("r", "b", 5, 10),  # a cursor past the latest: 400
        ("r", "b", 1, 10),  # caught up: no records
    ]
    pages = await fetch_pages(db, keys)
    assert len(pages) == len(keys)
    for key, page in zip(keys, pages, strict=True):
        try:
            single = await fetch_page(db, *key)
        except StreamError as exc:
            assert isinstance(page, type(exc)), key
            assert (page.detail, page.extra) == (exc.detail, exc.extra), key
        else:
            assert page == single, key
    assert [r.sequence for r in pages[0].records] == [1, 2]  # type: ignore[union-attr]
    assert [r.sequence for r in pages[2].records] == [2, 3]  # type: ignore[union-attr]
    assert pages[5].records == []  # type: ignore[union-attr]
