"""Property-based tests of the cursor rule against a model."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import StreamsApi
from workflow_streams.domain.cursor import Bounds, check_cursor
from workflow_streams.domain.errors import CursorExpired, FutureCursor
from workflow_streams.store.retention import prune_stream


def model_read(retained: list[int], latest: int, after: int, limit: int) -> tuple[str, list[int]]:
    """The rule, stated over a plain list of retained sequences."""
    if after > latest:
        return "future", []
    if (retained and after + 1 < retained[0]) or (not retained and after < latest):
        return "expired", []
    return "ok", [s for s in retained if s > after][:limit]


@pytest.mark.unit
@given(
    earliest_offset=st.integers(0, 50),
    count=st.integers(0, 50),
    after=st.integers(0, 120),
    limit=st.integers(1, 20),
)
def test_check_cursor_matches_the_model(earliest_offset: int, count: int, after: int, limit: int) -> None:
    earliest = earliest_offset + 1
    latest = earliest + count - 1
    retained = list(range(earliest, latest + 1))
    expected, _records = model_read(retained, max(latest, earliest - 1), after, limit)
    try:
        check_cursor(after, Bounds(earliest=earliest, latest=max(latest, earliest - 1)))
        outcome = "ok"
    except FutureCursor:
        outcome = "future"
    except CursorExpired as exc:
        outcome = "expired"
        assert exc.extra["earliest"] == earliest and exc.extra["requested"] == after + 1
    assert outcome == expected


Op = tuple[str, int, int]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4), st.just(0)),
        st.tuples(st.just("prune"), st.just(0), st.just(0)),
        st.tuples(st.just("read"), st.integers(0, 30), st.integers(1, 6)),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=ops)
@pytest.mark.slow
async def test_http_reads_follow_the_model(api: StreamsApi, db: asyncpg.Connection, operations: list[Op]) -> None:
    """Random appends, prunes (max_records=5) and reads over HTTP agree with the list model."""
    stream = f"s-{uuid.uuid4().hex[:12]}"
    await api.create("prop", stream, retention={"max_records": 5})
    retained: list[int] = []
    latest = 0
    for kind, a, b in operations:
        if kind == "append":
            resp = await api.append("prop", stream, *range(a)) if a > 1 else await api.append("prop", stream, 0)
            assert resp.status == 201
            new = list(range(latest + 1, latest + a + 1))
            assert (await resp.json())["sequences"] == new
            retained += new
            latest += a
        elif kind == "prune":
            await prune_stream(db, "prop", stream)
            retained = retained[-5:]
        else:
            expected, records = model_read(retained, latest, a, b)
            resp = await api.read("prop", stream, after=a, limit=b)
            status = {"ok": 200, "future": 400, "expired": 410}[expected]
            assert resp.status == status, (a, b, retained, latest, await resp.text())
            if status == 200:
                assert [r["sequence"] for r in (await resp.json())["records"]] == records
