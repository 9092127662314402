"""Rules written once in domain/ and asked by every layer: they must give one answer wherever they are used."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import pins
from workflow_streams.domain.authz import Principal, Trusted, authorize, permits
from workflow_streams.domain.errors import Forbidden, InvalidInput
from workflow_streams.domain.media import is_json, media_type
from workflow_streams.domain.objects import ObjectPins, Prepared
from workflow_streams.domain.pins import StreamPins, parse_pins
from workflow_streams.domain.records import is_json as records_is_json
from workflow_streams.domain.records import parse_append_body
from workflow_streams.domain.redaction import loggable_payload
from workflow_streams.domain.wakes import MAX_PAYLOAD_BYTES, RECORDS, Signal, decode, encode

pytestmark = pytest.mark.unit

JSON_TYPES = ["application/json", "Application/JSON", "application/json; charset=utf-8", "application/cloudevents+json"]
NOT_JSON = ["text/json", "application/x-ndjson", "application/jsonl", "text/plain", "application/octet-stream", ""]


@pytest.mark.parametrize("content_type", JSON_TYPES)
def test_json_types(content_type: str) -> None:
    assert is_json(content_type) and records_is_json(content_type)


@pytest.mark.parametrize("content_type", NOT_JSON)
def test_types_that_only_look_like_json_are_not(content_type: str) -> None:
    assert not is_json(content_type)


def test_media_type_drops_parameters_and_case() -> None:
    assert media_type(" Application/CloudEvents+JSON ; charset=utf-8") == "application/cloudevents+json"


def _pins(**overrides: Any) -> StreamPins:
    return parse_pins(pins(**overrides))


@pytest.mark.parametrize("content_type", JSON_TYPES + NOT_JSON)
def test_records_and_redaction_agree_on_which_payloads_are_json(content_type: str) -> None:
    """A payload sent as JSON ``data`` is masked field by field in a foreign log region; anything else is
    redacted whole. Before one rule, redaction took ``text/json`` for JSON and ``Application/JSON`` for not."""
    masked = _pins(redaction={"strategy": "mask_fields", "fields": ["/secret"]})
    payload = b'{"secret": "s3cr3t", "public": 1}'
    shown = loggable_payload(masked, payload, content_type, "elsewhere")
    accepts_data = True
    try:
        parse_append_body({"content_type": content_type, "data": {"secret": "s3cr3t", "public": 1}})
    except InvalidInput:
        accepts_data = False
    assert accepts_data == is_json(content_type)
    if accepts_data:
        assert "s3cr3t" not in shown and '"public": 1' in shown
    else:
        assert shown == f"<redacted {len(payload)} bytes>"


def test_one_rights_check_for_principals_and_trusted_callers() -> None:
    authorization = _pins(
        authorization={"append": ["alice"], "read": ["group:ops"], "ack": [], "close": [], "legal_hold": []}
    ).authorization
    alice, ops, eve = Principal("alice"), Principal("bob", frozenset({"ops"})), Principal("eve")
    assert permits(authorization, alice, "append") and not permits(authorization, alice, "read")
    assert permits(authorization, ops, "read") and permits(authorization, ops, "subscribe"), (
        "subscribe defaults to read"
    )
    assert permits(authorization, alice, "see") and not permits(authorization, eve, "see")
    assert permits(authorization, Trusted("system:operator"), "legal_hold"), "authorized outside the pins"
    with pytest.raises(Forbidden, match="may not legal hold"):
        authorize(authorization, alice, "legal_hold")
    with pytest.raises(Forbidden, match="no right on this stream"):
        authorize(authorization, eve, "see")


def test_an_idempotency_key_matches_what_it_prepared() -> None:
    pins = ObjectPins("k", "a" * 64, 10, "application/pdf", None, None, 60)
    prepared = Prepared("a" * 64, 10, "application/pdf", None, "eu-west-1")
    assert pins.same_as(prepared), "no region asked: the one chosen then is accepted"
    assert ObjectPins("k", "a" * 64, 10, "application/pdf", None, "eu-west-1", 60).same_as(prepared)
    assert not ObjectPins("k", "a" * 64, 10, "application/pdf", None, "us-east-1", 60).same_as(prepared)
    assert not ObjectPins("k", "b" * 64, 10, "application/pdf", None, None, 60).same_as(prepared)


def test_wake_payloads_round_trip_and_a_process_skips_its_own() -> None:
    signals = [Signal(RECORDS, "run", f"stream-{i}", i + 1, i + 3) for i in range(600)]
    payloads = encode(signals, "me")
    assert len(payloads) > 1
    assert all(len(p.encode()) <= MAX_PAYLOAD_BYTES for p in payloads)
    decoded = [decode(p) for p in payloads]
    assert {sender for sender, _ in decoded} == {"me"}
    assert [s for _, batch in decoded for s in batch] == signals
    # a process hears its own notifications; it delivered those signals at publish
    assert [decode(p, unless_from="me") for p in payloads] == [("me", [])] * len(payloads)
    assert decode(payloads[0], unless_from="another") == decoded[0]
