"""What the WAL says about durability: the timeline a statement runs on, and barrier commits
(``runtime.durability`` uses both).

A barrier is a one-row write whose COMMIT, once returned, shows that everything before it in the WAL of
its timeline is as durable as an acknowledged append. A commit waits for the synchronous standby only if
it wrote WAL under a transaction id: a read-only transaction, or one that only took an id, commits without
waiting, and would prove nothing. So a barrier updates a row. Processes spread over ``SLOTS`` rows
(migration 486), so that they rarely wait for each other's row lock.

The timeline tells WAL histories apart: a promoted standby starts a new one, and a commit on it says
nothing about what was read on the primary it replaced. (A crash restart keeps the timeline, and its WAL
holds everything read before.) ``TIMELINE`` is the current one, as the first eight hex digits of the
current WAL file's name; it is evaluated by the statement whose result it describes, so a pooler that
moves a client between servers cannot mix them up. A server in recovery refuses it, as it refuses writes.
"""

from __future__ import annotations

import asyncpg

SLOTS = 64

TIMELINE = "substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8)"


async def barrier(conn: asyncpg.Connection, slot: int) -> str:
    """One barrier, in its own transaction (outside any: the statement commits as it returns); returns
    its timeline."""
    timeline: str = await conn.fetchval(
        f"UPDATE wfs_barriers SET commits = commits + 1 WHERE slot = $1 RETURNING {TIMELINE}", slot
    )
    return timeline
