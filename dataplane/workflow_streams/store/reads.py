"""Reading records after a cursor, consistently with the stream's bounds."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..domain.authz import Action, Principal, require
from ..domain.cursor import Bounds, check_cursor
from ..domain.errors import StreamNotFound
from ..domain.pins import StreamPins
from ..domain.placement import check_egress
from ..domain.records import is_json
from .definitions import pins_of


@dataclass(frozen=True)
class Page:
    records: list[asyncpg.Record]
    bounds: Bounds
    closed: bool
    pins: StreamPins
    pins_digest: str

    @property
    def next_after(self) -> int | None:
        return self.records[-1]["sequence"] if self.records else None


def record_json(row: asyncpg.Record) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sequence": row["sequence"],
        "kind": row["kind"],
        "content_type": row["content_type"],
        "size": row["size_bytes"],
        "appended_at": row["appended_at"].isoformat(),
    }
    if row["kind"] == "object":
        out["object"] = row["object"]
    elif is_json(row["content_type"]):
        out["data"] = json.loads(row["payload"])
    else:
        out["data_base64"] = base64.b64encode(row["payload"]).decode()
    return out


_CONTENT_TYPES: dict[str, bytes] = {}


def record_bytes(row: asyncpg.Record) -> bytes:
    """``record_json(row)`` as JSON bytes, splicing a JSON payload in as stored instead of decoding and
    re-encoding it (the largest cost of catch-up reads and fan-out)."""
    content_type = row["content_type"]
    quoted = _CONTENT_TYPES.get(content_type)
    if quoted is None:
        quoted = json.dumps(content_type).encode()
        if len(_CONTENT_TYPES) < 1000:
            _CONTENT_TYPES[content_type] = quoted
    head = (
        f'{{"sequence":{row["sequence"]},"kind":"{row["kind"]}","content_type":'.encode()
        + quoted
        + f',"size":{row["size_bytes"]},"appended_at":"{row["appended_at"].isoformat()}"'.encode()
    )
    if row["kind"] == "object":
        return head + b',"object":' + json.dumps(row["object"], separators=(",", ":")).encode() + b"}"
    if is_json(content_type):
        return head + b',"data":' + bytes(row["payload"]) + b"}"
    return head + b',"data_base64":"' + base64.b64encode(row["payload"]) + b'"}'


def page_bytes(page: Page, after: int) -> bytes:
    """The read response body."""
    next_after = page.next_after if page.next_after is not None else after
    tail = (
        f'],"next_after":{next_after},"earliest":{page.bounds.earliest},"latest":{page.bounds.latest},'
        f'"closed":{"true" if page.closed else "false"}}}'
    )
    return b'{"records":[' + b",".join(record_bytes(r) for r in page.records) + tail.encode()


async def fetch_page(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    after: int,
    limit: int,
    authorize: Callable[[StreamPins], None] | None = None,
) -> Page:
    """Records with sequence > after, ascending. ``authorize`` sees the pins before anything else is
    decided, so a caller without the right learns nothing, not even whether its cursor is valid.
    Bounds and records come from one snapshot: a concurrent prune can never become a silent gap."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        row = await conn.fetchrow(
            """SELECT pins_digest, pins, last_sequence, earliest_sequence, closed_at
               FROM wfs_streams WHERE run_id = $1 AND stream_id = $2""",
            run_id,
            stream_id,
        )
        if row is None:
            raise StreamNotFound("no such stream")
        pins = pins_of(row)
        if authorize is not None:
            authorize(pins)
        bounds = Bounds(earliest=row["earliest_sequence"], latest=row["last_sequence"])
        check_cursor(after, bounds)
        records = await conn.fetch(
            """SELECT sequence, kind, content_type, payload, size_bytes, object, appended_at
               FROM wfs_records WHERE run_id = $1 AND stream_id = $2 AND sequence > $3
               ORDER BY sequence LIMIT $4""",
            run_id,
            stream_id,
            after,
            limit,
        )
        return Page(list(records), bounds, row["closed_at"] is not None, pins, row["pins_digest"])


async def read_page(
    conn: asyncpg.Connection,
    run_id: str,
    stream_id: str,
    after: int,
    limit: int,
    principal: Principal,
    action: Action = "read",
    client_region: str | None = None,
) -> Page:
    """``fetch_page`` for ``principal``: its right, and its region against the egress pins."""

    def authorize(pins: StreamPins) -> None:
        require(pins.authorization, principal, action)
        if client_region is not None:
            check_egress(pins, client_region)

    return await fetch_page(conn, run_id, stream_id, after, limit, authorize)


class SharedReads:
    """Single-flight reads: subscribers of one stream woken together at the same cursor share one
    query instead of each asking Postgres (1,000 subscribers: one read per wake, not 1,000)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._inflight: dict[tuple[str, str, int, int], asyncio.Future[Page]] = {}

    async def page(self, run_id: str, stream_id: str, after: int, limit: int) -> Page:
        key = (run_id, stream_id, after, limit)
        shared = self._inflight.get(key)
        if shared is not None:
            return await asyncio.shield(shared)
        future: asyncio.Future[Page] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            async with self._pool.acquire() as conn:
                page = await fetch_page(conn, run_id, stream_id, after, limit)
            future.set_result(page)
            return page
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: others may or may not be waiting
            raise
        finally:
            del self._inflight[key]
