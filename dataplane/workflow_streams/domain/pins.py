"""A stream definition's pins: what a stream is and where its data may live, fixed at creation."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from .errors import ForbiddenContentClass, InvalidDefinition

# Raw hidden model reasoning must never be stored, whatever a caller asks for.
FORBIDDEN_CONTENT_CLASSES = frozenset({"raw_model_reasoning"})
CONTENT_CLASSES = (
    "user_input",
    "model_output",
    "reasoning_summary",
    "tool_call",
    "tool_result",
    "progress",
    "artifact",
    "telemetry",
)

Region = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
# "*" (any authenticated principal), a user name, or "group:<name>"
Subject = Annotated[str, StringConstraints(pattern=r"^(\*|(group:)?[A-Za-z0-9][A-Za-z0-9:._@-]{0,252})$")]
JsonPointer = Annotated[str, StringConstraints(pattern=r"^(/[^/\x00-\x1f\x7f]+)+$", max_length=512)]
# free text that Postgres stores: no NUL or other control characters
Text = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]+$", min_length=1, max_length=512)]


class _Pinned(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _unique(values: list[str], what: str) -> None:
    if len(set(values)) != len(values):
        raise ValueError(f"{what} lists a value twice")


class Placement(_Pinned):
    metadata_home: Region
    metadata_replicas: list[Region] = Field(default_factory=list, max_length=8)
    object_regions: list[Region] = Field(min_length=1, max_length=8)
    client_egress_regions: list[Region] = Field(min_length=1, max_length=16)
    log_region: Region

    @model_validator(mode="after")
    def _distinct(self) -> Placement:
        _unique(self.metadata_replicas, "metadata_replicas")
        _unique(self.object_regions, "object_regions")
        _unique(self.client_egress_regions, "client_egress_regions")
        if self.metadata_home in self.metadata_replicas:
            raise ValueError("metadata_replicas must not repeat metadata_home")
        return self


class Retention(_Pinned):
    max_age_seconds: int | None = Field(default=None, ge=1)
    max_records: int | None = Field(default=None, ge=1)


class Redaction(_Pinned):
    # drop_payload: payload never leaves the log region; mask_fields: only the listed fields are masked
    strategy: Literal["drop_payload", "mask_fields"] = "drop_payload"
    fields: list[JsonPointer] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _fields_when_masking(self) -> Redaction:
        if self.strategy == "mask_fields" and not self.fields:
            raise ValueError("strategy mask_fields needs at least one field")
        return self


class Authorization(_Pinned):
    append: list[Subject] = Field(default_factory=list, max_length=64)
    read: list[Subject] = Field(default_factory=list, max_length=64)
    # live subscriptions; unset means the same subjects as read
    subscribe: list[Subject] | None = Field(default=None, max_length=64)
    ack: list[Subject] = Field(default_factory=list, max_length=64)
    close: list[Subject] = Field(default_factory=list, max_length=64)
    legal_hold: list[Subject] = Field(default_factory=list, max_length=64)


class Credit(_Pinned):
    max_unread_items: int = Field(ge=1)
    max_unread_bytes: int = Field(ge=1)
    max_total_items: int | None = Field(default=None, ge=1)
    max_total_bytes: int | None = Field(default=None, ge=1)
    policy: Literal["block", "reject"] = "reject"
    block_timeout_ms: int = Field(default=5000, ge=0, le=60_000)


class StreamPins(_Pinned):
    direction: Literal["input", "output"]
    content_class: Literal[CONTENT_CLASSES]  # type: ignore[valid-type]
    schema_ref: Text
    placement: Placement
    retention: Retention = Field(default_factory=Retention)
    redaction: Redaction = Field(default_factory=Redaction)
    authorization: Authorization
    credit: Credit

    def canonical(self) -> dict[str, Any]:
        """The normalized pins, defaults filled in: what is stored and compared."""
        return self.model_dump(mode="json")

    def digest(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def parse_pins(raw: object) -> StreamPins:
    """Validate a caller's pins. Raises ForbiddenContentClass or InvalidDefinition (with field errors)."""
    content_class = raw.get("content_class") if isinstance(raw, dict) else None
    if isinstance(content_class, str) and content_class in FORBIDDEN_CONTENT_CLASSES:
        raise ForbiddenContentClass(
            f"content class {content_class!r} is not allowed: raw hidden model reasoning is never "
            "stored; use 'reasoning_summary' for a user-visible summary",
            allowed=list(CONTENT_CLASSES),
        )
    try:
        return StreamPins.model_validate(raw)
    except ValidationError as exc:
        raise InvalidDefinition("the stream definition is invalid", errors=field_errors(exc)) from None


def field_errors(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic errors as a stable, JSON-ready list, without echoing the caller's input back."""
    return [{"field": "/".join(str(part) for part in err["loc"]), "message": err["msg"]} for err in exc.errors()]
