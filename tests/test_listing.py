"""GET /runs/{run_id}/streams: the run's streams a caller may see, page by page, each with its state."""

from __future__ import annotations

from typing import Any

from tests.support import ALICE, BOB, EVE, StreamsApi, problem

ONLY_ALICE = {"append": ["alice"], "read": ["alice"], "ack": [], "close": ["alice"], "legal_hold": ["alice"]}


async def listing(api: StreamsApi, run: str, **params: Any) -> dict[str, Any]:
    resp = await api.client.get(api.url(run), params={k: str(v) for k, v in params.items()}, headers=api.headers)
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def walk(api: StreamsApi, run: str, limit: int) -> list[list[str]]:
    """Every page's stream ids, following next_after to the end."""
    pages: list[list[str]] = []
    after = None
    while True:
        body = await listing(api, run, limit=limit, **({"after": after} if after else {}))
        pages.append([s["stream_id"] for s in body["streams"]])
        after = body["next_after"]
        if after is None:
            return pages
        assert pages[-1] and after == pages[-1][-1], "a page before the last is never empty"
        assert len(pages) < 100, "pagination does not progress"


async def test_pages_cover_the_run_in_order(api: StreamsApi) -> None:
    ids = [f"s{i:02d}" for i in range(7)]
    for stream in reversed(ids):
        assert (await api.create("r", stream)).status == 201
    assert (await api.create("other-run", "s99")).status == 201
    assert await walk(api, "r", limit=3) == [ids[0:3], ids[3:6], ids[6:7]]
    assert await walk(api, "r", limit=7) == [ids]
    assert await walk(api, "r", limit=1000) == [ids]
    assert await walk(api, "empty-run", limit=5) == [[]]
    # a cursor between ids, or past the end
    assert [s["stream_id"] for s in (await listing(api, "r", after="s03x"))["streams"]] == ids[4:]
    assert await listing(api, "r", after="zzz") == {"streams": [], "next_after": None}


async def test_each_stream_carries_its_state(api: StreamsApi) -> None:
    for stream in ("a", "b", "c"):
        await api.create("r", stream)
    await api.append("r", "a", 1, 2, 3)
    await api.close("r", "b")
    assert (await api.hold("r", "c", True, "matter 7", hold_id="m7")).status == 200
    body = await listing(api, "r")
    for item in body["streams"]:
        single = await (await api.get("r", item["stream_id"])).json()
        # a listed stream reads like GET of that stream, whose state tells more (unread, consumers, ...)
        assert {**item, "state": None} == {**single, "state": None}
        assert item["state"] == {key: single["state"][key] for key in item["state"]}
    states = {s["stream_id"]: s["state"] for s in body["streams"]}
    assert (states["a"]["last_sequence"], states["a"]["earliest_sequence"]) == (3, 1)
    assert (states["a"]["closed"], states["b"]["closed"], states["c"]["closed"]) == (False, True, False)
    assert (states["a"]["legal_hold"], states["c"]["legal_hold"]) == (False, True)
    assert [h["hold_id"] for h in states["c"]["legal_holds"]] == ["m7"]


async def test_streams_without_rights_are_not_revealed(api: StreamsApi) -> None:
    """Bob (group readers) sees the default streams; alice-only ones leave no trace, not even in the cursor."""
    visible, hidden = ["b1", "b2", "b3"], ["h1", "h2", "h3", "h4"]
    for stream in ["a0", *visible[:1], "h1", "h2", *visible[1:2], "h3", "h4", *visible[2:]]:
        only_alice = stream.startswith(("h", "a"))
        overrides = {"authorization": ONLY_ALICE} if only_alice else {}
        assert (await api.create("r", stream, **overrides)).status == 201
    bob, eve = api.as_(BOB), api.as_(EVE)
    assert await walk(bob, "r", limit=1) == [["b1"], ["b2"], ["b3"]]
    assert await walk(bob, "r", limit=2) == [["b1", "b2"], ["b3"]]
    # a first page of only hidden streams still has bob's next stream on it
    assert [s["stream_id"] for s in (await listing(bob, "r", after="a0", limit=1))["streams"]] == ["b1"]
    for page in [await listing(bob, "r", limit=n) for n in (1, 2, 3, 10)]:
        text = str(page)
        assert not any(f"'{h}'" in text for h in [*hidden, "a0"]), page
    assert await listing(eve, "r") == {"streams": [], "next_after": None}
    assert sum(len(page) for page in await walk(api, "r", limit=2)) == 8  # alice sees all


async def test_many_hidden_streams_between_visible_ones(api: StreamsApi) -> None:
    """More hidden streams than one scan reads: the page still fills from the visible ones behind them."""
    await api.create("r", "a-first")
    for i in range(230):
        assert (await api.create("r", f"h{i:03d}", authorization=ONLY_ALICE)).status == 201
    await api.create("r", "z-last")
    assert await walk(api.as_(BOB), "r", limit=1) == [["a-first"], ["z-last"]]
    assert await walk(api.as_(EVE), "r", limit=1) == [[]]


async def test_bad_parameters(api: StreamsApi) -> None:
    await api.create("r", "s")
    for params in ({"limit": "0"}, {"limit": "1001"}, {"limit": "x"}, {"after": "../x"}, {"after": "a" * 200}):
        resp = await api.client.get(api.url("r"), params=params, headers=ALICE)
        await problem(resp, 400, "invalid_input")
    await problem(await api.client.get(api.url("bad%20run"), headers=ALICE), 400, "invalid_input")
    await problem(await api.client.get(api.url("r")), 401, "unauthenticated")
