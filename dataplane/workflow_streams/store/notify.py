"""Sending wake signals through Postgres NOTIFY: the only place that calls pg_notify.

Outside a transaction the notifications go out at once; inside one, Postgres delivers them only after
COMMIT, so a wake never precedes what it announces either way.
"""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg

from ..domain.wakes import CHANNEL, Signal, encode


async def send(conn: asyncpg.Connection, signals: Iterable[Signal], sender: str) -> None:
    payloads = encode(signals, sender)
    if payloads:
        # one statement, however many payloads: one round trip, one commit, one notify lock
        await conn.execute("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p", CHANNEL, payloads)
