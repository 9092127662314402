"""Pins templates: a first stream without writing pins, and a platform's named kinds of stream.

A template is a partial pins document. A stream made from one stores the whole resolved document
(``resolve``), immutable as any pins: the built-in base (this data plane's regions, every right for
the creator, bounded credit), then the template, then the caller's own pins over both. Objects merge
key by key; a list or a value replaces what it merges over.

``$creator`` in an authorization list stands for whoever creates the stream: the principal over HTTP,
``group:system:serviceaccounts:<namespace>`` (every service account of the namespace) for a
WorkflowStream. Templates are a platform's settings (``WFS_PINS_TEMPLATES``): ``{"name": {"pins": {...},
"description": "...", "namespaces": ["team-a"]}}``; ``namespaces`` limits which namespaces'
WorkflowStreams may use the template (unset: every namespace). The template named ``default`` is
used when a caller names none; without one, the base alone is the default.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import NotFound, StreamError
from .pins import StreamPins, parse_pins

CREATOR = "$creator"
DEFAULT = "default"
# the creator's group over Kubernetes: every service account of the object's namespace
NAMESPACE_CREATOR = "group:system:serviceaccounts:{namespace}"
_TEMPLATE_KEYS = frozenset({"pins", "description", "namespaces"})


@dataclass(frozen=True)
class Template:
    name: str
    pins: Mapping[str, Any]
    description: str = ""
    # which namespaces' WorkflowStreams may use it; None: all
    namespaces: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "namespaces": list(self.namespaces) if self.namespaces is not None else None,
            "pins": dict(self.pins),
        }


@dataclass(frozen=True)
class Templates:
    """The platform's templates over the built-in base for this data plane."""

    base: Mapping[str, Any]
    named: Mapping[str, Template] = field(default_factory=dict)

    def get(self, name: str | None, namespace: str | None = None) -> Template:
        """The named template (``default`` when None). ``NotFound`` for an unknown name, or one a namespace
        may not use, naming those it may."""
        chosen = name or DEFAULT
        template = self.named.get(chosen)
        if template is None and chosen == DEFAULT:
            return Template(DEFAULT, {}, "the built-in default: this data plane's regions, every right for the creator")
        if template is None or (namespace is not None and not usable_in(template, namespace)):
            usable = sorted(t.name for t in self.named.values() if namespace is None or usable_in(t, namespace))
            where = f" in namespace {namespace}" if namespace is not None else ""
            raise NotFound(
                f"no pins template {chosen!r}{where}; templates: {', '.join(usable) or 'only the built-in default'}",
                field="template",
                templates=usable,
            )
        return template

    def resolve(
        self, name: str | None, creator: str, overrides: Mapping[str, Any] | None = None, namespace: str | None = None
    ) -> StreamPins:
        """The whole pins of a stream made from template ``name`` with ``overrides`` over it."""
        template = self.get(name, namespace)
        return resolve(merge(merge(self.base, template.pins), overrides or {}), creator)

    def requested(
        self, name: str | None, pins: Mapping[str, Any] | None, creator: str, namespace: str | None = None
    ) -> StreamPins:
        """The pins a create asks for, over HTTP or as a WorkflowStream: ``pins`` without a template are the
        whole pins (as before templates existed); otherwise template ``name`` (the default when None) with
        ``pins`` merged over it."""
        if pins is not None and name is None:
            return parse_pins(pins)
        return self.resolve(name, creator, pins, namespace)


def usable_in(template: Template, namespace: str) -> bool:
    return template.namespaces is None or namespace in template.namespaces


def base_template(region: str, metadata_region: str | None, object_regions: Sequence[str]) -> dict[str, Any]:
    """What a stream is unless a template or the caller says otherwise: its data in this data plane's
    regions, every right for its creator, and credit that bounds what waits unread (appends block for up
    to 5 s, then 429, once 10,000 records or 64 MiB are unread)."""
    return {
        "direction": "output",
        "content_class": "model_output",
        "schema_ref": "unspecified",
        "placement": {
            "metadata_home": metadata_region or region,
            "object_regions": [region if region in object_regions or not object_regions else object_regions[0]],
            "client_egress_regions": [region],
            "log_region": region,
        },
        "authorization": {action: [CREATOR] for action in ("append", "read", "ack", "close", "legal_hold")},
        "credit": {
            "max_unread_items": 10_000,
            "max_unread_bytes": 64 * 1024 * 1024,
            "policy": "block",
            "block_timeout_ms": 5000,
        },
    }


def merge(under: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged onto ``under``: objects key by key, anything else replaced."""
    merged = copy.deepcopy(dict(under))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve(document: Mapping[str, Any], creator: str) -> StreamPins:
    """A pins document with ``$creator`` replaced, validated as pins sent to our own API are."""
    raw = copy.deepcopy(dict(document))
    authorization = raw.get("authorization")
    if isinstance(authorization, dict):
        for action, subjects in authorization.items():
            if isinstance(subjects, list):
                authorization[action] = [creator if s == CREATOR else s for s in subjects]
    return parse_pins(raw)


def parse_templates(raw: Any, base: Mapping[str, Any]) -> Templates:
    """Templates as configured; each one is resolved once here, so a template that cannot make valid pins
    is refused when the process starts (``ValueError`` naming it and the field), never at a create."""
    if not isinstance(raw, dict):
        raise ValueError('must be a JSON object of name -> {"pins": {...}, "description": ..., "namespaces": [...]}')
    named = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("pins", {}), dict):
            raise ValueError(f'template {name!r} must be an object with "pins" (an object of pins)')
        unknown = sorted(set(entry) - _TEMPLATE_KEYS)
        if unknown:
            raise ValueError(f"template {name!r} has unknown key(s) {', '.join(unknown)}")
        namespaces = entry.get("namespaces")
        if namespaces is not None and not (
            isinstance(namespaces, list) and all(isinstance(n, str) and n for n in namespaces)
        ):
            raise ValueError(f"template {name!r}: namespaces must be a list of names")
        description = entry.get("description", "")
        if not isinstance(description, str):
            raise ValueError(f"template {name!r}: description must be text")
        template = Template(
            name, entry.get("pins", {}), description, tuple(namespaces) if namespaces is not None else None
        )
        try:
            resolve(merge(base, template.pins), "template-check")
        except StreamError as exc:  # InvalidDefinition, ForbiddenContentClass
            raise ValueError(f"template {name!r} makes invalid pins: {exc.explained()}") from None
        named[name] = template
    return Templates(base, named)
