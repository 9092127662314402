"""Stream heads for many streams in one query: what the head poller compares its watchers with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

# keys per query: bounded so one poll never builds a huge statement
_CHUNK = 5000


@dataclass(frozen=True)
class Head:
    last_sequence: int
    closed: bool


async def fetch(conn: asyncpg.Connection, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Head]:
    """The head of each existing stream among ``keys`` (deleted ones are absent)."""
    found: dict[tuple[str, str], Head] = {}
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        rows = await conn.fetch(
            """SELECT s.run_id, s.stream_id, s.last_sequence, s.closed_at IS NOT NULL AS closed
               FROM unnest($1::text[], $2::text[]) AS k(run_id, stream_id)
               JOIN wfs_streams s USING (run_id, stream_id)""",
            [run for run, _ in chunk],
            [stream for _, stream in chunk],
        )
        for r in rows:
            found[(r["run_id"], r["stream_id"])] = Head(r["last_sequence"], r["closed"])
    return found
