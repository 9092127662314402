"""The Durable Streams protocol's pure rules (domain/durable.py)."""

from __future__ import annotations

import datetime as dt
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflow_streams.adapters import wire
from workflow_streams.domain import durable as rules
from workflow_streams.domain.durable_pins import default_template, pins_from_template
from workflow_streams.domain.errors import InvalidInput, PayloadTooLarge

pytestmark = pytest.mark.unit

SEQUENCES = st.integers(min_value=0, max_value=2**63 - 1)


@given(SEQUENCES, SEQUENCES)
def test_offsets_order_as_strings_exactly_as_sequences_do(a: int, b: int) -> None:
    assert (rules.encode_offset(a) < rules.encode_offset(b)) == (a < b)
    assert len(rules.encode_offset(a)) == rules.OFFSET_WIDTH


@given(SEQUENCES)
def test_an_offset_parses_back_to_its_sequence(sequence: int) -> None:
    assert rules.parse_offset([rules.encode_offset(sequence)]).after == sequence


def test_sentinels_and_malformed_offsets() -> None:
    assert rules.parse_offset([]).resolve(earliest=4, latest=9) == 3
    assert rules.parse_offset(["-1"]).resolve(earliest=1, latest=9) == 0
    assert rules.parse_offset(["now"]).resolve(earliest=1, latest=9) == 9
    assert rules.parse_offset(["00000000000000000002"]).resolve(earliest=4, latest=9) == 2
    for bad in ("", "0,1", "0 1", "abc", "12", "-2", "0" * 19 + "a", "9" * 20):
        with pytest.raises(InvalidInput):
            rules.parse_offset([bad])
    with pytest.raises(InvalidInput):
        rules.parse_offset(["-1", "-1"])


def test_stream_names_map_to_our_streams() -> None:
    assert rules.stream_key("chat", "durable-streams") == ("durable-streams", "chat")
    assert rules.stream_key("run-1/out", "durable-streams") == ("run-1", "out")
    for bad in ("a/b/c", "../x", "a//b", "bad name"):
        with pytest.raises(InvalidInput):
            rules.stream_key(bad, "durable-streams")


def test_stream_seq_compares_bytewise() -> None:
    rules.check_stream_seq("10", "09")
    rules.check_stream_seq("a", None)
    rules.check_stream_seq(None, "z")
    for received, last in (("10", "2"), ("001", "001"), ("B", "a")):
        with pytest.raises(rules.SeqConflict):
            rules.check_stream_seq(received, last)


def _decide(state: tuple[int, int] | None, epoch: int, seq: int) -> rules.ProducerDecision:
    current = rules.ProducerState(*state) if state else None
    return rules.decide_producer(current, rules.Producer("p", epoch, seq))


def test_producer_decisions() -> None:
    accept = _decide(None, 0, 0)
    assert accept.verdict is rules.Verdict.ACCEPT and accept.state == rules.ProducerState(0, 0)
    assert _decide(None, 3, 0).state == rules.ProducerState(3, 0)
    assert _decide(None, 0, 1).verdict is rules.Verdict.GAP
    assert _decide((0, 4), 0, 5).state == rules.ProducerState(0, 5)
    duplicate = _decide((0, 4), 0, 2)
    assert duplicate.verdict is rules.Verdict.DUPLICATE and duplicate.state == rules.ProducerState(0, 4)
    gap = _decide((0, 4), 0, 7)
    assert gap.verdict is rules.Verdict.GAP and gap.expected_seq == 5
    assert _decide((2, 4), 1, 9).verdict is rules.Verdict.STALE_EPOCH
    assert _decide((2, 4), 3, 1).verdict is rules.Verdict.BAD_EPOCH_START
    assert _decide((2, 4), 3, 0).state == rules.ProducerState(3, 0)


def test_producer_headers_all_or_none() -> None:
    assert rules.parse_producer({}) is None
    assert rules.parse_producer({"Producer-Id": "p", "Producer-Epoch": "1", "Producer-Seq": "0"}) == rules.Producer(
        "p", 1, 0
    )
    for headers in (
        {"Producer-Id": "p"},
        {"Producer-Id": "p", "Producer-Epoch": "0"},
        {"Producer-Id": "", "Producer-Epoch": "0", "Producer-Seq": "0"},
        {"Producer-Id": "p", "Producer-Epoch": "1e3", "Producer-Seq": "0"},
        {"Producer-Id": "p", "Producer-Epoch": "-1", "Producer-Seq": "0"},
        {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "01"},
        {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": str(2**53)},
    ):
        with pytest.raises(InvalidInput):
            rules.parse_producer(headers)


def test_lifetimes() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ttl = rules.parse_lifetime("60", None)
    assert not ttl.expired(now, now + dt.timedelta(seconds=59))
    assert ttl.expired(now, now + dt.timedelta(seconds=60))
    assert ttl.remaining_ttl(now, now + dt.timedelta(seconds=20.5)) == 40
    fixed = rules.parse_lifetime(None, "2026-01-01T00:00:10+00:00")
    assert fixed.expires_at == now + dt.timedelta(seconds=10)
    assert fixed.expired(now, now + dt.timedelta(seconds=10))
    assert rules.parse_lifetime(None, "2026-01-01T00:00:10.000Z") == fixed
    assert rules.parse_lifetime(None, None) == rules.Lifetime()
    for ttl_text, expires in (("3600", "2026-01-01T00:00:00Z"), ("00060", None), ("+60", None), ("60.5", None)):
        with pytest.raises(InvalidInput):
            rules.parse_lifetime(ttl_text, expires)
    for expires in ("not-a-timestamp", "2026-01-01", "2026-01-01T00:00:00"):
        with pytest.raises(InvalidInput):
            rules.parse_lifetime(None, expires)


def test_json_mode_flattens_one_level() -> None:
    assert rules.json_messages(b'{"a": 1}', allow_empty=False) == [b'{"a":1}']
    assert rules.json_messages(b"[[1, 2], [3]]", allow_empty=False) == [b"[1,2]", b"[3]"]
    assert rules.json_messages(b"[]", allow_empty=True) == []
    with pytest.raises(InvalidInput):
        rules.json_messages(b"[]", allow_empty=False)
    with pytest.raises(InvalidInput):
        rules.json_messages(b"{ invalid", allow_empty=False)
    with pytest.raises(PayloadTooLarge):
        rules.json_messages(json.dumps("x" * 70_000).encode(), allow_empty=False)


def test_byte_appends_split_into_records_that_concatenate_back() -> None:
    body = bytes(range(256)) * 1000
    chunks = rules.byte_chunks(body, limit=65_536)
    assert b"".join(chunks) == body and max(len(c) for c in chunks) == 65_536


def test_cursor_never_goes_back_to_or_below_an_echoed_one() -> None:
    now = rules.CURSOR_EPOCH + dt.timedelta(seconds=20 * 1000 + 5)
    assert rules.stream_cursor(now, None) == "1000"
    assert rules.stream_cursor(now, "999") == "1000"
    rng = random.Random(7)
    for echoed in ("1000", "1500"):
        assert int(rules.stream_cursor(now, echoed, rng)) > int(echoed)


def test_sse_events_cannot_be_split_by_payload_line_breaks() -> None:
    event = wire.event("data", "a\r\n\r\nevent: control\rb\nc")
    assert event == b"event: data\ndata:a\ndata:\ndata:event: control\ndata:b\ndata:c\n\n"
    assert wire.data_text([b'{"a":1}', b"2"], "application/json") == '[{"a":1},2]'
    assert wire.data_text([b"\x00\xff"], "application/octet-stream") == "AP8="
    assert wire.control("05", "9", up_to_date=True, closed=True) == {
        "streamNextOffset": "05",
        "streamClosed": True,
        "upToDate": True,
    }


def test_template_pins_name_the_creator() -> None:
    template = default_template("eu-west-1", None)
    template["authorization"] = {"append": ["$creator"], "read": ["$creator", "group:readers"]}
    pins = pins_from_template(template, "alice")
    assert pins.authorization.append == ["alice"]
    assert pins.authorization.read == ["alice", "group:readers"]
    assert pins.placement.metadata_home == "eu-west-1"
