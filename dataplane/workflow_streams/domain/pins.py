"""A stream definition's pins: what a stream is and where its data may live, fixed at creation.

Pins are stored with the version of their stored form (``pins_version``) and always read through
``StreamPins.read_stored``, which upgrades old documents and fills in defaults, so two pins are
compared by what they mean under today's model, never by how an older release spelled them.

Every field carries a description: the OpenAPI document and the WorkflowStream CRD
(``python -m workflow_streams_operator.crdgen``) are generated from this model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from .errors import ForbiddenContentClass, InvalidDefinition

# Raw hidden model reasoning must never be stored, whatever a caller asks for.
FORBIDDEN_CONTENT_CLASSES = frozenset({"raw_model_reasoning"})
FORBIDDEN_CONTENT_CLASS_MESSAGE = "raw hidden model reasoning is not an allowed content class"
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
# the key of a stored pins document that holds its version; absent in documents stored before it existed
VERSION_KEY = "pins_version"

Region = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
# "*" (any authenticated principal), a user name, or "group:<name>"
Subject = Annotated[str, StringConstraints(pattern=r"^(\*|(group:)?[A-Za-z0-9][A-Za-z0-9:._@-]{0,252})$")]
JsonPointer = Annotated[str, StringConstraints(pattern=r"^(/[^/\x00-\x1f\x7f]+)+$", max_length=512)]
# free text that Postgres stores: no NUL or other control characters
Text = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]+$", min_length=1, max_length=512)]

_SUBJECTS = (
    "Each entry is a principal name (e.g. system:serviceaccount:<namespace>:<name>), group:<name>, "
    "or * for any authenticated caller."
)


class _Pinned(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _unique(values: list[str], what: str) -> None:
    if len(set(values)) != len(values):
        raise ValueError(f"{what} lists a value twice")


class Placement(_Pinned):
    """Where the stream's metadata, objects and logs may live, and from where it may be read."""

    metadata_home: Region = Field(
        description="The region whose Postgres holds the stream's metadata and records. A data plane whose "
        "Postgres is in another region refuses the definition."
    )
    metadata_replicas: list[Region] = Field(
        default_factory=list,
        max_length=8,
        description="Regions that may hold replicas of the metadata, not repeating the metadata home. Default: none.",
    )
    object_regions: list[Region] = Field(
        min_length=1,
        max_length=8,
        description="Regions whose buckets may store the stream's large objects.",
    )
    client_egress_regions: list[Region] = Field(
        min_length=1,
        max_length=16,
        description="Regions from which clients may read or subscribe; other callers get 403 "
        "placement_violation, and bucket policies deny object reads from elsewhere.",
    )
    log_region: Region = Field(
        description="The only region whose processes may log payloads; elsewhere the redaction pins apply."
    )

    @model_validator(mode="after")
    def _distinct(self) -> Placement:
        _unique(self.metadata_replicas, "metadata_replicas")
        _unique(self.object_regions, "object_regions")
        _unique(self.client_egress_regions, "client_egress_regions")
        if self.metadata_home in self.metadata_replicas:
            raise ValueError("metadata_replicas must not repeat metadata_home")
        return self


class Retention(_Pinned):
    """How long records are kept; the pruner removes older records unless a legal hold exists.
    Both limits unset keeps records until the stream is deleted."""

    # Upper bounds are what every reader of a definition can hold: the age becomes an interval added to
    # now() (10**12 s is ~31,700 years; 10**18, found by schemathesis, overflowed and answered 500); the
    # count is a bigint in Postgres, but the CRD's schema is read as doubles by the kube-apiserver, which
    # refuses 2**63 - 1 as a bound, so 2**53 - 1 (the largest integer a double holds exactly).
    max_age_seconds: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="Records older than this many seconds are pruned. Unset: no age limit.",
    )
    max_records: int | None = Field(
        default=None,
        ge=1,
        le=2**53 - 1,
        description="Only the newest this many records are kept. Unset: no count limit.",
    )


class Redaction(_Pinned):
    """How payloads are redacted in log lines written outside the log region."""

    strategy: Literal["drop_payload", "mask_fields"] = Field(
        default="drop_payload",
        description="drop_payload: the payload never leaves the log region; mask_fields: only the listed "
        "fields are masked. Default: drop_payload.",
    )
    fields: list[JsonPointer] = Field(
        default_factory=list,
        max_length=64,
        description="JSON Pointers (e.g. /user/email) of the fields to mask; required with mask_fields.",
    )

    @model_validator(mode="after")
    def _fields_when_masking(self) -> Redaction:
        if self.strategy == "mask_fields" and not self.fields:
            raise ValueError("strategy mask_fields needs at least one field")
        return self


class Authorization(_Pinned):
    """Who may do what on the stream: subjects per action. An empty list allows nobody."""

    append: list[Subject] = Field(default_factory=list, max_length=64, description=f"May append. {_SUBJECTS}")
    read: list[Subject] = Field(default_factory=list, max_length=64, description=f"May read. {_SUBJECTS}")
    # live subscriptions; unset means the same subjects as read
    subscribe: list[Subject] | None = Field(
        default=None,
        max_length=64,
        description=f"May subscribe (Server-Sent Events). Unset: the read subjects. {_SUBJECTS}",
    )
    ack: list[Subject] = Field(
        default_factory=list, max_length=64, description=f"May acknowledge as a consumer. {_SUBJECTS}"
    )
    close: list[Subject] = Field(default_factory=list, max_length=64, description=f"May close the stream. {_SUBJECTS}")
    legal_hold: list[Subject] = Field(
        default_factory=list, max_length=64, description=f"May place and release legal holds over HTTP. {_SUBJECTS}"
    )
    # deleting ends the stream for everyone, as closing does; unset means the same subjects as close
    delete: list[Subject] | None = Field(
        default=None,
        max_length=64,
        description=f"May delete the stream over HTTP (refused while a legal hold exists). Unset: the close "
        f"subjects. {_SUBJECTS}",
    )


class Credit(_Pinned):
    """Producer credit: how much may be appended and not yet acknowledged by the slowest consumer."""

    max_unread_items: int = Field(ge=1, description="Ceiling on unread records.")
    max_unread_bytes: int = Field(ge=1, description="Ceiling on unread payload bytes.")
    max_total_items: int | None = Field(
        default=None,
        ge=1,
        description="Lifetime ceiling on appended records; past it appends are 409 quota_exhausted. Unset: none.",
    )
    max_total_bytes: int | None = Field(
        default=None, ge=1, description="Lifetime ceiling on appended payload bytes. Unset: none."
    )
    policy: Literal["block", "reject"] = Field(
        default="reject",
        description="At an unread ceiling, block: wait for an acknowledgement up to the block timeout, then 429; "
        "reject: 429 backpressure at once. Default: reject.",
    )
    block_timeout_ms: int = Field(
        default=5000, ge=0, le=60_000, description="How long a blocked append waits, in milliseconds. Default: 5000."
    )


Upgrade = Callable[[dict[str, Any]], dict[str, Any]]
P = TypeVar("P", bound="StreamPins")


class NewerPinsVersion(ValueError):
    """Stored pins of a later, incompatible version (or none at all): this release cannot know what they mean."""


class StreamPins(_Pinned):
    """A stream's pins: what it carries and where its data may live. Immutable once created."""

    # The version of the stored form. Bump it only for a change that old documents cannot simply be
    # read as (a rename, a changed meaning), with a step in ``upgrades`` from the previous version.
    # A new pin with a default needs neither: documents without it read with the default, and
    # documents with pins this release does not know (a later release's additions) read without them.
    pins_version: ClassVar[int] = 1
    # version N -> a function from a stored document of version N to one of version N + 1
    pins_upgrades: ClassVar[Mapping[int, Upgrade]] = {}

    direction: Literal["input", "output"] = Field(
        description="input: data into a waiting run (each record is delivered to the wait service); "
        "output: data out of a run."
    )
    content_class: Literal[CONTENT_CLASSES] = Field(  # type: ignore[valid-type]
        description="What the stream carries: " + ", ".join(CONTENT_CLASSES) + ". Raw hidden model reasoning "
        "(raw_model_reasoning) is never allowed; use reasoning_summary for a user-visible summary."
    )
    schema_ref: Text = Field(description="The schema the payloads follow, e.g. example.com/schemas/output/v1.")
    placement: Placement
    retention: Retention = Field(default_factory=Retention)
    redaction: Redaction = Field(default_factory=Redaction)
    authorization: Authorization
    credit: Credit

    def canonical(self) -> dict[str, Any]:
        """The normalized pins, defaults filled in: what callers see."""
        return self.model_dump(mode="json")

    def stored(self) -> dict[str, Any]:
        """The document stored in Postgres: the canonical pins and the version of their form."""
        return {VERSION_KEY: self.pins_version, **self.canonical()}

    def digest(self) -> str:
        """SHA-256 of the stored form. For two pins of one model it is equal exactly when their meaning is;
        for a stored row it is the content address of its document (``pins_digest``)."""
        return document_digest(self.stored())

    @classmethod
    def read_stored(cls: type[P], document: Mapping[str, Any] | str) -> P:
        """Pins as stored by this or an earlier release: upgraded to this version, defaults filled in,
        pins unknown to this model ignored. Raises NewerPinsVersion for a later, incompatible version."""
        data = dict(json.loads(document) if isinstance(document, str) else document)
        version = data.pop(VERSION_KEY, 1)
        if type(version) is not int or not 1 <= version <= cls.pins_version:
            raise NewerPinsVersion(
                f"stored pins have version {version!r}; this release reads versions 1 to {cls.pins_version}"
            )
        for step in range(version, cls.pins_version):
            data = cls.pins_upgrades[step](data)
        return cls.model_validate(_known(cls, data))


def document_digest(document: Mapping[str, Any]) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _known(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the keys ``model`` (and its nested models) does not have."""
    if isinstance(data, list):
        return [_known(model, item) for item in data]
    if not isinstance(data, dict):
        return data
    known = {}
    for name, field in model.model_fields.items():
        if name in data:
            nested = nested_model(field.annotation)
            value = data[name]
            known[name] = _known(nested, value) if nested is not None else value
    return known


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pins model inside a field's type (``Placement``, ``list[X]``, ``X | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = nested_model(arg)
        if found is not None:
            return found
    return None


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
