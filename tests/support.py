"""Test helpers: default pins and a thin wrapper over the HTTP API (raw responses, no client magic)."""

from __future__ import annotations

import copy
import socket
from typing import Any

from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient
from prometheus_client import REGISTRY

from workflow_streams import API_PREFIX
from workflow_streams.domain.authz import Principal

TOKENS = {
    "tok-alice": Principal("alice"),
    "tok-bob": Principal("bob", frozenset({"readers"})),
    "tok-eve": Principal("eve"),
}
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}
EVE = {"Authorization": "Bearer tok-eve"}


def pins(**overrides: Any) -> dict[str, Any]:
    """Pins where alice may do everything and group 'readers' may read and ack."""
    base: dict[str, Any] = {
        "direction": "output",
        "content_class": "model_output",
        "schema_ref": "example.com/schemas/output/v1",
        "placement": {
            "metadata_home": "eu-west-1",
            "metadata_replicas": ["eu-central-1"],
            "object_regions": ["eu-west-1"],
            "client_egress_regions": ["eu-west-1"],
            "log_region": "eu-west-1",
        },
        "retention": {"max_records": None, "max_age_seconds": None},
        "authorization": {
            "append": ["alice"],
            "read": ["alice", "group:readers"],
            "ack": ["alice", "group:readers"],
            "close": ["alice"],
            "legal_hold": ["alice"],
        },
        "credit": {"max_unread_items": 100_000, "max_unread_bytes": 1 << 30, "policy": "reject"},
    }
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = {**result[key], **value}
        else:
            result[key] = value
    return result


def credit(
    max_unread_items: int, policy: str = "reject", block_timeout_ms: int = 10_000, **more: Any
) -> dict[str, Any]:
    """Credit pins with a generous byte ceiling unless given."""
    return {
        "max_unread_items": max_unread_items,
        "max_unread_bytes": 10_000,
        "policy": policy,
        "block_timeout_ms": block_timeout_ms,
        **more,
    }


class StreamsApi:
    def __init__(self, client: TestClient, headers: dict[str, str] | None = None) -> None:
        self.client = client
        self.headers = ALICE if headers is None else headers

    def as_(self, headers: dict[str, str]) -> StreamsApi:
        return StreamsApi(self.client, headers)

    def url(self, run: str, stream: str | None = None, tail: str = "") -> str:
        path = f"{API_PREFIX}/runs/{run}/streams"
        if stream is not None:
            path += f"/{stream}{tail}"
        return path

    async def create(self, run: str, stream: str, **pin_overrides: Any) -> ClientResponse:
        body = {"stream_id": stream, "pins": pins(**pin_overrides)}
        return await self.client.post(self.url(run), json=body, headers=self.headers)

    async def append(
        self, run: str, stream: str, *data: Any, key: str | None = None, body: Any = None
    ) -> ClientResponse:
        headers = dict(self.headers)
        if key is not None:
            headers["Idempotency-Key"] = key
        if body is None:
            body = {"data": data[0]} if len(data) == 1 else {"records": [{"data": d} for d in data]}
        return await self.client.post(self.url(run, stream, "/records"), json=body, headers=headers)

    async def read(self, run: str, stream: str, after: Any = None, limit: Any = None) -> ClientResponse:
        params = {}
        if after is not None:
            params["after"] = str(after)
        if limit is not None:
            params["limit"] = str(limit)
        return await self.client.get(self.url(run, stream, "/records"), params=params, headers=self.headers)

    async def read_all(self, run: str, stream: str, after: int = 0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            resp = await self.read(run, stream, after=after, limit=1000)
            assert resp.status == 200, await resp.text()
            page = await resp.json()
            out.extend(page["records"])
            if page["next_after"] == after:
                return out
            after = page["next_after"]

    async def ack(self, run: str, stream: str, consumer: str, sequence: Any) -> ClientResponse:
        return await self.client.post(
            self.url(run, stream, f"/consumers/{consumer}/ack"),
            json={"sequence": sequence},
            headers=self.headers,
        )

    async def close(self, run: str, stream: str) -> ClientResponse:
        return await self.client.post(self.url(run, stream, "/close"), headers=self.headers)

    async def hold(
        self, run: str, stream: str, enabled: bool, reason: str = "matter 1", **extra: Any
    ) -> ClientResponse:
        body = {"enabled": enabled, "reason": reason, **extra}
        return await self.client.put(self.url(run, stream, "/legal-hold"), json=body, headers=self.headers)

    async def get(self, run: str, stream: str) -> ClientResponse:
        return await self.client.get(self.url(run, stream), headers=self.headers)


def metric(name: str, **labels: str) -> float:
    """A sample of this process's Prometheus registry, where the in-process test apps count (0 if unset).
    Counters are process-wide: compare with a value read earlier in the same test, never with a constant."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def problem(resp: ClientResponse, status: int, code: str) -> dict[str, Any]:
    """Assert a problem+json response with this status and stable code; return its body."""
    text = await resp.text()
    assert resp.status == status, text
    assert resp.content_type == "application/problem+json", resp.content_type
    body: dict[str, Any] = await resp.json(content_type=None)
    assert body["code"] == code, body
    assert body["status"] == status
    return body


class SseEvent:
    def __init__(self, event: str, data: str, id: str | None) -> None:
        self.event, self.data, self.id = event, data, id

    def json(self) -> Any:
        import json

        return json.loads(self.data)

    def __repr__(self) -> str:
        return f"SseEvent({self.event!r}, id={self.id!r})"


class SseReader:
    """Events of a text/event-stream response, parsed by the client library's parser."""

    def __init__(self, resp: ClientResponse) -> None:
        from workflow_streams.client.sse import iter_events

        self.resp = resp
        self.comments: list[str] = []
        self._items = iter_events(resp.content)

    async def next(self, seconds: float = 10.0) -> SseEvent | None:
        """The next event, or None when the server ends the stream."""
        import asyncio

        while True:
            try:
                item = await asyncio.wait_for(anext(self._items), seconds)
            except StopAsyncIteration:
                return None
            if isinstance(item, str):  # a comment, e.g. a heartbeat
                self.comments.append(item)
                continue
            return SseEvent(item.event, item.data, item.id)

    async def records(self, count: int, seconds: float = 10.0) -> list[int]:
        out = []
        while len(out) < count:
            event = await self.next(seconds)
            assert event is not None, f"stream ended after {out}"
            assert event.event == "record", event
            out.append(int(event.id or 0))
        return out


class ObjectsApi:
    """The objects endpoints of one stream."""

    def __init__(self, api: StreamsApi, run: str, stream: str) -> None:
        self.api, self.run, self.stream = api, run, stream

    def _url(self, tail: str) -> str:
        return self.api.url(self.run, self.stream, f"/objects{tail}")

    async def prepare(self, data: bytes, key: str, **extra: Any) -> ClientResponse:
        import hashlib

        body = {"idempotency_key": key, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data), **extra}
        return await self.api.client.post(self._url("/prepare"), json=body, headers=self.api.headers)

    async def upload(self, intent_id: str, data: Any) -> ClientResponse:
        import io

        headers = {**self.api.headers, "Content-Type": "application/octet-stream"}
        body = io.BytesIO(data) if isinstance(data, bytes) else data
        return await self.api.client.put(self._url(f"/{intent_id}/upload"), data=body, headers=headers)

    async def commit(self, intent_id: str) -> ClientResponse:
        return await self.api.client.post(self._url(f"/{intent_id}/commit"), headers=self.api.headers)

    async def abort(self, intent_id: str) -> ClientResponse:
        return await self.api.client.post(self._url(f"/{intent_id}/abort"), headers=self.api.headers)

    async def put(self, data: bytes, key: str) -> int:
        """prepare + upload + commit; returns the record's sequence."""
        prepared = await self.prepare(data, key)
        assert prepared.status in (200, 201), await prepared.text()
        intent = (await prepared.json())["intent_id"]
        uploaded = await self.upload(intent, data)
        assert uploaded.status == 200, await uploaded.text()
        committed = await self.commit(intent)
        assert committed.status in (200, 201), await committed.text()
        return int((await committed.json())["sequence"])


def small_receive_buffer(addr_info: Any) -> socket.socket:
    """A client socket factory (``TCPConnector(socket_factory=...)``) with a fixed, small receive buffer
    (no autotuning up to tens of MB), so that a reader that stops reading stalls the server's write
    whatever the machine's TCP settings."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family, type_, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    return sock
