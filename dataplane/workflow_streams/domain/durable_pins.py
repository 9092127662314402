"""The pins of streams created through the Durable Streams surface: a server-side template.

The protocol's PUT carries no pins, so the server supplies them (``WFS_DS_TEMPLATE``). ``$creator`` in
an authorization list stands for the principal that creates the stream, so a template can give each
creator its own streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .pins import StreamPins
from .templates import resolve


def default_template(region: str, metadata_region: str | None) -> dict[str, Any]:
    """Any caller this server lets in may use the stream (``*``): the setting for a dev server or a
    surface whose callers are all trusted. Streams never run out of credit by being unread, since the
    protocol has no acknowledgements; their lifetime is the protocol's TTL or an explicit DELETE."""
    return {
        "direction": "output",
        "content_class": "model_output",
        "schema_ref": "durable-streams/v1",
        "placement": {
            "metadata_home": metadata_region or region,
            "object_regions": [region],
            "client_egress_regions": [region],
            "log_region": region,
        },
        "authorization": {"append": ["*"], "read": ["*"], "ack": ["*"], "close": ["*"], "legal_hold": []},
        "credit": {
            "max_unread_items": 1_000_000_000,
            "max_unread_bytes": 1 << 50,
            "policy": "block",
            "block_timeout_ms": 5000,
        },
    }


def pins_from_template(template: Mapping[str, Any], creator: str) -> StreamPins:
    """The template with ``$creator`` replaced, validated like pins sent to our own API."""
    return resolve(template, creator)
