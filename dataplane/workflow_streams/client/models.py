"""Typed views of the server's JSON."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Record:
    sequence: int
    kind: str
    content_type: str
    size: int
    appended_at: str
    data: Any = None
    data_base64: str | None = None
    object: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Record:
        return cls(
            sequence=body["sequence"],
            kind=body["kind"],
            content_type=body["content_type"],
            size=body["size"],
            appended_at=body["appended_at"],
            data=body.get("data"),
            data_base64=body.get("data_base64"),
            object=body.get("object"),
        )

    def to_json(self) -> dict[str, Any]:
        """The record as the HTTP API shows it: exactly one of ``data``, ``data_base64``, ``object``."""
        body: dict[str, Any] = {
            "sequence": self.sequence,
            "kind": self.kind,
            "content_type": self.content_type,
            "size": self.size,
            "appended_at": self.appended_at,
        }
        if self.object is not None:
            body["object"] = self.object
        elif self.data_base64 is not None:
            body["data_base64"] = self.data_base64
        else:
            body["data"] = self.data
        return body

    @property
    def payload(self) -> bytes | None:
        """Inline bytes (JSON records re-encoded are not byte-identical; use ``data`` for those)."""
        return base64.b64decode(self.data_base64) if self.data_base64 is not None else None


@dataclass(frozen=True)
class AppendResult:
    first_sequence: int
    last_sequence: int
    replayed: bool = False

    @property
    def sequences(self) -> list[int]:
        return list(range(self.first_sequence, self.last_sequence + 1))


@dataclass(frozen=True)
class Page:
    records: list[Record]
    next_after: int
    earliest: int
    latest: int
    closed: bool


@dataclass(frozen=True)
class ObjectInfo:
    """What a download of an object record got: its content type, size and SHA-256 (hex), checked."""

    content_type: str
    size: int
    sha256: str
