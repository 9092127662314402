"""The Kopf peering object, made at start-up if missing, so replicas that start together see each other.

Kopf's keep-alive writes this replica into the peering object once at start and then only every
``lifetime - 5..10`` seconds; while the object does not exist, that first write finds nothing. An object
made after the operator's pods (a chart's post-install hook) appears to each replica without the others
in it, and each works as if alone until its next keep-alive (several active operators); and a hook can
fail on a new cluster (helm may not yet map the kind of a CRD made moments before). Kopf starts peering
only after the start-up handlers, so the start-up makes sure the object exists first: it creates it (a
conflict means another replica did), or, without the right to, waits for it; the first keep-alive then
registers every replica.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import kopf

from .settings import OperatorSettings

POLL_SECONDS = 0.5


def _credentials(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """What Kopf itself logs in with (its credentials retriever starts only after the start-up handlers)."""
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.PermanentError("no Kubernetes credentials: neither in-cluster nor KUBECONFIG")
    return info


def peering_path(config: OperatorSettings) -> str:
    if config.namespace is None:
        return f"/apis/kopf.dev/v1/clusterkopfpeerings/{config.peering_name}"
    return f"/apis/kopf.dev/v1/namespaces/{config.namespace}/kopfpeerings/{config.peering_name}"


def peering_object(config: OperatorSettings) -> dict[str, Any]:
    kind = "ClusterKopfPeering" if config.namespace is None else "KopfPeering"
    metadata = {"name": config.peering_name}
    if config.namespace is not None:
        metadata["namespace"] = config.namespace
    return {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": metadata}


async def ensure_peering(config: OperatorSettings, settings: kopf.OperatorSettings, logger: kopf.Logger) -> None:
    """Return once the peering object exists: found, created here, or created meanwhile by another replica.
    Without the right to create it (403), or before its CRD exists (404), wait for it; log once."""
    info = _credentials(settings)
    url = f"{info.server.rstrip('/')}{peering_path(config)}"
    collection = url.rsplit("/", 1)[0]
    waiting_logged = False
    connector = aiohttp.TCPConnector(ssl=info.as_ssl_context())
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as http:
        while True:
            try:
                async with http.get(url, headers=info.as_http_headers()) as resp:
                    if resp.status == 200:
                        return
                    reason = f"GET: HTTP {resp.status}"
                if resp.status == 404:
                    body = peering_object(config)
                    async with http.post(collection, json=body, headers=info.as_http_headers()) as resp:
                        if resp.status == 201:
                            logger.info("created the peering object %s", config.peering_name)
                            return
                        if resp.status == 409:  # another replica was first
                            return
                        reason = f"create: HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if not waiting_logged:
                logger.info("waiting for the peering object %s (%s)", config.peering_name, reason)
                waiting_logged = True
            await asyncio.sleep(POLL_SECONDS)
