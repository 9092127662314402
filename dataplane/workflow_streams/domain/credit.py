"""Producer credit: may a batch be appended, given what is durable and unread?

Pure arithmetic over numbers the store reads under the stream row lock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import ObjectExceedsCredit, QuotaExhausted
from .pins import Credit


@dataclass(frozen=True)
class Usage:
    """A stream's durable counters, read under its row lock."""

    last_sequence: int
    appended_bytes: int
    # the sequence through which every consumer has acknowledged (or pruning removed)
    base_sequence: int
    # cumulative bytes through base_sequence
    base_bytes: int

    @classmethod
    def of(
        cls,
        last_sequence: int,
        appended_bytes: int,
        min_ack: int | None,
        earliest_sequence: int,
        pruned_bytes: int,
        ack_bytes: int | None,
    ) -> Usage:
        """From a stream row's counters, its slowest ack (None: no consumer) and the cumulative bytes
        through that ack's record (``ack_bytes``, read when the record is retained)."""
        base = base_sequence(min_ack, earliest_sequence)
        base_bytes = pruned_bytes if base == earliest_sequence - 1 else ack_bytes
        return cls(last_sequence, appended_bytes, base, base_bytes if base_bytes is not None else pruned_bytes)

    @property
    def unread_items(self) -> int:
        return self.last_sequence - self.base_sequence

    @property
    def unread_bytes(self) -> int:
        return self.appended_bytes - self.base_bytes


class Verdict(enum.Enum):
    ALLOW = "allow"
    UNREAD_FULL = "unread_full"  # wait for acks (block) or reject, as the pins say
    QUOTA_EXHAUSTED = "quota_exhausted"  # total ceiling: never appendable
    BATCH_TOO_LARGE = "batch_too_large"  # could not fit even with nothing unread


def decide(credit: Credit, usage: Usage, items: int, size: int) -> Verdict:
    if credit.max_total_items is not None and usage.last_sequence + items > credit.max_total_items:
        return Verdict.QUOTA_EXHAUSTED
    if credit.max_total_bytes is not None and usage.appended_bytes + size > credit.max_total_bytes:
        return Verdict.QUOTA_EXHAUSTED
    if items > credit.max_unread_items or size > credit.max_unread_bytes:
        return Verdict.BATCH_TOO_LARGE
    if usage.unread_items + items > credit.max_unread_items or usage.unread_bytes + size > credit.max_unread_bytes:
        return Verdict.UNREAD_FULL
    return Verdict.ALLOW


def base_sequence(min_ack: int | None, earliest_sequence: int) -> int:
    """Unread starts after the slowest consumer's ack; pruned records are no longer unread.

    With no consumer registered, every retained record counts as unread. Queries over many streams use
    its SQL writing, ``store.usage.base_sequence`` (tests/test_unread_rule.py holds the two together).
    """
    return max(min_ack or 0, earliest_sequence - 1)


def check_object(credit: Credit, size: int, appended_items: int, appended_bytes: int) -> None:
    """Whether an object of ``size`` bytes can ever be committed to a stream that has appended so much: what
    ``decide`` would refuse for good (over the unread ceiling alone, or past a lifetime total, which only
    grows) is refused before the upload; a full unread window is not, acks may free it by the commit."""
    if size > credit.max_unread_bytes:
        raise ObjectExceedsCredit(
            f"the object's {size} bytes exceed the stream's unread ceiling, credit.max_unread_bytes"
            f" ({credit.max_unread_bytes}): it could never be committed",
            field="size",
            size=size,
            limit=credit.max_unread_bytes,
            pin="credit.max_unread_bytes",
        )
    if credit.max_total_items is not None and appended_items + 1 > credit.max_total_items:
        raise QuotaExhausted(
            f"the stream has appended its lifetime total, credit.max_total_items ({credit.max_total_items})",
            limit=credit.max_total_items,
            pin="credit.max_total_items",
        )
    if credit.max_total_bytes is not None and appended_bytes + size > credit.max_total_bytes:
        raise QuotaExhausted(
            f"the object's {size} bytes would pass the stream's lifetime total, credit.max_total_bytes"
            f" ({credit.max_total_bytes}; {appended_bytes} appended)",
            limit=credit.max_total_bytes,
            pin="credit.max_total_bytes",
        )
