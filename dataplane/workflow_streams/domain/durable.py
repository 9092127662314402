"""The Durable Streams protocol's rules, without I/O: offsets, names, content types, TTLs, Stream-Seq,
idempotent producers and CDN cursors.

Offsets are our sequences, zero-padded to a fixed width, so comparing two offsets as strings (as the
protocol lets clients do) orders them as their sequences: ``"00000000000000000009" <
"00000000000000000010"``. The offset of a position is the sequence of the last record before it, so
``offset`` is exactly our exclusive read cursor ``after``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from . import strictjson
from .errors import Forbidden, InvalidInput, PayloadTooLarge, StreamError
from .ids import check_id
from .media import media_type as media_type  # the one rule; store and api/durable ask rules.media_type
from .records import INLINE_LIMIT, RecordIn

OFFSET_WIDTH = 20  # 2**63 - 1 has 19 digits
STREAM_PATH_PREFIX = "/v1/stream/"  # where this surface's streams live, under its mount point
START = "-1"  # the protocol's sentinel for the beginning
NOW = "now"  # the protocol's sentinel for the current tail
# a JavaScript-safe integer bound, as the protocol requires for producer epochs and sequences
MAX_SAFE_INTEGER = 2**53 - 1
DEFAULT_CONTENT_TYPE = "application/octet-stream"
# the protocol's CDN cursor: 20-second intervals counted from 2024-10-09T00:00:00Z
CURSOR_EPOCH = dt.datetime(2024, 10, 9, tzinfo=dt.UTC)
CURSOR_INTERVAL_SECONDS = 20

_DIGITS = re.compile(r"[0-9]+")
_CANONICAL_INTEGER = re.compile(r"0|[1-9][0-9]*")


class DurableConflict(StreamError):
    """A protocol conflict (409): the request disagrees with the stream's state or configuration."""

    code = "conflict"


class ConfigConflict(DurableConflict):
    """PUT of an existing stream with another content type, lifetime or closed flag."""

    code = "stream_config_conflict"


class ContentTypeMismatch(DurableConflict):
    code = "content_type_mismatch"


class ProducerGap(DurableConflict):
    """A producer skipped a sequence number: nothing was appended."""

    code = "producer_seq_gap"


class StreamGone(StreamError):
    """A stream deleted while forks of it remain: it answers 410 to every request until the last fork
    goes, and its name stays taken (a PUT is a conflict)."""

    code = "stream_deleted"


class PlainAppendRefused(StreamError):
    """A plain append (``plain_append_fits``) that the group commit refused for one of the protocol's
    own reasons. Never answered as it is: the handler then loads the stream and answers as the protocol
    orders its errors (gone, expired, closed, another content type)."""

    code = "durable_append_refused"


def plain_append_fits(
    content_type: str,
    stream_content_type: str,
    deleted: bool,
    lifetime: Lifetime,
    accessed_at: dt.datetime,
    now: dt.datetime,
) -> bool:
    """Whether a plain append (no producer, Stream-Seq or close) of ``content_type`` may go to a stream,
    as the protocol sees it beyond our API's rules (rights, close, credit): not deleted, not expired, of
    the same media type."""
    return (
        not deleted
        and not lifetime.expired(accessed_at, now)
        and media_type(content_type) == media_type(stream_content_type)
    )


class NotVisible(Forbidden):
    """A PUT of a stream that exists but that this caller may not see: 403, as on our own API's create
    (elsewhere a stream a caller may not see is 404, as if it did not exist)."""

    def __init__(self) -> None:
        super().__init__("the stream does not exist, or this principal may not do this on it")


class NotDeletableHere(StreamError):
    """DELETE of one of our own API's streams: their definitions are removed through the operator."""

    code = "method_not_allowed"


class StaleProducerEpoch(StreamError):
    """A producer epoch older than the stream's (a fenced zombie): 403 with the current epoch."""

    code = "producer_epoch_stale"


def encode_offset(sequence: int) -> str:
    return str(sequence).zfill(OFFSET_WIDTH)


@dataclass(frozen=True)
class Offset:
    """A parsed ``offset`` parameter: ``after`` is the exclusive cursor, or None for the sentinels
    ``now`` (the tail) and ``-1`` (the start of what the stream still holds)."""

    after: int | None
    is_now: bool = False

    def resolve(self, earliest: int, latest: int) -> int:
        """The exclusive cursor: the start of the retained records for ``-1`` (a reader that asks for the
        beginning gets what is left, not 410), the last record for ``now``."""
        if self.is_now:
            return latest
        return earliest - 1 if self.after is None else self.after


# The reference server's offsets are two 16-digit numbers (``<read seq>_<byte offset>``), and clients,
# the conformance suite among them, name the start and "beyond any stream" in that shape. Accepted as a
# fork point, its first number read as our sequence; ours are what this server hands out.
_REFERENCE_OFFSET = re.compile(r"([0-9]{16})_([0-9]{16})")


def parse_sequence(text: str, field: str) -> int:
    """An offset this server returned (or the reference shape above) as its exclusive cursor."""
    reference = _REFERENCE_OFFSET.fullmatch(text)
    if reference is not None:
        return int(reference[1])
    if len(text) != OFFSET_WIDTH or not _DIGITS.fullmatch(text) or int(text) > 2**63 - 1:
        raise InvalidInput(f"{field} must be an offset this server returned, not {text!r}", field=field)
    return int(text)


def parse_offset(values: list[str]) -> Offset:
    """The ``offset`` query parameter (all its values: a repeated parameter is refused). Absent means
    the start. Only sentinels and offsets this server hands out are accepted."""
    if not values:
        return Offset(None)
    if len(values) > 1:
        raise InvalidInput("offset must be given at most once", field="offset")
    text = values[0]
    if text == START:
        return Offset(None)
    if text == NOW:
        return Offset(None, is_now=True)
    if len(text) != OFFSET_WIDTH or not _DIGITS.fullmatch(text) or int(text) > 2**63 - 1:
        raise InvalidInput(f"offset must be -1, now, or an offset this server returned, not {text!r}", field="offset")
    return Offset(int(text))


@dataclass(frozen=True)
class Fork:
    """A PUT's fork headers: the source's name, the offset to copy through (None: its tail) and how far
    into the next record (bytes of a byte stream, messages of a JSON stream)."""

    source: str
    offset: int | None
    sub_offset: int


_SUB_OFFSET = re.compile(r"0|[1-9][0-9]{0,15}")


def parse_fork(forked_from: str | None, offset: str | None, sub_offset: str | None, prefix: str) -> Fork | None:
    """``Stream-Forked-From`` (the source's path: ``[<prefix>]/v1/stream/<name>``), ``Stream-Fork-Offset``
    and ``Stream-Fork-Sub-Offset``; None without a fork."""
    if forked_from is None:
        if offset is not None or sub_offset is not None:
            raise InvalidInput(
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From", field="Stream-Forked-From"
            )
        return None
    path = forked_from.strip()
    if prefix and path.startswith(prefix + "/"):
        path = path[len(prefix) :]
    if not path.startswith(STREAM_PATH_PREFIX) or len(path) == len(STREAM_PATH_PREFIX):
        raise InvalidInput(
            f"Stream-Forked-From must be a stream's path, {STREAM_PATH_PREFIX}<name>", field="Stream-Forked-From"
        )
    sub = 0
    if sub_offset is not None:
        if not _SUB_OFFSET.fullmatch(sub_offset):
            raise InvalidInput("Stream-Fork-Sub-Offset must be a non-negative integer", field="Stream-Fork-Sub-Offset")
        sub = int(sub_offset)
        if sub > 0 and offset is None:
            raise InvalidInput(
                "Stream-Fork-Sub-Offset needs Stream-Fork-Offset to count from", field="Stream-Fork-Sub-Offset"
            )
    at = parse_sequence(offset, "Stream-Fork-Offset") if offset is not None else None
    return Fork(path[len(STREAM_PATH_PREFIX) :], at, sub)


def stream_key(name: str, default_run_id: str) -> tuple[str, str]:
    """A stream name in the URL maps to our (run_id, stream_id): ``<run_id>/<stream_id>`` addresses
    any stream of ours, and a single segment ``<stream_id>`` belongs to ``default_run_id``."""
    parts = name.split("/")
    if len(parts) == 1:
        return default_run_id, check_id("stream name", parts[0])
    if len(parts) == 2:
        return check_id("run_id", parts[0]), check_id("stream_id", parts[1])
    raise InvalidInput("a stream name is <stream> or <run_id>/<stream>", field="name")


# --- content types -------------------------------------------------------------------------------


def is_json_mode(content_type: str) -> bool:
    return media_type(content_type) == "application/json"


def sse_base64(content_type: str) -> bool:
    """Text and JSON streams travel as SSE text; every other stream is base64 in its data events."""
    base = media_type(content_type)
    return not (base.startswith("text/") or base == "application/json")


def check_content_type(text: str) -> str:
    if not text.isascii() or not text.isprintable() or len(text) > 255 or "/" not in media_type(text):
        raise InvalidInput("Content-Type must be a media type such as text/plain", field="Content-Type")
    return text


# --- bodies --------------------------------------------------------------------------------------


def json_messages(body: bytes, allow_empty: bool) -> list[bytes]:
    """JSON mode: a body holding an array is that many messages (one level flattened), any other value
    one message. Each message is stored compact, so concatenating them inside ``[...]`` is the read body.
    An empty array is refused on append (nothing to do, most likely a bug) and allowed on create."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("the body is not UTF-8", field="/") from None
    # strict JSON, as on our own API: NaN, 1e400 or a lone surrogate stored would make every later read
    # of the stream invalid JSON
    value = strictjson.loads(text)
    values = value if isinstance(value, list) else [value]
    if not values and not allow_empty:
        raise InvalidInput("an empty JSON array appends nothing", field="/")
    messages = [json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode() for v in values]
    for message in messages:
        if len(message) > INLINE_LIMIT:
            raise PayloadTooLarge(
                f"a JSON message is {len(message)} bytes; the limit is {INLINE_LIMIT}",
                limit=INLINE_LIMIT,
                size=len(message),
            )
    return messages


def records(content_type: str, body: bytes, allow_empty: bool) -> list[RecordIn]:
    """A body as the records of a stream of ``content_type``: JSON messages, or byte chunks."""
    parts = json_messages(body, allow_empty) if is_json_mode(content_type) else byte_chunks(body)
    return [RecordIn(content_type=content_type, payload=part) for part in parts]


def byte_chunks(body: bytes, limit: int = INLINE_LIMIT) -> list[bytes]:
    """A byte stream's append as records of at most ``limit`` bytes each: reads concatenate them again,
    so the split is invisible except that it adds offsets inside the append."""
    return [body[i : i + limit] for i in range(0, len(body), limit)]


# --- TTL and expiry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lifetime:
    """``ttl_seconds`` slides: every read or write renews it (HEAD does not). ``expires_at`` is fixed."""

    ttl_seconds: int | None = None
    expires_at: dt.datetime | None = None

    def expired(self, accessed_at: dt.datetime, now: dt.datetime) -> bool:
        if self.expires_at is not None and now >= self.expires_at:
            return True
        return self.ttl_seconds is not None and now >= accessed_at + dt.timedelta(seconds=self.ttl_seconds)

    def remaining_ttl(self, accessed_at: dt.datetime, now: dt.datetime) -> int | None:
        if self.ttl_seconds is None:
            return None
        left = (accessed_at + dt.timedelta(seconds=self.ttl_seconds) - now).total_seconds()
        return max(0, math.ceil(left))


def parse_lifetime(ttl: str | None, expires_at: str | None) -> Lifetime:
    if ttl is not None and expires_at is not None:
        raise InvalidInput("give Stream-TTL or Stream-Expires-At, not both", field="Stream-TTL")
    if ttl is not None:
        # the protocol allows plain decimal digits only: no sign, leading zero, fraction or exponent
        if not _CANONICAL_INTEGER.fullmatch(ttl) or len(ttl) > 12:
            raise InvalidInput("Stream-TTL must be a non-negative integer of seconds", field="Stream-TTL")
        return Lifetime(ttl_seconds=int(ttl))
    if expires_at is not None:
        return Lifetime(expires_at=parse_rfc3339(expires_at))
    return Lifetime()


def parse_rfc3339(text: str) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise InvalidInput("Stream-Expires-At must be an RFC 3339 timestamp", field="Stream-Expires-At") from None
    if parsed.tzinfo is None or "T" not in text.upper():
        raise InvalidInput("Stream-Expires-At needs a date, a time and an offset", field="Stream-Expires-At")
    return parsed.astimezone(dt.UTC)


def format_rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- Stream-Seq ----------------------------------------------------------------------------------


class SeqConflict(DurableConflict):
    code = "stream_seq_conflict"


def check_stream_seq(received: str | None, last: str | None) -> None:
    """``Stream-Seq`` values must strictly increase, compared byte-wise: ``"2"`` then ``"10"`` is a
    regression. Python compares str by code point, which is the order of their UTF-8 bytes."""
    if received is not None and last is not None and received <= last:
        raise SeqConflict(f"Stream-Seq {received!r} is not after the last one, {last!r}", last=last)


# --- idempotent producers ------------------------------------------------------------------------


@dataclass(frozen=True)
class Producer:
    id: str
    epoch: int
    seq: int


@dataclass(frozen=True)
class ProducerState:
    epoch: int
    last_seq: int


def _producer_integer(name: str, text: str) -> int:
    if not _CANONICAL_INTEGER.fullmatch(text) or int(text) > MAX_SAFE_INTEGER:
        raise InvalidInput(f"{name} must be a non-negative integer up to 2^53-1", field=name)
    return int(text)


def parse_producer(headers: Mapping[str, str]) -> Producer | None:
    """``Producer-Id``, ``Producer-Epoch`` and ``Producer-Seq``: all three or none."""
    given = [headers.get(h) for h in ("Producer-Id", "Producer-Epoch", "Producer-Seq")]
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        raise InvalidInput("Producer-Id, Producer-Epoch and Producer-Seq go together", field="Producer-Id")
    producer_id, epoch, seq = given
    assert producer_id is not None and epoch is not None and seq is not None
    if not producer_id or len(producer_id) > 255 or not producer_id.isprintable():
        raise InvalidInput("Producer-Id must be 1-255 printable characters", field="Producer-Id")
    return Producer(producer_id, _producer_integer("Producer-Epoch", epoch), _producer_integer("Producer-Seq", seq))


class Verdict(Enum):
    ACCEPT = "accept"
    DUPLICATE = "duplicate"  # already applied: 204, nothing written
    STALE_EPOCH = "stale_epoch"  # a fenced zombie: 403 with the current epoch
    BAD_EPOCH_START = "bad_epoch_start"  # a new epoch must start at seq 0: 400
    GAP = "gap"  # a sequence was skipped: 409 with the expected one


@dataclass(frozen=True)
class ProducerDecision:
    verdict: Verdict
    state: ProducerState | None  # the state to store when accepted; the current one otherwise
    expected_seq: int | None = None


def decide_producer(state: ProducerState | None, producer: Producer) -> ProducerDecision:
    """Kafka-style idempotent producer rules (PROTOCOL.md 5.2.1), decided under the stream's row lock."""
    if state is None:
        if producer.seq != 0:
            return ProducerDecision(Verdict.GAP, None, expected_seq=0)
        return ProducerDecision(Verdict.ACCEPT, ProducerState(producer.epoch, 0))
    if producer.epoch < state.epoch:
        return ProducerDecision(Verdict.STALE_EPOCH, state)
    if producer.epoch > state.epoch:
        if producer.seq != 0:
            return ProducerDecision(Verdict.BAD_EPOCH_START, state)
        return ProducerDecision(Verdict.ACCEPT, ProducerState(producer.epoch, 0))
    if producer.seq <= state.last_seq:
        return ProducerDecision(Verdict.DUPLICATE, state)
    if producer.seq == state.last_seq + 1:
        return ProducerDecision(Verdict.ACCEPT, ProducerState(producer.epoch, producer.seq))
    return ProducerDecision(Verdict.GAP, state, expected_seq=state.last_seq + 1)


# --- CDN cursor and caching ----------------------------------------------------------------------


def stream_cursor(now: dt.datetime, client_cursor: str | None, rng: random.Random | None = None) -> str:
    """The current 20-second interval; never at or below the cursor the client echoed (a cache loop
    otherwise), so a client at or past the current interval gets its cursor plus 1-3600 s of jitter."""
    interval = int((now - CURSOR_EPOCH).total_seconds() // CURSOR_INTERVAL_SECONDS)
    if client_cursor is not None and _DIGITS.fullmatch(client_cursor) and len(client_cursor) < 18:
        echoed = int(client_cursor)
        if echoed >= interval:
            jitter_seconds = (rng or random).randint(1, 3600)
            return str(echoed + max(1, jitter_seconds // CURSOR_INTERVAL_SECONDS))
    return str(interval)


def etag(incarnation: str, start: int, end: int, closed: bool) -> str:
    """``{stream}:{start}:{end}`` (PROTOCOL.md 8.1), with the stream's incarnation so a re-created
    stream never matches, and the closed flag, whose header the cached response would otherwise miss."""
    return f'"{incarnation}:{encode_offset(start)}:{encode_offset(end)}{":c" if closed else ""}"'


def if_none_match(header: str | None, tag: str) -> bool:
    if header is None:
        return False
    candidates = [c.strip() for c in header.split(",")]
    return "*" in candidates or tag in candidates or f"W/{tag}" in candidates
