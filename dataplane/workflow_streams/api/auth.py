"""Bearer-token authentication: who is calling."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from aiohttp import web

from ..domain.authz import Principal
from ..domain.errors import Unauthenticated


class TokenAuthenticator:
    """Static tokens from configuration (Kubernetes service-account tokens plug in beside this)."""

    def __init__(self, tokens: Mapping[str, Principal]) -> None:
        # keyed by digest: a dict lookup on the raw token could leak its prefix through timing
        self._by_digest = {_digest(token): principal for token, principal in tokens.items()}

    def authenticate(self, request: web.Request, allow_query_token: bool = False) -> Principal:
        """``allow_query_token``: browsers' EventSource cannot send headers, so subscribe also accepts
        ``?access_token=`` (RFC 6750 section 2.3). Query strings are never logged."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if not header and allow_query_token and "access_token" in request.query:
            scheme, token = "bearer", request.query["access_token"]
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("a bearer token is required")
        principal = self._by_digest.get(_digest(token.strip()))
        if principal is None:
            raise Unauthenticated("the bearer token is not valid")
        return principal


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
