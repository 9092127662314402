"""The cursor rule: a read after cursor N returns sequences > N, ascending, or says why it cannot."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CursorExpired, FutureCursor, InvalidInput

MAX_SEQUENCE = 2**63 - 1


@dataclass(frozen=True)
class Bounds:
    """What a stream holds now: sequences earliest..latest (earliest == latest + 1 when none are retained)."""

    earliest: int
    latest: int

    def as_durable_as(self, known: int, start: int) -> Bounds:
        """These bounds as a read held back to what is durable may state them: the head at most ``known``,
        never below ``start``, where the served records end (runtime.durability)."""
        return Bounds(earliest=self.earliest, latest=max(min(self.latest, known), start))


def parse_cursor(text: str | None, name: str = "after") -> int:
    """A cursor from a query parameter or Last-Event-ID: a non-negative decimal integer; absent means 0."""
    if text is None or text == "":
        return 0
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) > MAX_SEQUENCE:
        raise InvalidInput(f"{name} must be a non-negative integer sequence", field=name)
    return int(text)


def check_cursor(after: int, bounds: Bounds) -> None:
    """Raise unless reading after ``after`` is well-defined for ``bounds``.

    A cursor past the latest sequence is the caller's mistake, never a reset; a cursor whose next
    record was removed by retention gets the bounds so the caller can resync.
    """
    if after > bounds.latest:
        raise FutureCursor(
            f"cursor {after} is past the latest sequence {bounds.latest}",
            requested=after,
            latest=bounds.latest,
        )
    if after + 1 < bounds.earliest:
        raise CursorExpired(
            f"sequence {after + 1} was removed by retention; resync from sequence {bounds.earliest}",
            requested=after + 1,
            earliest=bounds.earliest,
            latest=bounds.latest,
            reason="retention_pruned",
        )
