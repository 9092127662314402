"""Who may do what on a stream, from the definition's pinned authorization."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .errors import Forbidden
from .pins import Authorization

Action = Literal["append", "read", "subscribe", "ack", "close", "legal_hold"]


@dataclass(frozen=True)
class Principal:
    name: str
    groups: frozenset[str] = field(default_factory=frozenset)


def matching_subject(authorization: Authorization, principal: Principal, action: Action) -> str | None:
    """The pinned subject that grants ``action`` to ``principal``, if any: the reason for a decision."""
    subjects = getattr(authorization, action)
    if subjects is None:  # subscribe defaults to read
        subjects = authorization.read
    for subject in subjects:
        if (
            subject == "*"
            or subject == principal.name
            or (subject.startswith("group:") and subject[len("group:") :] in principal.groups)
        ):
            return str(subject)
    return None


def may(authorization: Authorization, principal: Principal, action: Action) -> bool:
    return matching_subject(authorization, principal, action) is not None


def may_see(authorization: Authorization, principal: Principal) -> bool:
    """Any right on a stream lets a principal read its definition."""
    return any(may(authorization, principal, action) for action in ("append", "read", "ack", "close", "legal_hold"))


def require(authorization: Authorization, principal: Principal, action: Action) -> None:
    if not may(authorization, principal, action):
        raise Forbidden(f"principal may not {action.replace('_', ' ')} on this stream")
