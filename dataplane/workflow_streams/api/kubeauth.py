"""Kubernetes service-account tokens, validated by the API server (TokenReview), cached briefly.

In-cluster callers send their projected service-account token as a bearer token. The data plane asks
the API server whether it is valid for our audience; the answer names the principal (user, groups).
The data plane's own service account needs ``system:auth-delegator`` to create TokenReviews.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
from pathlib import Path

import aiohttp

# The settings live in config (below the shells); re-exported so callers keep one import for token review.
from ..adapters.config import IN_CLUSTER as IN_CLUSTER
from ..adapters.config import KubeAuthSettings as KubeAuthSettings
from ..domain.authz import Principal

log = logging.getLogger(__name__)


class TokenReviewer:
    def __init__(self, settings: KubeAuthSettings) -> None:
        self.settings = settings
        self._cache: dict[bytes, tuple[float, Principal | None]] = {}
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            context = ssl.create_default_context(cafile=self.settings.ca_file)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=10)
            )
        return self._session

    async def review(self, token: str) -> Principal | None:
        """The principal a token stands for, or None if the API server does not accept it."""
        key = hashlib.sha256(token.encode()).digest()
        cached = self._cache.get(key)
        now = time.monotonic()
        if cached is not None and cached[0] > now:
            return cached[1]
        principal = await self._ask(token)
        ttl = self.settings.cache_seconds if principal else self.settings.negative_cache_seconds
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key] = (now + ttl, principal)
        return principal

    async def _ask(self, token: str) -> Principal | None:
        own_token = (await asyncio.to_thread(Path(self.settings.token_file).read_text)).strip()
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": list(self.settings.audiences)},
        }
        http = await self._http()
        async with http.post(
            f"{self.settings.api_url}/apis/authentication.k8s.io/v1/tokenreviews",
            json=body,
            headers={"Authorization": f"Bearer {own_token}"},
        ) as resp:
            if resp.status != 201:
                log.error("TokenReview failed: HTTP %d %s", resp.status, (await resp.text())[:300])
                raise aiohttp.ClientResponseError(resp.request_info, resp.history, status=resp.status)
            review = await resp.json()
        status = review.get("status", {})
        if not status.get("authenticated"):
            return None
        user = status["user"]
        return Principal(user["username"], frozenset(user.get("groups", [])))
