"""``workflow-streams dev``: the whole product on one machine.

A throwaway Postgres (unless ``WFS_DATABASE_URL`` names one), the data plane, large objects on a local
MinIO when its binary is built, input delivery to a built-in wait service that logs what it receives
(or to ``WFS_WAIT_SERVICE_URL``), and with ``--kube`` a local etcd + kube-apiserver + the operator.
``WFS_*`` variables override dev's defaults, flags override both. One log line per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from ..adapters.config import Settings, redacted_dsn
from ..domain.authz import Principal
from ..local import cache_dir
from ..local.minio import MinioServer, minio_binary
from ..local.postgres import LocalPostgres, find_bindir
from ..local.process import Process, workflow_streams
from ..store.db import DB_UNAVAILABLE
from ..store.migrate import apply_migrations

log = logging.getLogger("workflow_streams.dev")
WAIT_SERVICE_PATH = "/dev/wait-service"
BUCKET = "wfs-dev"
OPERATOR_LOG = "operator.log"


class DevError(Exception):
    """Dev cannot start: one line for the user, with a code like the API's problems."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class DevOptions:
    port: int | None = None
    token: str | None = None
    region: str | None = None
    kube: bool = False
    data_dir: Path | None = None


def run(options: DevOptions, env: Mapping[str, str] = os.environ) -> int:
    try:
        return _run(options, env)
    except DevError as exc:
        print(f"error: {exc.code}: {exc}", file=sys.stderr, flush=True)
        return 1


def _run(options: DevOptions, env: Mapping[str, str]) -> int:
    host = env.get("WFS_HOST", "127.0.0.1")
    port = options.port or int(env.get("WFS_PORT", "8080"))
    region = options.region or env.get("WFS_REGION", "eu-west-1")
    # everything that can refuse to start is checked before anything is printed or started
    check_port_free(host, port)
    if options.kube:
        from ..local.kube import binaries_present

        if not binaries_present():
            raise DevError(
                "kube_not_built",
                "--kube needs etcd, kube-apiserver (scripts/bootstrap controlplane builds them) and kubectl",
            )
    if not env.get("WFS_DATABASE_URL") and find_bindir() is None:
        raise DevError("no_postgres", "no PostgreSQL binaries found: install postgresql, or `pip install pgserver`")
    data_dir = options.data_dir or Path(env.get("WFS_DEV_DIR") or cache_dir() / "dev")
    token, token_source = options.token, "--token"
    if token is None:
        token, token_source = stable_token(data_dir), f"kept in {data_dir / 'token'}; --token overrides"

    with contextlib.ExitStack() as stack:
        run_dir = Path(tempfile.mkdtemp(prefix="wfs-dev-"))
        stack.callback(shutil.rmtree, run_dir, ignore_errors=True)
        parts = Parts()
        defaults: dict[str, str] = {
            "WFS_HOST": host,
            "WFS_REGION": region,
            "WFS_METADATA_REGION": region,
            "WFS_PRUNE_INTERVAL_SECONDS": "5",
            # the Durable Streams surface admits callers without a token, as its protocol's clients and
            # conformance suite expect (serve does only with this setting)
            "WFS_DS_ANONYMOUS": "true",
            "WFS_WAIT_SERVICE_URL": f"http://127.0.0.1:{port}{WAIT_SERVICE_PATH}",
        }
        if env.get("WFS_DATABASE_URL"):
            parts.postgres = f"{redacted_dsn(env['WFS_DATABASE_URL'])} (from WFS_DATABASE_URL)"
        else:
            bindir = find_bindir()
            assert bindir is not None
            pg = LocalPostgres(bindir)  # its own directory: as root, Postgres runs as another user
            stack.callback(pg.destroy)
            try:
                pg.init()
                pg.start()
            except subprocess.CalledProcessError as exc:
                raise DevError("postgres_failed", f"{exc.cmd[-9:]} failed: {exc.stderr or exc.stdout}") from None
            except RuntimeError as exc:
                raise DevError("postgres_failed", str(exc)) from None
            defaults["WFS_DATABASE_URL"] = pg.dsn
            parts.postgres = f"{pg.dsn} (throwaway; data in {pg.base_dir})"
        if not env.get("WFS_S3_REGIONS"):
            binary = minio_binary()
            if binary is not None:
                minio = start_minio(binary, run_dir, stack)
                defaults["WFS_S3_REGIONS"] = json.dumps({region: minio.region_config(BUCKET)})
                parts.objects = f"MinIO at {minio.endpoint}, bucket {BUCKET} for region {region}"
            else:
                building = env.get("WFS_DEV_MINIO_BUILD_LOG")
                parts.objects = (
                    f"waiting for MinIO's one-time build in the background (progress: tail -f {building});"
                    " objects turn on when it is done"
                    if building
                    else "off until MinIO is built: scripts/bootstrap minio (scripts/dev starts it in the background)"
                )
                parts.minio_pending = True
        else:
            parts.objects = "the object stores of WFS_S3_REGIONS"
        overrides = {key: value for key, value in env.items() if key.startswith("WFS_")}
        merged = {**defaults, **overrides, "WFS_PORT": str(port)}
        if options.region:
            merged["WFS_REGION"] = options.region
        settings = Settings.from_env(merged)
        settings = dataclasses.replace(
            settings,
            tokens={**settings.tokens, token: Principal("dev")},
            objects_pending=objects_pending(env) if parts.minio_pending else None,
        )
        try:
            asyncio.run(apply_migrations(settings.database_url, connecting=settings.connecting))
        except DB_UNAVAILABLE as exc:
            raise DevError(
                "database_unavailable", f"cannot reach Postgres at {parts.postgres}: {type(exc).__name__}: {exc}"
            ) from None
        if settings.wait_service_url == defaults["WFS_WAIT_SERVICE_URL"]:
            parts.delivery = "input records go to the built-in wait service, which logs each one"
        elif settings.wait_service_url:
            parts.delivery = f"input records go to {settings.wait_service_url}"
        else:
            parts.delivery = "off (WFS_WAIT_SERVICE_URL is empty)"
        kube: Any = None
        if options.kube:
            kube = start_kube(run_dir, data_dir, stack)
            parts.kube = f"etcd + kube-apiserver + the operator (its log: {data_dir / OPERATOR_LOG}, kept after exit)"
        else:
            parts.kube = "off (--kube runs etcd + kube-apiserver + the operator)"
        server = DevServer(settings, parts, run_dir, data_dir, kube, merged)
        asyncio.run(server.serve(token, token_source))
    return 0


def objects_pending(env: Mapping[str, str]) -> str:
    """Why dev has no object store yet: the 421's detail, so an upload says what to wait for."""
    building = env.get("WFS_DEV_MINIO_BUILD_LOG")
    if building:
        return (
            "workflow-streams dev has no object store yet: MinIO is still being built (once, up to ten minutes on"
            f" two cores; progress: tail -f {building}); objects turn on by themselves when it is done"
        )
    return "workflow-streams dev found no MinIO: scripts/bootstrap minio builds it, then restart dev"


def check_port_free(host: str, port: int) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise DevError(
                    "port_in_use", f"{host}:{port} is already in use (another dev? choose one with --port)"
                ) from None
            raise DevError("cannot_listen", f"cannot listen on {host}:{port}: {exc.strerror}") from None


def stable_token(data_dir: Path) -> str:
    """The dev token survives restarts: the first run writes it to the data directory (mode 0600)."""
    path = data_dir / "token"
    if path.is_file():
        token = path.read_text().strip()
        if token:
            return token
    data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def start_minio(binary: Path, run_dir: Path, stack: contextlib.ExitStack) -> MinioServer:
    minio = MinioServer(binary, data=run_dir / "minio")
    minio.start()
    stack.callback(minio.stop)
    return minio


def start_kube(run_dir: Path, data_dir: Path, stack: contextlib.ExitStack) -> Any:
    from ..local.kube import ControlPlane

    plane = ControlPlane(run_dir / "kube")
    plane.start()
    stack.callback(plane.stop)
    plane.install_crds()
    peering = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "workflow-streams"}}
    plane.kubectl("apply", "-f", "-", input=json.dumps(peering))
    data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plane.kubeconfig, data_dir / "kubeconfig")
    return plane


@dataclasses.dataclass
class Parts:
    """What dev runs, one line each, as printed once the server listens."""

    postgres: str = ""
    objects: str = ""
    delivery: str = ""
    kube: str = ""
    minio_pending: bool = False


class DevServer:
    def __init__(
        self, settings: Settings, parts: Parts, run_dir: Path, data_dir: Path, kube: Any, env: dict[str, str]
    ) -> None:
        self.settings, self.parts, self.run_dir, self.kube, self.env = settings, parts, run_dir, kube, env
        self.operator_log = data_dir / OPERATOR_LOG
        self.kubeconfig = data_dir / "kubeconfig"
        self.operator: Process | None = None
        self._late_minio: MinioServer | None = None

    async def serve(self, token: str, token_source: str) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        self.start_operator()
        runner = await self.start_app()
        s = self.settings
        print("workflow-streams dev: ready", flush=True)
        for name, text in [
            ("postgres", self.parts.postgres),
            (
                "data plane",
                f"http://{s.host}:{s.port}/api/workflow-streams as region {s.region}, one log line per request",
            ),
            ("objects", self.parts.objects),
            ("delivery", self.parts.delivery),
            ("kube", self.parts.kube),
        ]:
            print(f"  {name:<11}{text}", flush=True)
        print(f"dev token (principal 'dev'): {token} ({token_source})")
        print("in your shell, for the CLI and the Python client (the README's examples):")
        for line in self.shell_lines(token):
            print(f"  {line}")
        sys.stdout.flush()
        stopping = asyncio.create_task(stop.wait())
        minio_built = asyncio.create_task(_wait_for_minio()) if self.parts.minio_pending else None
        try:
            while not stop.is_set():
                waits: list[asyncio.Future[Any]] = [stopping] if minio_built is None else [stopping, minio_built]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if minio_built is not None and minio_built.done() and not stop.is_set():
                    runner = await self.turn_objects_on(runner, minio_built.result())
                    minio_built = None
        finally:
            for task in (stopping, minio_built):
                if task is not None:
                    task.cancel()
            await runner.cleanup()
            self.stop_operator()
            if self._late_minio is not None:
                self._late_minio.stop()
            if self.operator is not None:
                print(f"workflow-streams dev: stopped; the operator's log is kept in {self.operator_log}", flush=True)

    def shell_lines(self, token: str) -> list[str]:
        """What a user's shell needs: where the data plane is and the token; where this checkout's CLI and
        Python client are (dev runs from its environment, which no shell has on its PATH yet); the
        kubeconfig with --kube."""
        lines = [f"export WFS_URL=http://127.0.0.1:{self.settings.port} WFS_TOKEN={token}"]
        scripts = Path(sys.executable).parent
        if (scripts / "workflow-streams").exists():
            lines.append(f'export PATH="{scripts}:$PATH"   # workflow-streams and python3 with the client')
        if self.kube is not None:
            lines.append(f"export KUBECONFIG={self.kubeconfig}")
        return lines

    async def start_app(self) -> web.AppRunner:
        from .compose import create_app

        app = create_app(self.settings)
        app.router.add_post(WAIT_SERVICE_PATH, _wait_service)
        runner = web.AppRunner(
            app,
            access_log_class=access_logger(self.settings.tokens),
            access_log=logging.getLogger("workflow_streams.access"),
        )
        await runner.setup()
        await web.TCPSite(runner, self.settings.host, self.settings.port).start()
        return runner

    async def turn_objects_on(self, runner: web.AppRunner, binary: Path) -> web.AppRunner:
        """MinIO's build finished while dev ran: start it, then restart the data plane (and the
        operator) with it; subscribers resume on their own."""
        minio = MinioServer(binary, data=self.run_dir / "minio")
        await asyncio.to_thread(minio.start)
        self._late_minio = minio
        region = self.settings.region
        regions = json.dumps({region: minio.region_config(BUCKET)})
        self.env["WFS_S3_REGIONS"] = regions
        self.settings = dataclasses.replace(
            self.settings,
            s3_regions=Settings.from_env({**self.env, "WFS_S3_REGIONS": regions}).s3_regions,
            objects_pending=None,
        )
        await runner.cleanup()
        runner = await self.start_app()
        if self.operator is not None:
            self.stop_operator()
            self.start_operator()
        log.info("objects: ready, MinIO at %s, bucket %s for region %s", minio.endpoint, BUCKET, region)
        return runner

    def start_operator(self) -> None:
        if self.kube is None:
            return
        env = {**os.environ, **self.env, "KUBECONFIG": str(self.kube.kubeconfig), "WFS_OPERATOR_METRICS_PORT": "0"}
        # in the data directory, not the throwaway one: why a hold or a stream was not applied is in it,
        # also after dev has stopped; a new dev starts it afresh, a restart within one dev appends
        self.operator = Process(
            workflow_streams("operator"),
            log=self.operator_log,
            env=env,
            name="operator",
            append=self.operator is not None,
        )

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop(grace=15)


async def _wait_for_minio() -> Path:
    while True:
        binary = minio_binary()
        if binary is not None:
            return binary
        await asyncio.sleep(2)


async def _wait_service(request: web.Request) -> web.Response:
    """The built-in wait service: logs each input record it is sent and accepts it."""
    event = await request.json()
    record = event.get("record", {})
    payload = record.get("data", record.get("object", record.get("data_base64")))
    log.info(
        "wait service: received %s/%s #%s (event %s): %s",
        event.get("run_id"),
        event.get("stream_id"),
        event.get("sequence"),
        event.get("event_id"),
        json.dumps(payload)[:500],
    )
    return web.json_response({"accepted": event.get("event_id")})


def access_logger(tokens: Mapping[str, Principal]) -> type[AbstractAccessLogger]:
    """One line per request: method, path (never the query: it may carry ?access_token=), status,
    milliseconds, principal. Principals of static tokens are known here; others show as '-'."""
    by_digest = {hashlib.sha256(token.encode()).digest(): principal.name for token, principal in tokens.items()}

    class DevAccessLogger(AbstractAccessLogger):
        def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
            _, _, token = request.headers.get("Authorization", "").partition(" ")
            if not token and "access_token" in request.query:
                token = request.query["access_token"]
            principal = by_digest.get(hashlib.sha256(token.strip().encode()).digest(), "-") if token else "-"
            self.logger.info(
                "%s %s %s %.1fms %s", request.method, request.path, response.status, time * 1000, principal
            )

    return DevAccessLogger
