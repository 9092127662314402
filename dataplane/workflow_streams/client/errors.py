"""Problems from the server as typed exceptions."""

from __future__ import annotations

from typing import Any


class ProblemError(Exception):
    """An ``application/problem+json`` answer: ``status``, stable ``code``, ``detail`` and the body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.code: str = body.get("code", f"http_{status}")
        self.detail: str = body.get("detail", "")
        # field errors, e.g. of invalid pins: [{"field": "credit/polcy", "message": "..."}]
        self.errors: list[dict[str, Any]] = body.get("errors") or []
        self.body = body
        super().__init__(describe(status, body))


# what every problem has; the rest of its members are what it adds (numbers, names of fields)
_STANDARD = frozenset({"type", "title", "status", "code", "detail", "errors", "instance"})


def describe(status: int, body: dict[str, Any]) -> str:
    """A problem in one line with what helps: ``422 invalid_definition: ...: credit/polcy: Extra inputs are
    not permitted (field=...)``; its field errors, then its other members (``limit=..., earliest=...``)."""
    code = body.get("code", f"http_{status}")
    text = f"{status} {code}: {body.get('detail', '')}"
    errors = body.get("errors") or []
    if isinstance(errors, list) and errors:
        text += ": " + "; ".join(
            f"{e.get('field', '?')}: {e.get('message', '')}" if isinstance(e, dict) else str(e) for e in errors
        )
    extra = {k: v for k, v in body.items() if k not in _STANDARD and isinstance(v, str | int | float | bool | list)}
    if extra:
        text += " (" + ", ".join(f"{k}={_value(v)}" for k, v in extra.items()) + ")"
    return text


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


class CursorExpiredError(ProblemError):
    """Retention removed ``requested``; resync from ``earliest`` (``latest`` is the newest sequence)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status, body)
        self.requested: int = body["requested"]
        self.earliest: int = body["earliest"]
        self.latest: int = body["latest"]


class BackpressureError(ProblemError):
    """Still backpressured after the client's retries; ``retry_after`` seconds was the last hint."""

    def __init__(self, status: int, body: dict[str, Any], retry_after: float) -> None:
        super().__init__(status, body)
        self.retry_after = retry_after


class StreamClosedError(ProblemError):
    pass


class ObjectDigestMismatch(ProblemError):
    """The bytes downloaded are not the object the server named (size or sha256): nothing is kept."""

    def __init__(self, detail: str) -> None:
        super().__init__(0, {"code": "object_digest_mismatch", "detail": detail})
        self.args = (f"{self.code}: {detail}",)

    def __str__(self) -> str:
        return str(self.args[0])


def problem_error(status: int, body: dict[str, Any], retry_after: float = 1.0) -> ProblemError:
    code = body.get("code")
    if code == "cursor_expired":
        return CursorExpiredError(status, body)
    if code == "backpressure":
        return BackpressureError(status, body, retry_after)
    if code == "stream_closed":
        return StreamClosedError(status, body)
    return ProblemError(status, body)
