"""Shared fixtures: a real throwaway PostgreSQL cluster, a migrated template, an app per test."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from aiobotocore.session import get_session
from aiohttp.test_utils import TestClient

from tests.controlplane import CACHE_BIN, ControlPlane, KindPlane, binaries_present, kind_available
from tests.minio import ACCESS_KEY, SECRET_KEY, MinioServer, minio_binary
from tests.node import FIGURES, NodeCluster, leftovers, why_unavailable
from tests.support import TOKENS, StreamsApi
from workflow_streams.adapters.config import Settings
from workflow_streams.adapters.objectstore import RegionConfig
from workflow_streams.local.postgres import LocalPostgres, execute, find_bindir, migrated_database
from workflow_streams.shells.compose import create_app

# the production shapes (PgBouncer, a standby, a network partition) as fixtures
pytest_plugins = ["tests.topology_fixtures"]

TEMPLATE = "wfs_template"
REPO = Path(__file__).resolve().parents[1]

# Fixtures that start or reach a service (Postgres, S3, Kubernetes, a server): a test marked ``unit`` uses
# none of them, so `pytest -m unit` runs in seconds on a machine with nothing installed (scripts/test
# runs it first: a broken rule fails before anything starts).
SERVICE_FIXTURES = frozenset(
    {
        "pg", "own_pg", "database_url", "db", "client", "api", "aiohttp_client", "aiohttp_server", "minio",
        "s3", "s3_regions", "node_cluster", "kube", "namespace", "pgbouncer", "sync_replication",
        "async_replication", "partition", "partitioned_pg",
    }
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        services = SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if services and item.get_closest_marker("unit") is not None:
            raise pytest.UsageError(f"{item.nodeid} is marked unit but uses {', '.join(sorted(services))}")


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def pg() -> Iterator[LocalPostgres]:
    # pg_ctl starts Postgres as a daemon: a run ended by SIGTERM (a CI or `timeout` deadline) left its
    # cluster running. As an interrupt, pytest still tears the session down, and the cluster with it.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    bindir = find_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL binaries not found: .ci/run installs them (apt-get install postgresql)")
    cluster = LocalPostgres(bindir)
    cluster.init()
    cluster.start()

    asyncio.run(migrated_database(cluster.dsn, TEMPLATE, cluster.dsn_for(TEMPLATE)))
    yield cluster
    cluster.destroy()


async def create_database(pg: LocalPostgres, template: str | None = TEMPLATE) -> str:
    """A fresh database cloned from the migrated template (cheap: a file copy, no migration run), or an
    empty one with ``template=None`` (for tests that apply migrations themselves)."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    await execute(pg.dsn, f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    return pg.dsn_for(name)


@pytest.fixture
async def database_url(pg: LocalPostgres) -> str:
    return await create_database(pg)


def make_settings(database_url: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "database_url": database_url,
        "tokens": TOKENS,
        "region": "eu-west-1",  # the region the test streams pin for client egress and logs
        "prune_interval_seconds": 0,
        "sse_heartbeat_seconds": 1.0,
        # WFS_TEST_WAKE_SOURCE=poll runs a test file with LISTEN disabled (see test_wakes_group_commit)
        "wake_source": os.environ.get("WFS_TEST_WAKE_SOURCE", "listen"),
    }
    return Settings(**{**base, **overrides})


@pytest.fixture
def settings_for() -> Callable[..., Settings]:
    return make_settings


@pytest.fixture
async def client(aiohttp_client: Any, database_url: str) -> TestClient:
    return await aiohttp_client(create_app(make_settings(database_url)))


@pytest.fixture
def api(client: TestClient) -> StreamsApi:
    return StreamsApi(client)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A direct SQL connection, for asserting what is durable."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest.fixture(scope="session")
def minio() -> Iterator[MinioServer]:
    binary = minio_binary()
    if binary is None:
        pytest.fail("MinIO is not built: scripts/bootstrap builds it from its Go module")
    server = MinioServer(binary)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_regions(minio: MinioServer) -> dict[str, RegionConfig]:
    """A fresh Object Lock bucket per test for the pinned object region."""
    bucket = f"wfs-{uuid.uuid4().hex[:12]}"
    return {
        "eu-west-1": RegionConfig(
            endpoint_url=minio.endpoint,
            bucket=bucket,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            create_bucket=True,
        )
    }


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[NodeCluster]:
    """The one-node cluster that runs pods (tests/node.py), once per session; its teardown undoes every
    host change and fails the session if anything is left."""
    reason = why_unavailable()
    if reason is not None and reason.startswith("the one-node cluster needs root"):
        pytest.skip(reason)
    if reason is not None:
        pytest.fail(reason)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a deadline's SIGTERM still tears it down
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    node = NodeCluster()
    node.start()
    FIGURES.append(f"one-node cluster: node Ready {node.timings['node Ready']:.1f} s after start")
    yield node
    journal = dict(node.journal.data)
    node.stop()
    left = leftovers(journal)
    assert not left, f"the one-node cluster left host changes behind: {left}"


@pytest.fixture(scope="session", params=["envtest", pytest.param("node", marks=[pytest.mark.node, pytest.mark.slow])])
def kube(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """Every test runs on the local etcd + kube-apiserver, and on a cluster that runs pods: kind where
    Docker and kind exist (pytest-kind), else the one-node cluster of tests/node.py."""
    own = True
    if request.param == "node":
        if kind_available():
            plane: ControlPlane = KindPlane()
            plane.start()
        else:
            plane = request.getfixturevalue("node_cluster")
            own = False  # node_cluster stops it, at the end of the session
    else:
        if not binaries_present():
            pytest.fail("etcd/kube-apiserver are not built: scripts/bootstrap builds them")
        plane = ControlPlane()
        plane.start()
    plane.kubectl("apply", "-f", str(REPO / "crds"))
    plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    plane.kubectl("apply", "-f", "-", input=legal_hold_clusterrole())
    yield plane
    if own:
        plane.stop()


def legal_hold_clusterrole() -> str:
    """The chart's ClusterRole for compliance teams, as the chart renders it (a template: it steps aside
    for one that exists)."""
    helm = CACHE_BIN / "helm"
    if not helm.is_file():
        pytest.fail("helm is not built: scripts/bootstrap builds it from its Go module")
    chart = REPO / "charts" / "workflow-streams"
    shown = subprocess.run(
        [str(helm), "template", "wfs", str(chart), "--show-only", "templates/legal-hold-clusterrole.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Figures the node tests measured (install to Ready, rollouts): reported, never asserted on time."""
    if FIGURES:
        terminalreporter.section("one-node cluster figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture
def namespace(kube: ControlPlane) -> str:
    return make_namespace(kube)


def make_namespace(kube: ControlPlane) -> str:
    """A new namespace with the KopfPeering a namespaced operator in it needs."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", name)
    kube.kubectl(
        "apply",
        "-n",
        name,
        "-f",
        "-",
        input=yaml.safe_dump(
            {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "workflow-streams"}}
        ),
    )
    return name


@pytest.fixture
def own_pg() -> Iterator[LocalPostgres]:
    bindir = find_bindir()
    assert bindir is not None
    cluster = LocalPostgres(bindir)
    cluster.init()
    cluster.start()
    yield cluster
    cluster.destroy()


@pytest.fixture
async def s3(s3_regions: dict[str, RegionConfig]) -> AsyncIterator[Any]:
    """A direct S3 client, to check what MinIO holds independently of the data plane."""
    region = s3_regions["eu-west-1"]
    async with get_session().create_client(
        "s3",
        endpoint_url=region.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=region.access_key_id,
        aws_secret_access_key=region.secret_access_key,
    ) as client:
        client.bucket = region.bucket
        yield client
