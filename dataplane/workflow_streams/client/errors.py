"""Problems from the server as typed exceptions."""

from __future__ import annotations

from typing import Any


class ProblemError(Exception):
    """An ``application/problem+json`` answer: ``status``, stable ``code``, ``detail`` and the body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.code: str = body.get("code", f"http_{status}")
        self.detail: str = body.get("detail", "")
        self.body = body
        super().__init__(f"{status} {self.code}: {self.detail}")


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
