"""Reading records after a cursor, consistently with the stream's bounds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from ..domain.authz import Action, Principal, require
from ..domain.cursor import Bounds, check_cursor
from ..domain.errors import StreamNotFound
from ..domain.pins import StreamPins
from ..domain.placement import check_egress
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
    return await fetch_page(
        conn, run_id, stream_id, after, limit, lambda pins: authorize(pins, principal, action, client_region)
    )


def authorize(pins: StreamPins, principal: Principal, action: Action, client_region: str | None) -> None:
    """What every read checks: the principal's right, and its region against the egress pins."""
    require(pins.authorization, principal, action)
    if client_region is not None:
        check_egress(pins, client_region)
