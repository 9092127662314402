"""Status conditions in the Kubernetes convention, kept pure so they are easy to test."""

from __future__ import annotations

import datetime as dt
from typing import Any


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: dt.datetime | None = None,
) -> list[dict[str, Any]]:
    """A new list with ``type_`` set; lastTransitionTime changes only when the status does."""
    value = "True" if status else "False"
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    previous = next((c for c in conditions if c.get("type") == type_), None)
    changed = previous is None or previous.get("status") != value
    condition = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": stamp if changed or previous is None else previous.get("lastTransitionTime", stamp),
    }
    return [c for c in conditions if c.get("type") != type_] + [condition]
