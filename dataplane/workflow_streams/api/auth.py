"""Bearer-token authentication: who is calling."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from ..domain.authz import Principal
from ..domain.errors import AuthUnavailable, Unauthenticated
from .kubeauth import TokenReviewer


class TokenAuthenticator:
    """Bearer tokens: static tokens from configuration first, then Kubernetes service-account tokens
    through TokenReview when configured."""

    def __init__(self, tokens: Mapping[str, Principal], reviewer: TokenReviewer | None = None) -> None:
        # keyed by digest: a dict lookup on the raw token could leak its prefix through timing
        self._by_digest = {_digest(token): principal for token, principal in tokens.items()}
        self.reviewer = reviewer

    async def authenticate(self, request: web.Request, allow_query_token: bool = False) -> Principal:
        """``allow_query_token``: browsers' EventSource cannot send headers, so subscribe also accepts
        ``?access_token=`` (RFC 6750 section 2.3). Query strings are never logged."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if not header and allow_query_token and "access_token" in request.query:
            scheme, token = "bearer", request.query["access_token"]
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("a bearer token is required")
        token = token.strip()
        principal = self._by_digest.get(_digest(token))
        if principal is None and self.reviewer is not None:
            try:
                principal = await self.reviewer.review(token)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise AuthUnavailable("the token could not be verified right now; retry") from exc
        if principal is None:
            raise Unauthenticated("the bearer token is not valid")
        return principal


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
