"""Input delivery: the deterministic event a waiting workflow run receives, and retry timing."""

from __future__ import annotations

import random
import uuid

_NAMESPACE = uuid.UUID("5b0c3f8e-6f1e-4c1e-9a57-0476a11ce5ed")


def event_id(run_id: str, stream_id: str, sequence: int) -> str:
    """Derived only from (run, stream, sequence): every redelivery carries the same id."""
    return str(uuid.uuid5(_NAMESPACE, f"{run_id}/{stream_id}/{sequence}"))


def backoff_seconds(attempts: int, base: float = 0.5, cap: float = 300.0, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter after ``attempts`` failed attempts (attempts >= 1)."""
    ceiling = min(cap, base * 2 ** min(attempts - 1, 30))
    return (rng or random).uniform(ceiling / 2, ceiling)
