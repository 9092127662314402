"""Who may do what on a stream, from the definition's pinned authorization."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .errors import Forbidden
from .pins import Authorization

Action = Literal["append", "read", "ack", "close", "legal_hold"]


@dataclass(frozen=True)
class Principal:
    name: str
    groups: frozenset[str] = field(default_factory=frozenset)


def may(authorization: Authorization, principal: Principal, action: Action) -> bool:
    subjects = getattr(authorization, action)
    return any(
        subject == "*"
        or subject == principal.name
        or (subject.startswith("group:") and subject[len("group:") :] in principal.groups)
        for subject in subjects
    )


def may_see(authorization: Authorization, principal: Principal) -> bool:
    """Any right on a stream lets a principal read its definition."""
    return any(may(authorization, principal, action) for action in ("append", "read", "ack", "close", "legal_hold"))


def require(authorization: Authorization, principal: Principal, action: Action) -> None:
    if not may(authorization, principal, action):
        raise Forbidden(f"principal may not {action.replace('_', ' ')} on this stream")
