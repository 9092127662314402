"""Apply numbered SQL migrations once, safely when many pods start at the same time."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from . import (
    appends,  # noqa: F401  (imported, its statements register with db.kept: migrate makes their functions)
    db,
)

log = logging.getLogger(__name__)

# Any constant shared by all replicas; pg_advisory_xact_lock serializes concurrent runners.
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


async def apply_migrations(dsn: str, directory: Path | None = None, connecting: db.Connecting = db.DIRECT) -> list[int]:
    """Apply pending migrations in order; returns the versions this call applied.

    Each migration is one transaction that first takes a transaction-level advisory lock, so concurrent
    runners apply each migration once, in order, and nothing outlives a transaction: it works through a
    transaction pooler as on a direct connection (a session-level lock would be taken on one server
    connection and released on another)."""
    conn = await db.connect(dsn, connecting, "wfs-migrate")
    try:
        applied = []
        for migration in discover(directory):
            async with db.transaction(conn):
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
                await conn.execute(
                    """CREATE TABLE IF NOT EXISTS wfs_schema_migrations (
                           version integer PRIMARY KEY,
                           name text NOT NULL,
                           applied_at timestamptz NOT NULL DEFAULT now())"""
                )
                done = await conn.fetchval(
                    "SELECT EXISTS (SELECT FROM wfs_schema_migrations WHERE version = $1)", migration.version
                )
                if done:
                    continue
                await conn.execute(migration.path.read_text())
                await conn.execute(
                    "INSERT INTO wfs_schema_migrations (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            log.info("applied migration %04d_%s", migration.version, migration.name)
            applied.append(migration.version)
        if directory is None:  # this release's schema, whole: its statements can be kept as functions
            async with db.transaction(conn):
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
                await db.kept_functions(conn)
        return applied
    finally:
        await conn.close()
