"""A throwaway PostgreSQL cluster from the machine's own binaries (initdb / pg_ctl).

Used by ``workflow-streams dev`` and by the test suite. PostgreSQL refuses to run as root, so when
we are root the cluster belongs to the ``postgres`` system user and commands run through runuser.
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def find_bindir() -> Path | None:
    """Directory holding initdb and pg_ctl: $WFS_PG_BINDIR, PATH, or Debian's layout (newest first)."""
    if os.environ.get("WFS_PG_BINDIR"):
        return Path(os.environ["WFS_PG_BINDIR"])
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if candidates:
        return Path(candidates[-1]).parent
    try:  # a pip-installed server: the pgserver wheel ships PostgreSQL's binaries
        import pgserver  # type: ignore[import-not-found]
    except ImportError:
        return None
    bindir = Path(pgserver.__file__).parent / "pginstall" / "bin"
    return bindir if (bindir / "initdb").exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    def __init__(self, bindir: Path, base_dir: Path | None = None, port: int | None = None) -> None:
        self.bindir = bindir
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="wfs-pg-"))
        self.datadir = self.base_dir / "data"
        self.port = port or free_port()
        self._user = "postgres" if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def dsn_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._user:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True)

    def init(self) -> None:
        if self._user:
            entry = pwd.getpwnam(self._user)
            os.chown(self.base_dir, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--locale=C",
        )

    def server_options(self) -> list[str]:
        """The postgres command line's options, as pg_ctl hands them to a shell (for a setting given
        twice, the last ``-c`` wins)."""
        return [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            f"-k {shlex.quote(str(self.base_dir))}",
            "-c fsync=on -c max_connections=300 -c shared_buffers=128MB",
        ]

    def start(self) -> None:
        result = self._run(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-o",
            " ".join(self.server_options()),
            "-l",
            str(self.base_dir / "postgres.log"),
            "-w",
            "-t",
            "60",
            "start",
            check=False,
        )
        if result.returncode != 0:
            log_text = (self.base_dir / "postgres.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl start failed: {result.stderr}\n{log_text}")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "immediate") -> None:
        """Crash-like restart: with ``immediate`` Postgres recovers from WAL, as after a kill."""
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base_dir, ignore_errors=True)


async def execute(dsn: str, sql: str) -> None:
    """``sql`` on a connection of its own, closed after: for statements no transaction may hold
    (``CREATE DATABASE``, ``DROP DATABASE``)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def migrated_database(admin: str, name: str, dsn: str) -> str:
    """Database ``name``, made through ``admin`` (a DSN of another database on the same server) and
    migrated through ``dsn``, the way the data plane reaches it (plainly, by a multi-host DSN, through a
    pooler); returns ``dsn``."""
    from ..store.migrate import apply_migrations

    await execute(admin, f"CREATE DATABASE {name}")
    await apply_migrations(dsn)
    return dsn
