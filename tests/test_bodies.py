"""A catch-up body held as parts (``store.bodies``): its runs and the whole cut where the records are,
whatever parts they came in; a planned page cut to its durable prefix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import pins
from workflow_streams.domain.cursor import Bounds
from workflow_streams.domain.pins import parse_pins
from workflow_streams.store.bodies import Body, Form, Part, Plan

pytestmark = pytest.mark.unit


def body(form: Form, *parts: list[bytes], after: int = 10) -> Body:
    separator = b"," if form in ("records", "messages") else b""
    made = [Part(separator.join(values), [len(v) for v in values]) for values in parts]
    count = sum(len(values) for values in parts)
    bounds = Bounds(earliest=1, latest=after + count)
    return Body(after, made, bounds, True, form)


VALUES = [[b"aaa", b"bb", b"", b"dddd"], [b"e", b"ffffff"], [b"g"]]


@pytest.mark.parametrize("form", ["records", "bytes"])
def test_the_whole_is_every_value_joined_once(form: Form) -> None:
    separator = b"," if form == "records" else b""
    whole = body(form, *VALUES)
    assert whole.joined(b"[", b"]") == b"[" + separator.join(v for part in VALUES for v in part) + b"]"
    assert body(form).joined(b"[", b"]") == b"[]"
    assert (whole.count, whole.next_after) == (7, 17)
    assert (body(form).count, body(form).next_after) == (0, 10)


def test_runs_hold_at_least_one_record_and_end_with_their_part() -> None:
    whole = body("records", *VALUES)
    assert list(whole.chunks(3)) == [(11, b"aaa"), (14, b"bb,,dddd"), (16, b"e,ffffff"), (17, b"g")]
    assert list(whole.chunks(1_000)) == [(14, b"aaa,bb,,dddd"), (16, b"e,ffffff"), (17, b"g")]
    # an empty record still moves the cursor
    assert list(body("bytes", [b"x", b""]).chunks(1)) == [(11, b"x"), (12, b"")]


@pytest.mark.parametrize("known", range(8, 20))
def test_a_plan_is_cut_to_its_durable_prefix(known: int) -> None:
    page = Plan(1, 10, 17, Bounds(earliest=1, latest=20), True, parse_pins(pins()), "digest", "1")
    served, held = page.held_back(known)
    end = min(max(10, known), 17)
    assert (served.after, served.end, served.count, held, served.closed) == (10, end, end - 10, 17 - end, False)
    assert served.bounds.latest == max(min(20, known), end)
    assert served.last_sequence == (end if end > 10 else None)


def test_a_body_of_some_of_a_closed_pages_parts_is_not_closed() -> None:
    page = Plan(1, 10, 13, Bounds(earliest=1, latest=13), True, parse_pins(pins()), "digest", "1")
    first, rest = Part(b"a,b", [1, 1]), Part(b"c", [1])
    assert not page.body("records", [first]).closed
    assert page.body("records", [rest], after=12).closed
    assert page.body("records", [first, rest]).closed
    assert page.body("records", [rest], after=12).next_after == 13


def _runs_record_by_record(values: list[list[bytes]], separator: bytes, budget: int) -> list[tuple[int, bytes]]:
    """What chunks means, one record at a time: a run ends once its values reach the budget, or with its part."""
    runs, last = [], 10
    for part in values:
        run: list[bytes] = []
        for value in part:
            run.append(value)
            last += 1
            if sum(map(len, run)) >= budget:
                runs.append((last, separator.join(run)))
                run = []
        if run:
            runs.append((last, separator.join(run)))
    return runs


@given(
    st.lists(st.lists(st.binary(max_size=12), min_size=1, max_size=20), max_size=5),
    st.integers(min_value=1, max_value=40),
    st.sampled_from(["records", "bytes"]),
)
def test_runs_are_cut_as_record_by_record(values: list[list[bytes]], budget: int, form: Form) -> None:
    separator = b"," if form == "records" else b""
    assert list(body(form, *values).chunks(budget)) == _runs_record_by_record(values, separator, budget)
