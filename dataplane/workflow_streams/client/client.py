"""StreamsClient: append, read, subscribe (with resume), ack, close, objects."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from .errors import BackpressureError, ObjectDigestMismatch, ProblemError, problem_error
from .models import AppendResult, ObjectInfo, Page, Record
from .sse import Event, iter_events

log = logging.getLogger(__name__)
PREFIX = "/api/workflow-streams"
# the pages a catch-up asks for: as many records as the server gives (about 4 MiB of them)
CATCH_UP_RECORDS = 100_000
CATCH_UP_BYTES = 4 * 1024 * 1024
_RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
# statuses worth waiting for: the same request may succeed later
TRANSIENT_STATUSES = frozenset({408, 425, 429, 502, 503, 504})
# ... unless the problem says it will not: configuration, not load or a restart (servers now answer
# this one with 421; older ones said 503)
PERMANENT_CODES = frozenset({"object_region_unavailable"})

RetryWait = Callable[[float, str], Awaitable[None]]
"""Called with (seconds, reason) before each retry; it does the waiting (e.g. showing a countdown)."""


async def _sleep(seconds: float, reason: str) -> None:
    log.info("%s; retrying in %.1fs", reason, seconds)
    await asyncio.sleep(seconds)


def is_transient(status: int, body: dict[str, Any] | None) -> bool:
    """Whether a failed answer may succeed if the same request is sent again later."""
    return status in TRANSIENT_STATUSES and (body or {}).get("code") not in PERMANENT_CODES


class StreamsClient:
    """One client per process is enough; it keeps a connection pool.

    ``max_wait``: how long append, commit and subscribe keep retrying through backpressure (429,
    honouring ``Retry-After``), an unavailable server (503) or a dropped connection.
    ``connect_wait``: how long to keep retrying while the server cannot be reached at all (connection
    refused, unknown host; default ``max_wait``, which rides out a server restart). A command-line
    tool wants this short: a wrong URL is not going to start answering.
    ``retry_wait``: does the waiting between retries (default: sleep and log); a CLI shows a countdown.
    Permanent problems (any other 4xx, e.g. 421 for an object region this server has no store for)
    are raised at once.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        session: aiohttp.ClientSession | None = None,
        max_wait: float = 60.0,
        connect_wait: float | None = None,
        retry_wait: RetryWait | None = None,
    ) -> None:
        # the URL dev prints as the data plane ends in the API prefix; the prefix is added per request
        self.base_url = base_url.rstrip("/").removesuffix(PREFIX)
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session = session
        self._own_session = session is None
        self.max_wait = max_wait
        self.connect_wait = max_wait if connect_wait is None else connect_wait
        self._retry_wait = retry_wait or _sleep

    async def __aenter__(self) -> StreamsClient:
        return self

    async def __aexit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | None) -> None:
        await self.close_session()

    async def close_session(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _url(self, run_id: str, stream_id: str | None = None, tail: str = "") -> str:
        path = f"{self.base_url}{PREFIX}/runs/{run_id}/streams"
        return path if stream_id is None else f"{path}/{stream_id}{tail}"

    async def _call(self, method: str, url: str, **kwargs: Any) -> tuple[int, Any, float]:
        """One request: (status, decoded body, Retry-After seconds). A body that is not JSON (a proxy's
        error page, a wrong URL) becomes a problem with its first line as the detail."""
        headers = {**self._headers, **kwargs.pop("headers", {})}
        async with self.session.request(method, url, headers=headers, **kwargs) as resp:
            body: Any = None
            if resp.content_length != 0:
                text = await resp.text(errors="replace")
                try:
                    body = json.loads(text) if text else None
                except json.JSONDecodeError:
                    body = {"detail": (text.strip().splitlines() or [""])[0][:200]}
            try:
                retry_after = float(resp.headers.get("Retry-After", "1"))
            except ValueError:  # an HTTP date: not worth parsing for a hint
                retry_after = 1.0
            return resp.status, body, retry_after

    async def _retrying(self, method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
        """Retry transient failures (429 as told by Retry-After, 503, dropped connections) for up to
        ``max_wait``, an unreachable server for up to ``connect_wait``; raise anything else at once."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        delay = 0.1
        while True:
            try:
                status, body, retry_after = await self._call(method, url, **kwargs)
            except aiohttp.ClientConnectorError as exc:  # nothing listens there (yet)
                if loop.time() + delay > started + self.connect_wait:
                    raise
                status, body, retry_after = 0, {"code": "unreachable", "detail": str(exc)}, delay
            except _RETRYABLE as exc:
                status, body, retry_after = 0, {"code": "unreachable", "detail": str(exc)}, delay
            if status and status < 400:
                return status, body
            if status and not is_transient(status, body):
                raise problem_error(status, body or {})
            wait = retry_after if status == 429 else delay
            if loop.time() + wait > started + self.max_wait:
                if status == 429:
                    raise BackpressureError(status, body or {}, retry_after)
                raise problem_error(status or 503, body or {})
            reason = f"{status or 'no answer'} {(body or {}).get('code', '')}".strip()
            await self._retry_wait(wait, f"{method} {url}: {reason}")
            delay = min(delay * 2, 5.0)

    async def _checked(self, method: str, url: str, **kwargs: Any) -> Any:
        status, body, _ = await self._call(method, url, **kwargs)
        if status >= 400:
            raise problem_error(status, body or {})
        return body

    # definitions

    async def create_stream(
        self, run_id: str, stream_id: str, pins: dict[str, Any] | None = None, template: str | None = None
    ) -> dict[str, Any]:
        """Create (or find, if the pins are the same) a stream definition: from the server's default
        template when neither is given, from ``template``, with ``pins`` merged over it when both are,
        or with ``pins`` as the whole pins."""
        request: dict[str, Any] = {"stream_id": stream_id}
        if pins is not None:
            request["pins"] = pins
        if template is not None:
            request["template"] = template
        body: dict[str, Any] = await self._checked("POST", self._url(run_id), json=request)
        return body

    async def delete_stream(self, run_id: str, stream_id: str) -> dict[str, Any]:
        """Delete the stream and its records (refused while a legal hold exists)."""
        body: dict[str, Any] = await self._checked("DELETE", self._url(run_id, stream_id))
        return body

    async def list_runs(self) -> list[dict[str, Any]]:
        """The runs in which this caller may see a stream, in run id order, following every page."""
        return await self._every_page(f"{self.base_url}{PREFIX}/runs", "runs")

    async def list_templates(self) -> list[dict[str, Any]]:
        """The pins templates a create may name, each with the pins it resolves to for this caller."""
        body = await self._checked("GET", f"{self.base_url}{PREFIX}/templates")
        templates: list[dict[str, Any]] = body["templates"]
        return templates

    async def get_stream(self, run_id: str, stream_id: str) -> dict[str, Any]:
        """The definition (pins, digest, creator) and its ``state`` (sequences, closed, holds)."""
        body: dict[str, Any] = await self._checked("GET", self._url(run_id, stream_id))
        return body

    async def list_streams(self, run_id: str) -> list[dict[str, Any]]:
        """The run's streams this caller may see (definition and state each), in stream id order,
        following the server's pages to the end."""
        return await self._every_page(self._url(run_id), "streams")

    async def _every_page(self, url: str, key: str) -> list[dict[str, Any]]:
        """The ``key`` items of a listing, every page of it (each page's ``next_after`` names the next)."""
        items: list[dict[str, Any]] = []
        params: dict[str, str] = {}
        while True:
            body = await self._checked("GET", url, params=params)
            items += body[key]
            if not body.get("next_after"):
                return items
            params = {"after": body["next_after"]}

    # records

    async def append(
        self,
        run_id: str,
        stream_id: str,
        *data: Any,
        records: list[dict[str, Any]] | None = None,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Append JSON values (one record each) or raw ``records`` dicts, all or nothing.

        Retries are safe: every attempt carries the same Idempotency-Key (generated if not given), so
        a retry after a lost answer returns the original sequences instead of appending twice.
        """
        items = records if records is not None else [{"data": value} for value in data]
        if not items:
            raise ValueError("nothing to append")
        body = items[0] if len(items) == 1 else {"records": items}
        key = idempotency_key or str(uuid.uuid4())
        status, result = await self._retrying(
            "POST", self._url(run_id, stream_id, "/records"), json=body, headers={"Idempotency-Key": key}
        )
        return AppendResult(result["first_sequence"], result["last_sequence"], replayed=status == 200)

    async def read(
        self, run_id: str, stream_id: str, after: int = 0, limit: int = 100, max_bytes: int | None = None
    ) -> Page:
        """One page of records with sequence > after: at most ``limit`` records (up to 100,000) and about
        ``max_bytes`` of them (the server's default 1 MiB, up to 16 MiB). A pruned cursor raises
        CursorExpiredError."""
        params = {"after": str(after), "limit": str(limit)}
        if max_bytes is not None:
            params["max_bytes"] = str(max_bytes)
        body = await self._checked("GET", self._url(run_id, stream_id, "/records"), params=params)
        return Page(
            records=[Record.from_json(r) for r in body["records"]],
            next_after=body["next_after"],
            earliest=body["earliest"],
            latest=body["latest"],
            closed=body["closed"],
        )

    async def iter_records(
        self, run_id: str, stream_id: str, after: int = 0, progress: Callable[[Page], None] | None = None
    ) -> AsyncIterator[Record]:
        """Every record after ``after`` up to the latest now (catch-up), in large pages: the server
        assembles them in Postgres, so a reader that fell behind reads at the store's speed."""
        while True:
            page = await self.read(run_id, stream_id, after, limit=CATCH_UP_RECORDS, max_bytes=CATCH_UP_BYTES)
            if progress is not None:
                progress(page)
            for record in page.records:
                yield record
            if not page.records or page.next_after >= page.latest:
                return
            after = page.next_after

    async def subscribe(self, run_id: str, stream_id: str, after: int = 0) -> AsyncIterator[Record]:
        """Follow the stream: reconnects and resumes after the last delivered sequence, so the caller
        sees each record exactly once and in order. Ends when a closed stream is drained."""
        last = after
        loop = asyncio.get_running_loop()
        delay, deadline = 0.1, None
        url = self._url(run_id, stream_id, "/subscribe")
        while True:
            try:
                headers = {**self._headers, "Last-Event-ID": str(last)}
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=90)
                async with self.session.get(url, headers=headers, timeout=timeout) as resp:
                    if resp.status != 200:
                        body = await resp.json(content_type=None)
                        if resp.status != 503:
                            raise problem_error(resp.status, body)
                        raise aiohttp.ClientConnectionError(body.get("detail", "unavailable"))
                    delay, deadline = 0.1, None
                    async for item in iter_events(resp.content):
                        if not isinstance(item, Event):
                            continue  # heartbeat
                        if item.event == "record" and item.id is not None and int(item.id) > last:
                            last = int(item.id)
                            yield Record.from_json(json.loads(item.data))
                        elif item.event == "close":
                            return
                        elif item.event == "error":
                            body = json.loads(item.data)
                            raise problem_error(410 if body.get("code") == "cursor_expired" else 409, body)
            except _RETRYABLE as exc:
                deadline = deadline or loop.time() + self.max_wait
                if loop.time() > deadline:
                    raise
                reason = f"subscription to {run_id}/{stream_id} dropped ({exc or type(exc).__name__})"
                await self._retry_wait(delay, f"{reason}; resuming after {last}")
            else:
                await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def ack(self, run_id: str, stream_id: str, consumer_id: str, sequence: int) -> dict[str, Any]:
        """Acknowledge through ``sequence``: ``{"consumer_id", "acked_sequence"}``."""
        body: dict[str, Any] = await self._checked(
            "POST", self._url(run_id, stream_id, f"/consumers/{consumer_id}/ack"), json={"sequence": sequence}
        )
        return body

    async def close(self, run_id: str, stream_id: str) -> dict[str, Any]:
        body: dict[str, Any] = await self._checked("POST", self._url(run_id, stream_id, "/close"))
        return body

    async def read_last(self, run_id: str, stream_id: str, count: int) -> Page:
        """The last ``count`` records (fewer if retention removed the older ones)."""
        state = (await self.get_stream(run_id, stream_id))["state"]
        after = max(state["last_sequence"] - count, state["earliest_sequence"] - 1, 0)
        return await self.read(run_id, stream_id, after, limit=max(1, min(count, CATCH_UP_RECORDS)))

    # input delivery

    async def deliveries(self, run_id: str, stream_id: str) -> dict[str, Any]:
        """An input stream's delivery progress: ``counts`` by state, ``failed`` rows, the ``next`` due."""
        body: dict[str, Any] = await self._checked("GET", self._url(run_id, stream_id, "/deliveries"))
        return body

    async def requeue(self, run_id: str, stream_id: str) -> int:
        """Retry failed deliveries (once the wait service is fixed); returns how many."""
        body = await self._checked("POST", self._url(run_id, stream_id, "/deliveries/requeue"))
        return int(body["requeued"])

    # objects

    async def upload_object(
        self,
        run_id: str,
        stream_id: str,
        path: Path,
        *,
        idempotency_key: str | None = None,
        content_type: str = "application/octet-stream",
        progress: Callable[[int], None] | None = None,
        chunk_size: int = 256 * 1024,
    ) -> int:
        """prepare -> upload -> commit a file, streaming it (never whole in memory); returns the sequence.
        ``progress`` is called with the bytes sent so far."""
        digest, size = await asyncio.to_thread(_sha256_of, path, chunk_size)
        key = idempotency_key or f"{path.name}-{digest[:16]}"
        _, intent = await self._retrying(
            "POST",
            self._url(run_id, stream_id, "/objects/prepare"),
            json={"idempotency_key": key, "sha256": digest, "size": size, "content_type": content_type},
        )
        if intent["state"] != "committed":
            if intent["state"] == "prepared":
                await self._checked(
                    "PUT",
                    self._url(run_id, stream_id, f"/objects/{intent['intent_id']}/upload"),
                    data=_file_chunks(path, chunk_size, progress),
                    headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                )
            _, committed = await self._retrying(
                "POST", self._url(run_id, stream_id, f"/objects/{intent['intent_id']}/commit")
            )
            return int(committed["sequence"])
        return int(intent["committed_sequence"])

    async def read_object(self, run_id: str, stream_id: str, sequence: int) -> bytes:
        """The bytes of the object record at ``sequence``, checked against its sha256 (objects are at most
        32 MiB; ``save_object`` streams to a file instead)."""
        buffer = io.BytesIO()
        await self.download_object(run_id, stream_id, sequence, buffer.write)
        return buffer.getvalue()

    async def save_object(
        self,
        run_id: str,
        stream_id: str,
        sequence: int,
        path: Path,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> ObjectInfo:
        """Write the object record's bytes to ``path``: streamed to ``<path>.part``, renamed once complete
        and checked, so ``path`` never holds a partial or wrong object."""
        partial = path.with_name(path.name + ".part")
        try:
            with partial.open("wb") as f:
                info = await self.download_object(run_id, stream_id, sequence, f.write, progress=progress)
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
        return info

    async def download_object(
        self,
        run_id: str,
        stream_id: str,
        sequence: int,
        write: Callable[[bytes], object],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> ObjectInfo:
        """Stream the object record's bytes to ``write`` as they arrive. A dropped connection resumes where
        it stopped (a Range request), so nothing is written twice; the whole is checked against the size
        and sha256 the server names (``Repr-Digest``), and a mismatch raises ObjectDigestMismatch.
        ``progress`` is called with (bytes so far, size)."""
        url = self._url(run_id, stream_id, f"/records/{sequence}/object")
        loop = asyncio.get_running_loop()
        started, delay = loop.time(), 0.1
        digest, received = hashlib.sha256(), 0
        info: ObjectInfo | None = None
        while True:
            headers = {**self._headers, **({"Range": f"bytes={received}-"} if received else {})}
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
            try:
                async with self.session.get(url, headers=headers, timeout=timeout) as resp:
                    if resp.status >= 400:
                        body = await _problem_body(resp)
                        if not is_transient(resp.status, body) or loop.time() + delay > started + self.max_wait:
                            raise problem_error(resp.status, body)
                        await self._retry_wait(delay, f"GET {url}: {resp.status} {body.get('code', '')}".strip())
                        delay = min(delay * 2, 5.0)
                        continue
                    if info is None:
                        info = _object_info(resp)
                    skip = received if resp.status == 200 else 0  # a server that ignored the Range
                    async for chunk in resp.content.iter_chunked(256 * 1024):
                        if skip:
                            chunk, skip = chunk[skip:], max(0, skip - len(chunk))
                            if not chunk:
                                continue
                        digest.update(chunk)
                        write(chunk)
                        received += len(chunk)
                        if progress is not None:
                            progress(received, info.size)
                    if received < info.size:
                        raise aiohttp.ClientPayloadError(f"the response ended at byte {received} of {info.size}")
            except _RETRYABLE as exc:
                limit = self.connect_wait if isinstance(exc, aiohttp.ClientConnectorError) else self.max_wait
                if loop.time() + delay > started + limit:
                    raise
                await self._retry_wait(delay, f"GET {url}: {exc or type(exc).__name__}; resuming at byte {received}")
                delay = min(delay * 2, 5.0)
                continue
            assert info is not None
            if received != info.size or digest.hexdigest() != info.sha256:
                raise ObjectDigestMismatch(
                    f"received {received} bytes with sha256 {digest.hexdigest()}; the record names "
                    f"{info.size} bytes with sha256 {info.sha256}"
                )
            return info


_REPR_DIGEST = re.compile(r"sha-256=:([A-Za-z0-9+/=]+):")


def _object_info(resp: aiohttp.ClientResponse) -> ObjectInfo:
    """Size and digest of the whole object, from a 200 or a 206 (Content-Range's ``/size``)."""
    content_range = resp.headers.get("Content-Range", "")
    size = int(content_range.rpartition("/")[2]) if resp.status == 206 else int(resp.headers["Content-Length"])
    found = _REPR_DIGEST.search(resp.headers.get("Repr-Digest", ""))
    try:
        sha256 = base64.b64decode(found[1], validate=True).hex() if found else ""
    except binascii.Error:
        sha256 = ""
    if not sha256:
        raise ObjectDigestMismatch("the server named no sha-256 Repr-Digest for the object; nothing to check against")
    return ObjectInfo(resp.headers.get("Content-Type", "application/octet-stream"), size, sha256)


async def _problem_body(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    text = await resp.text(errors="replace")
    try:
        body = json.loads(text) if text else {}
    except json.JSONDecodeError:
        body = {"detail": (text.strip().splitlines() or [""])[0][:200]}
    return body if isinstance(body, dict) else {"detail": str(body)[:200]}


def _sha256_of(path: Path, chunk_size: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


async def _file_chunks(path: Path, chunk_size: int, progress: Callable[[int], None] | None) -> AsyncIterator[bytes]:
    sent = 0
    with path.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, chunk_size):
            sent += len(chunk)
            if progress is not None:
                progress(sent)
            yield chunk


__all__ = ["ProblemError", "StreamsClient"]
