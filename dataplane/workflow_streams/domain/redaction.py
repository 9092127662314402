"""What of a payload may appear in logs: everything in the pinned log region, redacted elsewhere."""

from __future__ import annotations

import copy
import json
from typing import Any

from .media import is_json
from .pins import StreamPins

MASK = "***"


def loggable_payload(pins: StreamPins, payload: bytes | None, content_type: str, here: str) -> str:
    """The payload as a log may show it in region ``here``."""
    if payload is None:
        return "<object>"
    if here == pins.placement.log_region:
        return payload.decode(errors="replace")
    if pins.redaction.strategy == "drop_payload" or not is_json(content_type):
        return f"<redacted {len(payload)} bytes>"
    try:
        value = json.loads(payload)
    except ValueError:
        return f"<redacted {len(payload)} bytes>"
    return json.dumps(mask(value, pins.redaction.fields))


def mask(value: Any, pointers: list[str]) -> Any:
    """A copy of ``value`` with each JSON pointer's target replaced by a mask."""
    result = copy.deepcopy(value)
    for pointer in pointers:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
        target = result
        for part in parts[:-1]:
            target = _step(target, part)
            if target is None:
                break
        else:
            last = parts[-1]
            if isinstance(target, dict) and last in target:
                target[last] = MASK
            elif isinstance(target, list) and last.isdigit() and int(last) < len(target):
                target[int(last)] = MASK
    return result


def _step(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return None
