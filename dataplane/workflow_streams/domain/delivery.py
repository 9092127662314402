"""Input delivery: the deterministic event a waiting workflow run receives, and retry timing."""

from __future__ import annotations

import enum
import random
import uuid
from typing import Any

_NAMESPACE = uuid.UUID("5b0c3f8e-6f1e-4c1e-9a57-0476a11ce5ed")


def event_id(run_id: str, stream_id: str, sequence: int) -> str:
    """Derived only from (run, stream, sequence): every redelivery carries the same id."""
    return str(uuid.uuid5(_NAMESPACE, f"{run_id}/{stream_id}/{sequence}"))


def backoff_seconds(attempts: int, base: float = 0.5, cap: float = 300.0, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter after ``attempts`` failed attempts (attempts >= 1)."""
    ceiling = min(cap, base * 2 ** min(attempts - 1, 30))
    return (rng or random).uniform(ceiling / 2, ceiling)


class Outcome(enum.Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    PERMANENT = "permanent"


def classify(status: int) -> Outcome:
    """The wait service's answer. 2xx: accepted; 409: it already has this event id (also accepted).
    408, 425, 429 and 5xx are worth retrying; any other 4xx is a permanent failure."""
    if 200 <= status < 300 or status == 409:
        return Outcome.DELIVERED
    if status in (408, 425, 429) or status >= 500:
        return Outcome.RETRY
    return Outcome.PERMANENT


def event_body(run_id: str, stream_id: str, sequence: int, record: dict[str, Any]) -> dict[str, Any]:
    """What the wait service receives for one input record."""
    return {
        "event_id": event_id(run_id, stream_id, sequence),
        "type": "workflow_stream.input",
        "run_id": run_id,
        "stream_id": stream_id,
        "sequence": sequence,
        "record": record,
    }
