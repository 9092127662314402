"""The container image, built by scripts/image and run here: migrate, serve, operator, and what it holds.

The image is built once per session (scripts/image reuses it when nothing that goes into it changed) and run
with podman, or docker where its daemon answers, the way the chart runs it: uid 10001, a read-only root file
system, no capabilities. The data plane in the container reaches the test Postgres over the host network.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.support import pins
from workflow_streams import API_PREFIX
from workflow_streams.local.postgres import LocalPostgres, execute, free_port
from workflow_streams.local.process import http_ok, wait_until

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
NO_CANNOT_RUN = 3  # scripts/image's exit status when no container engine can run here


@dataclass(frozen=True)
class Image:
    engine: str
    name: str
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.engine, *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def container(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A throwaway container of the image, locked down as the chart runs it."""
        return self.run("run", "--rm", *self.locked_down(), *args, timeout=timeout)

    def locked_down(self) -> list[str]:
        # podman mounts writable tmpfs on /tmp and /run under --read-only unless told not to; Kubernetes'
        # readOnlyRootFilesystem does not, so neither does this.
        tmpfs = ["--read-only-tmpfs=false"] if self.engine == "podman" else []
        return ["--read-only", *tmpfs, "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]


def choose_engine() -> tuple[str, dict[str, str]]:
    """The engine scripts/image would choose; it is then told, so both use the same one."""
    env = dict(os.environ)
    engine = env.get("WFS_CONTAINER_ENGINE")
    if not engine:
        try:
            docker = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
            engine = "docker" if docker.returncode == 0 else "podman"
        except (OSError, subprocess.TimeoutExpired):
            engine = "podman"
    env["WFS_CONTAINER_ENGINE"] = engine
    if engine == "podman":
        env.setdefault("CONTAINERS_CONF", str(REPO / "deploy" / "podman" / "containers.conf"))
    return engine, env


class CannotBuild(Exception):
    """No container engine can run here (scripts/image said so); the message is its why."""


def build_image() -> Image:
    """``scripts/image``'s image, built with the engine this machine has."""
    engine, env = choose_engine()
    built = subprocess.run(
        [str(REPO / "scripts" / "image")], env=env, capture_output=True, text=True, timeout=1200, check=False
    )
    if built.returncode == NO_CANNOT_RUN:
        raise CannotBuild(built.stderr.strip()[-500:])
    assert built.returncode == 0, built.stderr[-6000:]
    return Image(engine, built.stdout.strip().splitlines()[-1], env)


@pytest.fixture(scope="session")
def image() -> Image:
    try:
        return build_image()
    except CannotBuild as exc:
        pytest.skip(f"neither podman nor docker can run a container here: {exc}")


@pytest.fixture
def empty_database(pg: LocalPostgres) -> Iterator[str]:
    """A database with no schema at all: the image's own `migrate` must create it."""
    name = f"img_{uuid.uuid4().hex[:12]}"

    asyncio.run(execute(pg.dsn, f"CREATE DATABASE {name}"))
    yield pg.dsn_for(name)
    asyncio.run(execute(pg.dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@dataclass
class Served:
    image: Image
    container: str
    base: str

    def logs(self) -> str:
        result = self.image.run("logs", self.container)
        return result.stdout + result.stderr

    def running(self) -> bool:
        state = self.image.run("inspect", "--format", "{{.State.Running}}", self.container)
        return state.stdout.strip() == "true"

    async def ready(self, session: aiohttp.ClientSession, seconds: float = 60.0) -> None:
        """Until /readyz answers; fails at once if the container exits (the launcher's readiness wait)."""
        await asyncio.to_thread(
            wait_until,
            lambda: http_ok(f"{self.base}/readyz"),
            seconds=seconds,
            alive=self.running,
            describe=self.logs,
            what="the container",
        )


@pytest.fixture
def served(image: Image, empty_database: str) -> Iterator[Served]:
    """`migrate`, then `serve` in the background, both from the image against the test Postgres."""
    env = ["-e", f"WFS_DATABASE_URL={empty_database}"]
    migrated = image.container("--network", "host", *env, image.name, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    versions = sorted(int(path.name.split("_")[0]) for path in (REPO / "migrations").glob("*.sql"))
    assert f"applied migrations: {versions}" in migrated.stdout, migrated.stdout

    port = free_port()
    name = f"wfs-image-test-{uuid.uuid4().hex[:8]}"
    started = image.run(
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        "host",
        *image.locked_down(),
        *env,
        "-e",
        "WFS_HOST=127.0.0.1",
        "-e",
        f"WFS_PORT={port}",
        "-e",
        "WFS_REGION=eu-west-1",
        "-e",
        "WFS_TOKENS=" + json.dumps({"tok-alice": "alice"}),
        image.name,
    )
    assert started.returncode == 0, started.stderr
    try:
        yield Served(image, name, f"http://127.0.0.1:{port}")
    finally:
        image.run("rm", "--force", name)


async def test_migrate_then_serve_appends_and_reads(served: Served) -> None:
    headers = {"Authorization": "Bearer tok-alice"}
    streams = f"{served.base}{API_PREFIX}/runs/run-img/streams"
    async with aiohttp.ClientSession(headers=headers) as session:
        await served.ready(session)
        async with session.post(streams, json={"stream_id": "out", "pins": pins()}) as resp:
            assert resp.status == 201, await resp.text()
        async with session.post(f"{streams}/out/records", json={"data": {"token": "from the image"}}) as resp:
            assert resp.status == 201, await resp.text()
            assert (await resp.json())["sequences"] == [1]
        async with session.get(f"{streams}/out/records", params={"after": "0"}) as resp:
            assert resp.status == 200, await resp.text()
            records = (await resp.json())["records"]
    assert [(r["sequence"], r["data"]) for r in records] == [(1, {"token": "from the image"})]


def test_serve_runs_as_uid_10001_on_a_read_only_root(served: Served) -> None:
    # the served process itself, not a fresh one: PID 1 of the container is `serve`
    status = served.image.run("exec", served.container, "cat", "/proc/1/status")
    assert status.returncode == 0, status.stderr
    ids = {line.split(":")[0]: line.split()[1:] for line in status.stdout.splitlines() if line[:4] in ("Uid:", "Gid:")}
    assert ids == {"Uid": ["10001"] * 4, "Gid": ["10001"] * 4}, status.stdout
    for path in ("/app/probe", "/tmp/probe", "/opt/venv/probe"):
        wrote = served.image.run("exec", served.container, "python", "-c", f"open({path!r}, 'w')")
        assert wrote.returncode != 0, f"{path} is writable"
        assert "Read-only file system" in wrote.stderr, wrote.stderr


def test_operator_command_starts(image: Image) -> None:
    helped = image.container("--network", "none", image.name, "operator", "--help")
    assert helped.returncode == 0, helped.stdout + helped.stderr
    assert "usage:" in helped.stdout and "operator" in helped.stdout
    # --help stops before the operator's imports: load them too, as `operator` does first
    imported = image.container(
        "--network", "none", "--entrypoint", "python", image.name, "-c", "import workflow_streams_operator.handlers"
    )
    assert imported.returncode == 0, imported.stderr


def test_image_holds_the_locked_dependencies_and_no_compiler(image: Image) -> None:
    probe = (
        "import importlib.metadata as m, json, shutil\n"
        "tools = ['gcc', 'cc', 'c++', 'g++', 'clang', 'ld', 'make']\n"
        "print(json.dumps({'compilers': [t for t in tools if shutil.which(t)],\n"
        "                  'dists': sorted({d.metadata['Name'] for d in m.distributions()})}))\n"
    )
    found = image.container("--network", "none", "--entrypoint", "python", image.name, "-c", probe)
    assert found.returncode == 0, found.stderr
    contents = json.loads(found.stdout)
    assert contents["compilers"] == []

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    locked = {
        normal(line.split("==")[0])
        for line in (REPO / "requirements.lock").read_text().splitlines()
        if "==" in line and not line.startswith(" ")
    }
    installed = {normal(name) for name in contents["dists"]} - {"pip", "setuptools"}  # the venv's own tools
    assert "pytest" not in installed and "hypothesis" not in installed
    assert installed == locked
