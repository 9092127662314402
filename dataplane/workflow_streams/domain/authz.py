"""Who may do what on a stream, from the definition's pinned authorization.

One check, ``authorize(authorization, caller, right)``, which every store entry point that acts on a
stream runs on the row it loads (``store.streams.load``): handlers pass the caller in and never check
rights themselves. A caller is a ``Principal`` (rights from the pins) or ``Trusted`` (authorized outside
the pins, e.g. the operator by Kubernetes RBAC on its custom resources; the name says who, for audit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .errors import Forbidden
from .ownership import Owner
from .pins import Authorization

Action = Literal["append", "read", "subscribe", "ack", "close", "legal_hold", "delete"]
# the actions any of which lets a principal see a stream (its definition, its name in listings)
SEEING: tuple[Action, ...] = ("append", "read", "ack", "close", "legal_hold", "delete")
# an unset action takes another's subjects
_DEFAULTS: dict[str, Action] = {"subscribe": "read", "delete": "close"}
# what a check asks for: an action, or "see" (any right lets a principal read the definition)
Right = Action | Literal["see"]


@dataclass(frozen=True)
class Principal:
    name: str
    groups: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Trusted:
    """A caller authorized outside the pins (the operator, by Kubernetes RBAC; internal housekeeping).
    ``owner`` is the WorkflowStream the operator acts for: the store then applies the ownership rules
    (``domain.ownership``) before anything else, so Kubernetes RBAC on one namespace's objects never
    reaches another namespace's streams."""

    name: str
    owner: Owner | None = None


Caller = Principal | Trusted


@dataclass(frozen=True)
class Access:
    """What an entry point checks on the stream it acts on, before anything else is decided: ``caller``
    holds ``right``, and a caller that takes data out (``client_region`` given) does so from one of the
    stream's client-egress regions (``store.streams.authorize``)."""

    caller: Caller
    right: Right = "see"
    client_region: str | None = None


def matching_subject(authorization: Authorization, principal: Principal, action: Action) -> str | None:
    """The pinned subject that grants ``action`` to ``principal``, if any: the reason for a decision."""
    for subject in subjects_of(authorization, action):
        if (
            subject == "*"
            or subject == principal.name
            or (subject.startswith("group:") and subject[len("group:") :] in principal.groups)
        ):
            return str(subject)
    return None


def subjects_of(authorization: Authorization, action: Action) -> list[str]:
    """The subjects pinned for ``action``, an unset one's default filled in."""
    subjects: list[str] | None = getattr(authorization, action)
    if subjects is None:
        subjects = getattr(authorization, _DEFAULTS[action])
    return list(subjects or ())


def seen_by(authorization: Authorization) -> list[str]:
    """Every subject that may see the stream (``may_see``), sorted: stored with the stream so listings
    select what a caller may see in SQL (``caller_subjects`` meets it there)."""
    return sorted({subject for action in SEEING for subject in subjects_of(authorization, action)})


def caller_subjects(principal: Principal) -> list[str]:
    """The subjects that match ``principal``: its name, its groups, and ``*``."""
    return ["*", principal.name, *(f"group:{group}" for group in sorted(principal.groups))]


def may(authorization: Authorization, principal: Principal, action: Action) -> bool:
    return matching_subject(authorization, principal, action) is not None


def may_see(authorization: Authorization, principal: Principal) -> bool:
    """Any right on a stream lets a principal read its definition."""
    return any(may(authorization, principal, action) for action in SEEING)


def require(authorization: Authorization, principal: Principal, action: Action) -> None:
    if not may(authorization, principal, action):
        raise Forbidden(f"principal may not {action.replace('_', ' ')} on this stream")


def permits(authorization: Authorization, caller: Caller, right: Right) -> bool:
    if isinstance(caller, Trusted):
        return True
    if right == "see":
        return may_see(authorization, caller)
    return may(authorization, caller, right)


def authorize(authorization: Authorization, caller: Caller, right: Right) -> None:
    """The one rights check: ``Forbidden`` unless ``caller`` holds ``right``."""
    if not permits(authorization, caller, right):
        if right == "see":
            raise Forbidden("principal has no right on this stream")
        raise Forbidden(f"principal may not {right.replace('_', ' ')} on this stream")
