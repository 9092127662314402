"""Domain errors. Each carries a stable machine-readable ``code``; the HTTP layer maps codes to statuses."""

from __future__ import annotations

from typing import Any


class StreamError(Exception):
    """Base of every error a caller can act on."""

    code: str = "stream_error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def explained(self) -> str:
        """The detail with the field errors it carries (``errors``), which say what to fix."""
        problems = self.extra.get("errors") or []
        if not problems:
            return self.detail
        return self.detail + ": " + "; ".join(f"{e['field']}: {e['message']}" for e in problems)


class InvalidInput(StreamError):
    code = "invalid_input"


class InvalidJson(InvalidInput):
    """The body is not strict JSON (RFC 8259): ``rule`` says which rule it breaks."""

    code = "invalid_json"


class NotAnInputStream(StreamError):
    """Deliveries exist only for input streams."""

    code = "not_an_input_stream"


class InvalidDefinition(StreamError):
    code = "invalid_definition"


class ForbiddenContentClass(StreamError):
    code = "forbidden_content_class"


class NotFound(StreamError):
    code = "not_found"


class StreamNotFound(NotFound):
    """No such stream. Over HTTP this looks exactly like Forbidden, so callers learn nothing about
    streams they may not see."""


class PinsConflict(StreamError):
    code = "pins_conflict"
    existing: Any = None  # the definition that is already there


class Unauthenticated(StreamError):
    code = "unauthenticated"


class Forbidden(StreamError):
    code = "forbidden"


class FutureCursor(StreamError):
    code = "future_cursor"


class CursorExpired(StreamError):
    """Retention removed ``requested``: the reader must resync from ``earliest``."""

    code = "cursor_expired"


class PayloadTooLarge(StreamError):
    code = "payload_too_large"


class StreamClosed(StreamError):
    code = "stream_closed"


class IdempotencyKeyReused(StreamError):
    code = "idempotency_key_reused"


class Backpressure(StreamError):
    """Unread ceiling reached; ``retry_after`` seconds is a hint, credit returns when consumers ack."""

    code = "backpressure"

    def __init__(self, detail: str, retry_after: int, block_seconds: float = 0.0, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after = retry_after
        # how long the definition lets an appender wait for credit (0 under the reject policy)
        self.block_seconds = block_seconds


class QuotaExhausted(StreamError):
    code = "quota_exhausted"


class BatchExceedsCredit(StreamError):
    code = "batch_exceeds_credit"


class ObjectExceedsCredit(StreamError):
    """An object larger than the stream's unread-bytes ceiling: it could never be committed, so it is refused
    at prepare, before its bytes are sent."""

    code = "object_exceeds_credit"


class AckRegression(StreamError):
    code = "ack_regression"


class FutureAck(StreamError):
    code = "future_sequence"


class ConsumerScopeMismatch(StreamError):
    code = "consumer_scope_mismatch"


class ObjectMismatch(StreamError):
    """The uploaded bytes are not what was prepared (size or digest)."""

    code = "object_mismatch"


class ObjectEvidenceMismatch(StreamError):
    """What S3 reports for the object disagrees with the intent: nothing is made visible."""

    code = "object_evidence_mismatch"


class IntentState(StreamError):
    code = "intent_state"


class IntentExpired(StreamError):
    code = "intent_expired"


class NotAnObject(StreamError):
    """The record holds its payload inline: there are no object bytes to download."""

    code = "not_an_object"


class ObjectGone(StreamError):
    """The record was read, but its object is no longer in S3 (pruned and deleted since)."""

    code = "object_gone"


class RangeNotSatisfiable(StreamError):
    """A ``Range`` that starts past the object's end (``size`` says where it ends)."""

    code = "range_not_satisfiable"


class ObjectRegionUnavailable(StreamError):
    code = "object_region_unavailable"


class OwnedElsewhere(StreamError):
    """The stream (or its run) belongs to another owner: a WorkflowStream in another namespace, another
    object in this one, or the HTTP API. ``owner`` names who owns it."""

    code = "owned_elsewhere"


class StreamHeld(StreamError):
    """A legal hold stops deletion."""

    code = "stream_held"


class RequestTimeout(StreamError):
    """The body arrived too slowly (slowloris): nothing was done."""

    code = "request_timeout"


class TooManySubscriptions(StreamError):
    code = "too_many_subscriptions"


class PlacementViolation(StreamError):
    """The pins do not allow this here: a client outside the egress regions, metadata outside its home."""

    code = "placement_violation"


class AuthUnavailable(StreamError):
    """The identity provider (the Kubernetes API server) could not be asked."""

    code = "authentication_unavailable"
