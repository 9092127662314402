"""Gap evidence: a subscriber saw the wake signals skip ahead of what it had read."""

from __future__ import annotations

import asyncpg


async def record_gap(
    conn: asyncpg.Connection, run_id: str, stream_id: str, expected: int, observed: int, detected_by: str
) -> None:
    await conn.execute(
        """INSERT INTO wfs_gap_evidence (run_id, stream_id, expected_sequence, observed_sequence, detected_by)
           VALUES ($1, $2, $3, $4, $5)""",
        run_id,
        stream_id,
        expected,
        observed,
        detected_by,
    )
