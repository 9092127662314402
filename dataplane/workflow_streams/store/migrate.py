"""Apply numbered SQL migrations once, safely when many pods start at the same time."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

log = logging.getLogger(__name__)

# Any constant shared by all replicas; pg_advisory_lock serializes concurrent runners.
_LOCK_KEY = 0x7766_7300_0476
_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path


def migrations_dir() -> Path:
    """Migrations ship inside the wheel; in a source checkout they are the top-level ``migrations/``."""
    packaged = Path(__file__).resolve().parent.parent / "_migrations"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[3] / "migrations"


def discover(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.fullmatch(path.name)
        if not match:
            raise ValueError(f"migration file name {path.name!r} is not NNNN_name.sql")
        found.append(Migration(int(match[1]), match[2], path))
    return found


async def apply_migrations(dsn: str, directory: Path | None = None) -> list[int]:
    """Apply pending migrations in order; returns the versions this call applied."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        try:
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS wfs_schema_migrations (
                       version integer PRIMARY KEY,
                       name text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM wfs_schema_migrations")}
            applied = []
            for migration in discover(directory):
                if migration.version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(migration.path.read_text())
                    await conn.execute(
                        "INSERT INTO wfs_schema_migrations (version, name) VALUES ($1, $2)",
                        migration.version,
                        migration.name,
                    )
                log.info("applied migration %04d_%s", migration.version, migration.name)
                applied.append(migration.version)
            return applied
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    finally:
        await conn.close()
