"""Production Postgres topologies as real local processes: PgBouncer in transaction pooling, a primary with a
streaming standby (synchronous or not), and a network partition between a namespace and Postgres.

Each shape is made from the machine's own binaries (Debian's postgresql, pgbouncer, iproute2 and iptables) as
platform teams run them; nothing is simulated. The controls are synchronous (subprocesses and psql), so the
fixtures and the test bodies can drive a shape without an event loop (an async test hands the slower ones,
a promotion or a crash restart, to ``asyncio.to_thread``). As root, the servers run as the ``postgres`` system
user, as LocalPostgres's clusters do. tests/topology_fixtures.py holds the pytest fixtures; bench uses
the same shapes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from workflow_streams.local.process import Process, wait_until, workflow_streams

from .postgres import LocalPostgres, free_port

RUNNING_AS_ROOT = os.geteuid() == 0
SERVICE_USER = "postgres"


def _chown_to_service_user(path: Path) -> None:
    if RUNNING_AS_ROOT:
        entry = pwd.getpwnam(SERVICE_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _as_service_user() -> list[str]:
    """The prefix that runs a server as the postgres user when we are root (nothing otherwise).

    setpriv, not runuser: runuser forks and waits for its child, so a SIGKILL would hit runuser and leave the
    server running; setpriv changes the credentials and execs, so the process we hold is the server itself.
    ``--pdeathsig`` because the parent-death signal is cleared when the credentials change: set again after
    the change, the server still dies with the test process instead of outliving an interrupted run.
    """
    if not RUNNING_AS_ROOT:
        return []
    return ["setpriv", f"--reuid={SERVICE_USER}", f"--regid={SERVICE_USER}", "--init-groups", "--pdeathsig=KILL", "--"]


def accepts_tcp(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts: it holds no sockets and no shared memory any more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


class ConfiguredPostgres(LocalPostgres):
    """A LocalPostgres with extra server settings, more listen addresses and more trusted client networks.

    The settings are given on the command line (``-c``), not written into the data directory, so that
    pg_basebackup does not copy a primary's settings (``synchronous_standby_names`` above all) into its standby:
    a promoted standby that inherited them would wait for a standby of its own on every commit.
    """

    def __init__(
        self,
        bindir: Path,
        base_dir: Path | None = None,
        port: int | None = None,
        *,
        settings: Mapping[str, str] | None = None,
        listen_addresses: Sequence[str] = ("127.0.0.1",),
        trusted_networks: Sequence[str] = (),
    ) -> None:
        super().__init__(bindir, base_dir, port)
        self.settings = dict(settings or {})
        self.listen_addresses = list(listen_addresses)
        self.trusted_networks = list(trusted_networks)

    @property
    def log_path(self) -> Path:
        return self.base_dir / "postgres.log"

    def log_text(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def init(self) -> None:
        super().init()
        self._trust_networks()

    def _trust_networks(self) -> None:
        if self.trusted_networks:
            with (self.datadir / "pg_hba.conf").open("a") as hba:
                for network in self.trusted_networks:
                    hba.write(f"host all all {network} trust\n")

    def server_options(self) -> list[str]:
        listen = f"-c listen_addresses={','.join(self.listen_addresses)}"
        settings = [f"-c {shlex.quote(f'{name}={value}')}" for name, value in self.settings.items()]
        return [*super().server_options(), listen, *settings]

    def query(self, sql: str, database: str = "postgres", *, timeout: float = 30.0) -> str:
        """The result of ``sql`` through psql: one line per row, columns separated by ``|``."""
        result = subprocess.run(
            [
                str(self.bindir / "psql"),
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql on port {self.port} failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def accepts_writes(self) -> bool:
        """Whether the server is up and out of recovery (a primary, or a standby whose promotion is done)."""
        try:
            return self.query("SELECT pg_is_in_recovery()", timeout=5) == "f"
        except (RuntimeError, subprocess.TimeoutExpired):
            return False

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None

    def crash_restart(self) -> None:
        """``pg_ctl stop -m immediate``, then start: no shutdown checkpoint, so the start runs crash recovery
        and replays every commit in the WAL, whether or not a synchronous standby acknowledged it."""
        self.restart("immediate")

    def kill(self) -> None:
        """SIGKILL of the postmaster and every backend, as when the machine under it dies; for good (``start``
        would bring it back with crash recovery). Returns when none of them is left."""
        pid = self.postmaster_pid()
        if pid is None or _process_gone(pid):
            return
        children = _children(pid)
        # The postmaster first: alive, it would notice its children dying and start recovery.
        for victim in [pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: all(_process_gone(p) for p in [pid, *children]),
            seconds=30,
            what=f"the processes of the cluster on port {self.port}",
        )


def multi_host_dsn(clusters: Sequence[LocalPostgres], database: str, *, target: str = "read-write") -> str:
    """``postgresql://postgres@h1:p1,h2:p2/db?target_session_attrs=read-write``: libpq's (and asyncpg's) way of
    following a failover, trying each host in turn for one that accepts writes."""
    hosts = ",".join(f"127.0.0.1:{cluster.port}" for cluster in clusters)
    return f"postgresql://postgres@{hosts}/{database}?target_session_attrs={target}"


def primary_settings(standby_name: str | None) -> dict[str, str]:
    """A primary that streams to standbys; with ``standby_name`` every commit waits until that standby has
    flushed it (``synchronous_commit=on``), without one commits return without waiting (asynchronous)."""
    settings = {
        "wal_level": "replica",
        "max_wal_senders": "10",
        "max_replication_slots": "10",
        "hot_standby": "on",
        "synchronous_commit": "on",
    }
    if standby_name is not None:
        settings["synchronous_standby_names"] = standby_name
    return settings


class Standby(ConfiguredPostgres):
    """A streaming standby of ``primary``, made with ``pg_basebackup -R`` and a physical replication slot.

    It connects as ``application_name=<name>``, the name a synchronous primary's ``synchronous_standby_names``
    lists. ``init`` makes the copy (the primary must be running); ``start``, ``stop``, ``kill`` and
    ``crash_restart`` are the cluster's own; ``promote`` turns it into a primary.
    """

    def __init__(
        self,
        primary: ConfiguredPostgres,
        name: str = "standby1",
        *,
        base_dir: Path | None = None,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(primary.bindir, base_dir, port, settings=settings)
        self.primary = primary
        self.name = name
        self.conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={name}"

    def init(self) -> None:
        _chown_to_service_user(self.base_dir)
        result = self._run(
            "pg_basebackup",
            "-D",
            str(self.datadir),
            "-R",  # standby.signal and primary_conninfo: it starts as a standby of the primary
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-c",
            "fast",  # an immediate checkpoint, not one spread over checkpoint_timeout
            "-C",
            "-S",
            self.name,  # a slot: the primary keeps the WAL this standby has not received, however long it is away
            "--no-sync",
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {result.stderr}")
        # pg_basebackup's primary_conninfo names no application, and the synchronous primary knows its standby by
        # that name; in postgresql.auto.conf the last line of a setting wins.
        with (self.datadir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{self.conninfo}'\n")

    def replication_state(self) -> tuple[str, str] | None:
        """(state, sync_state) of this standby's walsender on the primary, None when it is not connected."""
        try:
            row = self.primary.query(
                f"SELECT state, sync_state FROM pg_stat_replication WHERE application_name = '{self.name}'",
                timeout=5,
            )
        except (RuntimeError, subprocess.TimeoutExpired):
            return None
        if not row:
            return None
        state, sync_state = row.split("\n", 1)[0].split("|")
        return state, sync_state

    def wait_streaming(self, *, seconds: float = 60.0) -> None:
        """Until the primary streams to this standby."""
        wait_until(
            lambda: (self.replication_state() or ("", ""))[0] == "streaming",
            seconds=seconds,
            what=f"streaming to {self.name}",
            describe=self.log_text,
        )

    def pause_replication(self) -> None:
        """Cut the stream while the standby stays up (and readable): its primary_conninfo is emptied and
        reloaded, so the walreceiver ends and does not reconnect, as when the network between them fails.
        ``pg_wal_replay_pause()`` would not do: the walreceiver still flushes, and a synchronous commit waits
        for the flush, not the replay. Returns once the primary has no walsender for this standby."""
        self.query("ALTER SYSTEM SET primary_conninfo = ''")
        self.query("SELECT pg_reload_conf()")
        wait_until(
            lambda: self.replication_state() is None,
            seconds=30,
            what=f"the primary's walsender for {self.name} to end",
            describe=self.log_text,
        )

    def resume_replication(self, *, seconds: float = 60.0) -> None:
        """Reconnect the walreceiver; returns once the primary streams to this standby again."""
        self.query(f"ALTER SYSTEM SET primary_conninfo = '{self.conninfo}'")
        self.query("SELECT pg_reload_conf()")
        self.wait_streaming(seconds=seconds)

    def promote(self, *, seconds: float = 60.0) -> None:
        """``pg_ctl promote``, then until it accepts writes (``pg_is_in_recovery()`` is false)."""
        result = self._run("pg_ctl", "-D", str(self.datadir), "-w", "-t", str(int(seconds)), "promote", check=False)
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl promote failed: {result.stderr}\n{self.log_text(2000)}")
        wait_until(self.accepts_writes, seconds=seconds, what=f"{self.name} to accept writes", describe=self.log_text)


class Replication:
    """A primary and one streaming standby, synchronous (commits wait until the standby has flushed them) or
    asynchronous. ``start`` makes both and returns when the standby streams (as ``sync`` when synchronous).

    Faults: ``primary.crash_restart()``, ``primary.kill()`` (for good), ``standby.pause_replication()`` /
    ``resume_replication()`` (the stream cut with the standby up), ``standby.stop()`` / ``start()`` (the standby
    down), ``standby.promote()``. ``dsn_for`` is the multi-host DSN that follows a failover.
    """

    def __init__(self, bindir: Path, *, synchronous: bool = True, standby_name: str = "standby1") -> None:
        self.synchronous = synchronous
        self.primary = ConfiguredPostgres(bindir, settings=primary_settings(standby_name if synchronous else None))
        self.standby = Standby(self.primary, standby_name)

    def start(self) -> None:
        try:
            self.primary.init()
            self.primary.start()
            self.standby.init()
            self.standby.start()
            self.standby.wait_streaming()
            if self.synchronous:
                wait_until(
                    lambda: self.standby.replication_state() == ("streaming", "sync"),
                    seconds=30,
                    what=f"{self.standby.name} as the synchronous standby",
                )
        except BaseException:
            self.destroy()
            raise

    def dsn_for(self, database: str) -> str:
        """The DSN a deployment gives its clients: both hosts, the one that accepts writes wins."""
        return multi_host_dsn([self.primary, self.standby], database)

    def destroy(self) -> None:
        for cluster in (self.standby, self.primary):
            cluster.destroy()


class PgBouncer:
    """Debian's pgbouncer in front of ``postgres``, with a stock ini apart from what a test needs: transaction
    pooling (unless ``pool_mode`` says otherwise), trust authentication of the user ``postgres``, every database
    forwarded (``* =``), a free port on 127.0.0.1. ``extra`` adds [pgbouncer] settings (none by default: the
    point is to meet PgBouncer as a platform team deploys it)."""

    def __init__(
        self,
        postgres: LocalPostgres,
        *,
        port: int | None = None,
        pool_mode: str = "transaction",
        extra: Mapping[str, str] | None = None,
        binary: str | None = None,
    ) -> None:
        self.postgres = postgres
        self.port = port or free_port()
        # /usr/sbin is not on every PATH (a non-root shell's), and it is where Debian puts pgbouncer
        self.binary = binary or shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        self.dir = Path(tempfile.mkdtemp(prefix="wfs-pgbouncer-"))
        _chown_to_service_user(self.dir)  # pgbouncer writes its log and pidfile here
        self.ini = self.dir / "pgbouncer.ini"
        self.logfile = self.dir / "pgbouncer.log"
        self.pidfile = self.dir / "pgbouncer.pid"
        (self.dir / "userlist.txt").write_text('"postgres" ""\n')
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.dir / "userlist.txt"),  # trust still admits only the users listed here
            "pool_mode": pool_mode,
            "logfile": str(self.logfile),
            "pidfile": str(self.pidfile),
            **(extra or {}),
        }
        self.ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={postgres.port}\n\n"
            "[pgbouncer]\n" + "".join(f"{name} = {value}\n" for name, value in settings.items())
        )
        self.process: Process | None = None

    @staticmethod
    def installed(binary: str | None = None) -> bool:
        return Path(binary or shutil.which("pgbouncer") or "/usr/sbin/pgbouncer").exists()

    def dsn_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def start(self, *, seconds: float = 30.0) -> None:
        """Start it and return once it accepts TCP connections (it connects to Postgres per client, later)."""
        if self.running():
            raise RuntimeError("pgbouncer is already running")
        # A SIGKILLed pgbouncer leaves its pidfile; pgbouncer would check whether that pid lives, and a reused
        # pid would stop it from starting.
        self.pidfile.unlink(missing_ok=True)
        self.process = Process(
            [*_as_service_user(), self.binary, str(self.ini)], log=self.dir / "pgbouncer.out", name="pgbouncer"
        )
        wait_until(
            lambda: accepts_tcp("127.0.0.1", self.port),
            seconds=seconds,
            alive=self.process.running,
            describe=self.log_text,
            what="pgbouncer",
        )

    def kill(self) -> None:
        """SIGKILL, as a crash: every client connection breaks at once, nothing is closed cleanly."""
        if self.process is not None:
            self.process.kill()

    def restart(self, *, seconds: float = 30.0) -> None:
        """Kill, then start on the same port (the address clients were given)."""
        self.kill()
        self._close()
        self.start(seconds=seconds)

    def stop(self) -> None:
        """Stop it (SIGTERM: pgbouncer's immediate shutdown) and remove its directory."""
        if self.process is not None:
            self.process.stop(signal.SIGTERM, grace=10)
            self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def _close(self) -> None:
        if self.process is not None:
            self.process.stop(grace=1)  # already dead: closes the log
            self.process = None

    def log_text(self, chars: int = 4000) -> str:
        """pgbouncer's own output, across restarts (its logfile holds the same lines)."""
        try:
            return (self.dir / "pgbouncer.out").read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


# Network namespaces are named after the creating process, so that a later run can remove those of a run that
# was killed before its teardown (and leave those of processes still running alone).
_NAME_PREFIX = "wfs"
_instances = itertools.count()
_SUBNETS = 1 << 14  # /30 subnets in 10.231.0.0/16


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _addresses_in_use() -> set[str]:
    result = _ip("-4", "-o", "addr", "show", check=False)
    return {line.split()[3].split("/")[0] for line in result.stdout.splitlines() if len(line.split()) > 3}


def _pid_alive(pid: int) -> bool:
    return not _process_gone(pid)


def _owner_pid(token: str) -> int | None:
    """The pid in a name this module made (``<pid hex>x<n hex>``), None for other names."""
    pid_hex, separator, instance = token.partition("x")
    if not separator:
        return None
    try:
        int(instance, 16)
        return int(pid_hex, 16)
    except ValueError:
        return None


def _dotted(address: int) -> str:
    return socket.inet_ntoa(address.to_bytes(4, "big"))


@functools.cache
def _probe_namespaces() -> tuple[bool, str]:
    if not RUNNING_AS_ROOT:
        return False, "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return False, f"{tool} is not installed (scripts/bootstrap installs iproute2 and iptables)"
    name = f"{_NAME_PREFIX}-probe-{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return False, f"ip netns add failed: {made.stderr.strip()}"
    try:
        listed = subprocess.run(
            ["ip", "netns", "exec", name, "iptables", "-w", "-L", "OUTPUT", "-n"], capture_output=True, text=True
        )
        if listed.returncode != 0:
            return False, f"iptables does not work in a network namespace: {listed.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return True, ""


class Partition:
    """A network namespace joined to the host by a veth pair on a private /30, and a switch that cuts TCP to
    and from one port (Postgres's) inside it.

    The host end has ``host_address``, the namespace end ``ns_address``. Postgres must listen on
    ``host_address`` and trust ``subnet``: ``postgres_for`` makes such a cluster (listen_addresses
    ``127.0.0.1,<host_address>``, a pg_hba line for the /30), which must start after ``create`` (an address can
    only be bound once it exists). A process started with ``popen`` (or ``netns_argv``) runs inside the
    namespace and reaches Postgres at ``dsn_for(database)``; the host reaches a server it runs at
    ``url(port)``, also while cut, since only the Postgres port is dropped.

    ``cut`` appends iptables DROP rules inside the namespace (OUTPUT --dport and INPUT --sport): packets vanish,
    so connects and queries hang until their timeouts, as in a real partition (a REJECT would fail them fast).
    ``heal`` deletes the rules. ``teardown`` (also on leaving a ``with``) stops the processes started here and
    removes the namespace and the veth pair, whatever failed before.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self._instance = next(_instances)
        token = f"{os.getpid():x}x{self._instance:x}"
        self.name = f"{_NAME_PREFIX}-{token}"
        self.host_interface = f"{_NAME_PREFIX}{token}h"  # interface names have at most 15 characters
        self.ns_interface = f"{_NAME_PREFIX}{token}n"
        self.host_address = ""
        self.ns_address = ""
        self.subnet = ""
        self.is_cut = False
        self._processes: list[Process] = []
        self._created = False

    @staticmethod
    def available() -> tuple[bool, str]:
        """(True, "") when namespaces can be made here (root, iproute2 and iptables present, ``ip netns add``
        works); else (False, why) for a skip."""
        return _probe_namespaces()

    def create(self) -> None:
        self._created = True
        try:
            self._sweep_stale()
            self._pick_subnet()
            _ip("netns", "add", self.name)
            _ip("link", "add", self.host_interface, "type", "veth", "peer", "name", self.ns_interface)
            _ip("link", "set", self.ns_interface, "netns", self.name)
            _ip("addr", "add", f"{self.host_address}/30", "dev", self.host_interface)
            _ip("link", "set", self.host_interface, "up")
            self._in_ns("ip", "addr", "add", f"{self.ns_address}/30", "dev", self.ns_interface)
            self._in_ns("ip", "link", "set", self.ns_interface, "up")
            self._in_ns("ip", "link", "set", "lo", "up")
        except BaseException:
            self.teardown()
            raise

    def _pick_subnet(self) -> None:
        in_use = _addresses_in_use()
        first = (os.getpid() * 64 + self._instance) % _SUBNETS
        for offset in range(_SUBNETS):
            index = (first + offset) % _SUBNETS
            base = (10 << 24) | (231 << 16) | (index * 4)
            host, ns = _dotted(base + 1), _dotted(base + 2)
            if host not in in_use and ns not in in_use:
                self.host_address, self.ns_address, self.subnet = host, ns, f"{_dotted(base)}/30"
                return
        raise RuntimeError("no free /30 in 10.231.0.0/16")

    @staticmethod
    def _sweep_stale() -> None:
        """Remove the namespaces and veths of runs whose process is gone (killed before their teardown)."""
        names = _ip("netns", "list", check=False).stdout.split()
        links = [
            line.split(":")[1].strip().split("@")[0]
            for line in _ip("-o", "link", "show", check=False).stdout.splitlines()
        ]
        for name in names:
            if name.startswith(f"{_NAME_PREFIX}-"):
                pid = _owner_pid(name.removeprefix(f"{_NAME_PREFIX}-"))
                if pid is not None and not _pid_alive(pid):
                    _ip("netns", "del", name, check=False)
        for link in links:
            if link.startswith(_NAME_PREFIX) and link.endswith("h"):
                pid = _owner_pid(link.removeprefix(_NAME_PREFIX).removesuffix("h"))
                if pid is not None and not _pid_alive(pid):
                    _ip("link", "del", link, check=False)

    def _in_ns(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.netns_argv(*argv), capture_output=True, text=True, check=True)

    def netns_argv(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: the pid is the command's own)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: Sequence[str], *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the namespace to its end; output captured, the status not checked."""
        return subprocess.run(self.netns_argv(*argv), capture_output=True, text=True, timeout=timeout)

    def popen(
        self, argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None, name: str | None = None
    ) -> Process:
        """Start ``argv`` inside the namespace, as a Process (output in ``log``); stopped by ``teardown``."""
        process = Process(self.netns_argv(*argv), log=log, env=env, name=name or Path(argv[0]).name)
        self._processes.append(process)
        return process

    def url(self, port: int, path: str = "") -> str:
        """How the host reaches an HTTP server listening on ``ns_address:port`` inside the namespace."""
        return f"http://{self.ns_address}:{port}{path}"

    def dsn_for(self, database: str) -> str:
        """How a process inside the namespace reaches Postgres on the host end."""
        return f"postgresql://postgres@{self.host_address}:{self.port}/{database}"

    def postgres_for(self, bindir: Path, *, settings: Mapping[str, str] | None = None) -> ConfiguredPostgres:
        """A cluster (not yet initialised) on ``port``, listening on 127.0.0.1 and the host end, trusting the
        namespace's /30."""
        if not self.host_address:
            raise RuntimeError("create() the partition first: Postgres can bind the host end only once it exists")
        return ConfiguredPostgres(
            bindir,
            port=self.port,
            listen_addresses=["127.0.0.1", self.host_address],
            trusted_networks=[self.subnet],
            settings=settings,
        )

    def _rules(self) -> list[list[str]]:
        return [
            ["OUTPUT", "-p", "tcp", "--dport", str(self.port), "-j", "DROP"],
            ["INPUT", "-p", "tcp", "--sport", str(self.port), "-j", "DROP"],
        ]

    def cut(self) -> None:
        """Drop every TCP packet to and from the Postgres port inside the namespace (established connections
        included)."""
        if self.is_cut:
            return
        for rule in self._rules():
            self._in_ns("iptables", "-w", "-A", *rule)
        self.is_cut = True

    def heal(self) -> None:
        """Delete the DROP rules; connections that survived the cut resume after TCP's retransmission backoff."""
        if not self.is_cut:
            return
        for rule in self._rules():
            self._in_ns("iptables", "-w", "-D", *rule)
        self.is_cut = False

    def teardown(self) -> None:
        """Stop the processes started here, remove the namespace and the veth pair; never raises, and leaves
        nothing behind whatever state creation reached."""
        for process in self._processes:
            with contextlib.suppress(Exception):  # the namespace must go whatever a process did
                process.stop(grace=5)
        self._processes.clear()
        if not self._created:
            return
        # Deleting the namespace destroys its end of the pair and so the pair; the host end is deleted too in
        # case creation stopped before the other end was moved into the namespace.
        _ip("netns", "del", self.name, check=False)
        _ip("link", "del", self.host_interface, check=False)
        self._created = False
        self.is_cut = False

    def exists(self) -> bool:
        """Whether the namespace or the host end of the veth pair is still there."""
        in_list = self.name in _ip("netns", "list", check=False).stdout.split()
        return in_list or _ip("link", "show", self.host_interface, check=False).returncode == 0

    def __enter__(self) -> Partition:
        self.create()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.teardown()


class ServeInNamespace:
    """``workflow-streams serve`` inside ``partition``'s namespace, configured as tests/replica.py's Replica: it
    listens on the namespace's address (``WFS_HOST``), reaches Postgres through the veth pair (so ``cut`` parts
    it from the database), and the test process reaches it at ``base``. Stopped by ``stop``, and in any case
    by the partition's teardown."""

    def __init__(
        self, partition: Partition, database: str, log_path: Path, port: int | None = None, **env_overrides: str
    ) -> None:
        self.port = port or free_port()
        env = {
            **os.environ,
            "WFS_DATABASE_URL": partition.dsn_for(database),
            "WFS_HOST": partition.ns_address,
            "WFS_PORT": str(self.port),
            "WFS_TOKENS": json.dumps({"tok-alice": "alice"}),
            "WFS_PRUNE_INTERVAL_SECONDS": "0",
            "WFS_WORKERS": "1",  # one process, so kill() is a crash of the whole replica
            **env_overrides,
        }
        self.process = partition.popen(workflow_streams("serve"), log=log_path, env=env, name="serve-in-namespace")
        self.base = partition.url(self.port)

    async def ready(self, *, seconds: float = 30.0) -> None:
        """Until /readyz answers 200 (asked from the host, through the veth pair)."""
        await self.process.ready(f"{self.base}/readyz", seconds=seconds)

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop(grace=10)


def tcp_connect_from(partition: Partition, host: str, port: int, *, timeout: float = 1.5) -> str:
    """Try a TCP connect from inside the namespace: "connected", "timeout" or "refused" (or another error's
    name)."""
    script = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {port}), timeout={timeout}).close()\n"
        "    print('connected')\n"
        "except TimeoutError:\n"
        "    print('timeout')\n"
        "except ConnectionRefusedError:\n"
        "    print('refused')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    result = partition.run([sys.executable, "-c", script], timeout=timeout + 30)
    if result.returncode != 0:
        raise RuntimeError(f"the connect probe failed: {result.stderr}")
    return result.stdout.strip()
