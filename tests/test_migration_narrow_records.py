"""Migration 482 (the narrow record row) moves the records a database already holds: each reads back as
it did under the 0476 row, on its stream, and what the dropped columns said is computed the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import TEMPLATE, create_database
from tests.support import pins
from workflow_streams.domain.pins import StreamPins
from workflow_streams.local.postgres import LocalPostgres
from workflow_streams.store.migrate import apply_migrations, discover
from workflow_streams.store.reads import RECORD_COLUMNS

OBJECT = {"region": "eu-west-1", "bucket": "b", "key": "k/1", "size": 70_000, "sha256": "00"}


async def test_existing_records_are_moved_and_read_back_unchanged(pg: LocalPostgres, tmp_path: Path) -> None:
    before = tmp_path / "before"
    before.mkdir()
    for migration in discover():
        if migration.version < 482:
            shutil.copy(migration.path, before / migration.path.name)
    dsn = await create_database(pg, template=None)
    assert 482 not in await apply_migrations(dsn, before)
    stream_pins = StreamPins.model_validate(pins())
    conn = await asyncpg.connect(dsn)
    try:
        # two streams whose records interleave in the old key order, an inline and an object record
        await conn.execute(
            """INSERT INTO wfs_streams (run_id, stream_id, pins, pins_digest, created_by, last_sequence)
               SELECT 'r', s, $1::jsonb, $2, 'alice', 2 FROM unnest(ARRAY['b', 'a']) AS s""",
            json.dumps(stream_pins.stored()),
            stream_pins.digest(),
        )
        await conn.execute(
            """INSERT INTO wfs_records (run_id, stream_id, sequence, kind, content_type, payload, size_bytes,
                                        cumulative_bytes, object, appended_by, appended_at)
               VALUES ('r', 'a', 1, 'inline', 'application/json', '"a1"', 4, 4, NULL, 'alice', '2026-01-01Z'),
                      ('r', 'a', 2, 'object', 'image/png', NULL, 70000, 70004, $1::jsonb, 'bob', '2026-01-02Z'),
                      ('r', 'b', 1, 'inline', 'text/plain', 'b', 1, 1, NULL, 'carol', '2026-01-03Z'),
                      ('r', 'b', 2, 'inline', 'text/plain', '', 0, 1, NULL, 'carol', '2026-01-04Z')""",
            json.dumps(OBJECT),
        )
        # the 0476 row's own kind and size_bytes: what the new row computes must say the same
        wanted = [
            tuple(r)
            for r in await conn.fetch(
                """SELECT run_id, stream_id, sequence, kind, content_type, payload, size_bytes, object, appended_at,
                          cumulative_bytes, appended_by
                   FROM wfs_records ORDER BY 1, 2, 3"""
            )
        ]
        assert len(wanted) == 4 and wanted[1][3] == "object" and wanted[1][6] == 70_000

        assert (await apply_migrations(dsn))[:1] == [482]  # and any later ones

        moved = await conn.fetch(
            f"""SELECT s.run_id, s.stream_id, {RECORD_COLUMNS}, r.cumulative_bytes, r.appended_by
                FROM wfs_records r JOIN wfs_streams s USING (stream_key) ORDER BY 1, 2, 3"""
        )
        assert [tuple(r) for r in moved] == wanted
        assert await conn.fetchval("SELECT to_regclass('wfs_records_0476')") is None
        # the row keeps its rule: exactly one of payload and object
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                """INSERT INTO wfs_records (stream_key, sequence, cumulative_bytes, content_type, appended_by)
                   SELECT stream_key, 3, 5, 'text/plain', 'alice' FROM wfs_streams WHERE stream_id = 'a'"""
            )
    finally:
        await conn.close()


async def test_the_template_database_has_the_narrow_row(pg: LocalPostgres) -> None:
    """What every other test runs against: the row 482 made, with no name or kind columns left."""
    conn = await asyncpg.connect(pg.dsn_for(TEMPLATE))
    try:
        columns = await conn.fetch(
            """SELECT attname FROM pg_attribute WHERE attrelid = 'wfs_records'::regclass AND attnum > 0
               AND NOT attisdropped ORDER BY attnum"""
        )
    finally:
        await conn.close()
    assert [c["attname"] for c in columns] == [
        "stream_key",
        "sequence",
        "cumulative_bytes",
        "appended_at",
        "content_type",
        "appended_by",
        "payload",
        "object",
    ]
