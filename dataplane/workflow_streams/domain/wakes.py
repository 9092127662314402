"""Wake signals: what one process tells the others after a commit, and how it is put on the wire.

A signal is only a hint that a stream may have news; whoever is woken re-reads Postgres. Many signals
travel in one NOTIFY payload (one line each) so that a busy process pays Postgres' cluster-wide notify
lock once per batch of commits, not once per commit. A line is ``KIND run/stream/first/last[/timeline]``:
the timeline an append's commit returned on (``runtime.durability``) is optional, so that lines without it
(a wake that vouches for nothing) still decode.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")

# One channel carries every kind; the kind is the first character of a line.
CHANNEL = "wfs_wakes"

RECORDS = "R"  # records were appended (or the stream closed or went away)
ACKS = "A"  # a consumer acknowledged: blocked producers may have credit
INPUTS = "I"  # records were appended to an input stream: the dispatcher has work
KINDS = frozenset((RECORDS, ACKS, INPUTS))

# Postgres refuses payloads of 8000 bytes or more
MAX_PAYLOAD_BYTES = 7900
_VERSION = "wfs1"


class Signal(NamedTuple):
    """Immutable and cheap to make: every commit publishes some and every process decodes the others'
    (a frozen dataclass sets each field through ``object.__setattr__``)."""

    kind: str
    run_id: str
    stream_id: str
    # the sequences the commit announced (0: unknown or not about records: re-read everything)
    first: int = 0
    last: int = 0
    # the WAL timeline the commit returned on, when the signal vouches for the durability of what it
    # announces (an append's); "" for a wake that vouches for nothing (runtime.durability)
    timeline: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.run_id, self.stream_id)

    def merge(self, other: Signal) -> Signal:
        """Two signals for one stream become one covering both (0 stays 'unknown')."""
        first = 0 if 0 in (self.first, other.first) else min(self.first, other.first)
        last, timeline = max((self.last, self.timeline), (other.last, other.timeline))
        return Signal(self.kind, self.run_id, self.stream_id, first, last, timeline)


def records_changed(run_id: str, stream_id: str, last: int = 0) -> Signal:
    """A stream's records or state changed without a known range (it closed, or went away): whoever
    follows it re-reads and sees why."""
    return Signal(RECORDS, run_id, stream_id, 0, last)


def acked(run_id: str, stream_id: str, sequence: int) -> Signal:
    """A consumer's ack advanced: producers blocked on the unread ceiling may have credit."""
    return Signal(ACKS, run_id, stream_id, sequence, sequence)


@dataclass(frozen=True)
class Changed(Generic[T]):
    """What a store entry point returns when it changed what others watch: its answer, and the wake
    signals to publish once its transaction has committed (``runtime.publish``: never before, so a wake
    never precedes what it announces)."""

    value: T
    signals: tuple[Signal, ...] = ()


def encode(signals: Iterable[Signal], sender: str) -> list[str]:
    """Payloads of at most MAX_PAYLOAD_BYTES, each starting with a header naming the sender.
    Identifiers never contain spaces, '/' or newlines (domain.ids), so lines split unambiguously."""
    header = f"{_VERSION} {sender}"
    payloads: list[str] = []
    lines = [header]
    size = len(header)
    for s in signals:
        line = f"{s.kind} {s.run_id}/{s.stream_id}/{s.first}/{s.last}"
        if s.timeline:
            line += f"/{s.timeline}"
        if size + 1 + len(line) > MAX_PAYLOAD_BYTES and len(lines) > 1:
            payloads.append("\n".join(lines))
            lines, size = [header], len(header)
        lines.append(line)
        size += 1 + len(line)
    if len(lines) > 1:
        payloads.append("\n".join(lines))
    return payloads


class MalformedPayload(ValueError):
    pass


def decode(payload: str, *, unless_from: str | None = None) -> tuple[str, list[Signal]]:
    """The sender and the signals of one payload; MalformedPayload if it is not ours. A payload from
    ``unless_from`` gives no signals: every listening process hears its own notifications too, and with
    N workers decoding them was 1/N of all the decoding, for signals delivered at publish already."""
    header, _, body = payload.partition("\n")
    version, _, sender = header.partition(" ")
    if version != _VERSION or not sender:
        raise MalformedPayload(f"not a wake payload: {payload[:60]!r}")
    if sender == unless_from:
        return sender, []
    return sender, list(_signals(body))


def _signals(body: str) -> Iterator[Signal]:
    for line in body.split("\n"):
        kind, _, rest = line.partition(" ")
        parts = rest.split("/")
        if kind not in KINDS or len(parts) not in (4, 5):
            raise MalformedPayload(f"malformed wake line {line[:60]!r}")
        try:
            yield Signal(kind, parts[0], parts[1], int(parts[2]), int(parts[3]), parts[4] if len(parts) == 5 else "")
        except ValueError:
            raise MalformedPayload(f"malformed wake line {line[:60]!r}") from None
