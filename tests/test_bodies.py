"""A catch-up body held as parts (``store.bodies``): runs, the whole and the durable prefix cut where the
records are, whatever parts they came in."""

from __future__ import annotations

import pytest

from tests.support import pins
from workflow_streams.domain.cursor import Bounds
from workflow_streams.domain.pins import parse_pins
from workflow_streams.store.bodies import Body, Form, Part

pytestmark = pytest.mark.unit


def body(form: Form, *parts: list[bytes], after: int = 10) -> Body:
    separator = b"," if form in ("records", "messages") else b""
    made = [Part(separator.join(values), [len(v) for v in values]) for values in parts]
    count = sum(len(values) for values in parts)
    bounds = Bounds(earliest=1, latest=after + count)
    return Body(after, made, bounds, True, parse_pins(pins()), "digest", "1", form)


VALUES = [[b"aaa", b"bb", b"", b"dddd"], [b"e", b"ffffff"], [b"g"]]


@pytest.mark.parametrize("form", ["records", "bytes"])
def test_the_whole_is_every_value_joined_once(form: Form) -> None:
    separator = b"," if form == "records" else b""
    whole = body(form, *VALUES)
    assert whole.joined(b"[", b"]") == b"[" + separator.join(v for part in VALUES for v in part) + b"]"
    assert body(form).joined(b"[", b"]") == b"[]"
    assert (whole.count, whole.next_after, whole.last_sequence) == (7, 17, 17)
    assert (body(form).count, body(form).last_sequence) == (0, None)


def test_runs_hold_at_least_one_record_and_end_with_their_part() -> None:
    whole = body("records", *VALUES)
    assert list(whole.chunks(3)) == [(11, b"aaa"), (14, b"bb,,dddd"), (16, b"e,ffffff"), (17, b"g")]
    assert list(whole.chunks(1_000)) == [(14, b"aaa,bb,,dddd"), (16, b"e,ffffff"), (17, b"g")]
    # an empty record still moves the cursor
    assert list(body("bytes", [b"x", b""]).chunks(1)) == [(11, b"x"), (12, b"")]


@pytest.mark.parametrize("known", range(8, 20))
@pytest.mark.parametrize("form", ["records", "bytes"])
def test_the_durable_prefix_is_cut_at_a_record(form: Form, known: int) -> None:
    separator = b"," if form == "records" else b""
    values = [v for part in VALUES for v in part]
    served, held = body(form, *VALUES).held_back(known)
    keep = min(max(0, known - 10), len(values))
    assert served.joined() == separator.join(values[:keep])
    assert (served.count, held, served.closed) == (keep, len(values) - keep, False)
    assert served.bounds.latest == max(min(17, known), 10 + keep)
