"""Just enough of the Kubernetes API for the CLI's hold/release: kubeconfig auth and one resource."""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

HOLDS = "/apis/workflowstreams.dev/v1alpha1/namespaces/{namespace}/streamlegalholds"
STREAMS = "/apis/workflowstreams.dev/v1alpha1/namespaces/{namespace}/workflowstreams"


class HoldPending(Exception):
    """A hold or release was requested, but the operator has not reported it done; the request stands."""


def _material(entry: dict[str, Any], key: str) -> str | None:
    """A path for ``key`` or ``key-data`` (decoded into a private temporary file)."""
    if entry.get(key):
        return str(entry[key])
    data = entry.get(f"{key}-data")
    if not data:
        return None
    handle = tempfile.NamedTemporaryFile(delete=False, suffix=".pem")  # noqa: SIM115 - kept for ssl
    handle.write(base64.b64decode(data))
    handle.close()
    return handle.name


class KubeClient:
    def __init__(self, kubeconfig: Path | None = None) -> None:
        path = kubeconfig or Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
        config = yaml.safe_load(path.read_text())
        context_name = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        self.server = cluster["server"].rstrip("/")
        self.namespace = context.get("namespace", "default")
        self.ssl = ssl.create_default_context(cafile=_material(cluster, "certificate-authority"))
        cert, key = _material(user, "client-certificate"), _material(user, "client-key")
        if cert and key:
            self.ssl.load_cert_chain(cert, key)
        self.headers = {"Authorization": f"Bearer {user['token']}"} if user.get("token") else {}

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl)) as session,
            session.request(method, self.server + path, json=body, headers=self.headers) as resp,
        ):
            answer: dict[str, Any] = await resp.json(content_type=None)
            if resp.status == 404:
                raise LookupError(answer.get("message", "not found"))
            if resp.status >= 400:
                raise PermissionError(f"{resp.status}: {answer.get('message', answer)}")
            return answer

    async def stream_exists(self, namespace: str, name: str) -> bool | None:
        """Whether the WorkflowStream exists; None when this principal may not read WorkflowStreams."""
        try:
            await self.request("GET", STREAMS.format(namespace=namespace) + f"/{name}")
        except LookupError:
            return False
        except PermissionError:
            return None
        return True

    async def create_hold(
        self, namespace: str, name: str, stream: str, matter: str, reason: str, requested_by: str
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "workflowstreams.dev/v1alpha1",
            "kind": "StreamLegalHold",
            "metadata": {"name": name},
            "spec": {"streamRef": {"name": stream}, "matterId": matter, "reason": reason, "requestedBy": requested_by},
        }
        return await self.request("POST", HOLDS.format(namespace=namespace), body)

    async def delete_hold(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.request("DELETE", HOLDS.format(namespace=namespace) + f"/{name}")

    async def wait_hold_applied(self, namespace: str, name: str, seconds: float, poll: float = 0.5) -> dict[str, Any]:
        """The hold's ``Applied`` condition once the operator reports it True (the stream is held in
        Postgres and on its objects). Raises HoldPending, with the last condition seen, after ``seconds``."""
        deadline = time.monotonic() + seconds
        applied: dict[str, Any] | None = None
        while True:
            try:
                hold = await self.request("GET", HOLDS.format(namespace=namespace) + f"/{name}")
            except LookupError:
                raise HoldPending(
                    f"streamlegalhold.workflowstreams.dev/{name} was deleted before the operator applied it"
                ) from None
            conditions = hold.get("status", {}).get("conditions", [])
            applied = next((c for c in conditions if c.get("type") == "Applied"), applied)
            if applied is not None and applied.get("status") == "True":
                return applied
            if time.monotonic() >= deadline:
                seen = f"its Applied condition says: {applied.get('message')}" if applied else "it has no status yet"
                if said := _operator_says(hold):
                    seen += f"; the operator says: {said}"
                raise HoldPending(
                    f"streamlegalhold.workflowstreams.dev/{name} was created, but within {seconds:g}s the operator "
                    f"did not report the hold applied ({seen}); the stream may not be held yet. Is the operator "
                    f"running? See kubectl describe streamlegalhold {name} -n {namespace}"
                )
            await asyncio.sleep(poll)

    async def wait_hold_gone(self, namespace: str, name: str, seconds: float, poll: float = 0.5) -> None:
        """Until the hold object is gone: the operator's finalizer releases the hold, then lets it go."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                await self.request("GET", HOLDS.format(namespace=namespace) + f"/{name}")
            except LookupError:
                return
            if time.monotonic() >= deadline:
                raise HoldPending(
                    f"streamlegalhold.workflowstreams.dev/{name} is being deleted, but within {seconds:g}s the "
                    "operator did not release the hold; the stream is still held until it does. Is the operator "
                    f"running? See kubectl describe streamlegalhold {name} -n {namespace}"
                )
            await asyncio.sleep(poll)


def _operator_says(resource: dict[str, Any]) -> str:
    """The last message of the operator's handlers (Kopf keeps each handler's progress in the status),
    e.g. why a hold is not applied yet."""
    progress = resource.get("status", {}).get("kopf", {}).get("progress", {})
    messages = [str(p["message"]) for p in progress.values() if isinstance(p, dict) and p.get("message")]
    return "; ".join(messages)
