"""pytest fixtures for the production topologies (workflow_streams.local.topologies), each torn down
whatever the test did. tests/conftest.py loads them for every test file (``pytest_plugins``). Every
fixture is per test: the tests that use these shapes break them on purpose."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workflow_streams.local.postgres import LocalPostgres, find_bindir, free_port
from workflow_streams.local.topologies import ConfiguredPostgres, Partition, PgBouncer, Replication


def _bindir() -> Path:
    bindir = find_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL binaries not found: .ci/run installs them (apt-get install postgresql)")
    return bindir


@pytest.fixture
def pgbouncer(pg: LocalPostgres) -> Iterator[PgBouncer]:
    """Stock PgBouncer in transaction pooling in front of the session's cluster (``pg``), started."""
    if not PgBouncer.installed():
        pytest.fail("pgbouncer is not installed: scripts/bootstrap installs Debian's")
    bouncer = PgBouncer(pg)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()


def _replication(synchronous: bool) -> Iterator[Replication]:
    pair = Replication(_bindir(), synchronous=synchronous)
    pair.start()  # destroys what it made if it fails
    try:
        yield pair
    finally:
        pair.destroy()


@pytest.fixture
def sync_replication() -> Iterator[Replication]:
    """A primary whose commits wait for its one standby (``synchronous_standby_names``), streaming as ``sync``."""
    yield from _replication(synchronous=True)


@pytest.fixture
def async_replication() -> Iterator[Replication]:
    """A primary with one asynchronous standby: commits return before the standby has them."""
    yield from _replication(synchronous=False)


@pytest.fixture
def partition() -> Iterator[Partition]:
    """A network namespace wired to the host, to cut from the Postgres port of ``partitioned_pg`` (skipped
    where namespaces cannot be made)."""
    ok, reason = Partition.available()
    if not ok:
        pytest.skip(f"no network namespaces: {reason}")
    with Partition(port=free_port()) as made:
        yield made


@pytest.fixture
def partitioned_pg(partition: Partition) -> Iterator[ConfiguredPostgres]:
    """A cluster on ``partition.port`` listening on 127.0.0.1 and the partition's host end, trusting its /30."""
    cluster = partition.postgres_for(_bindir())
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
