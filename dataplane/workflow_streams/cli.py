"""``workflow-streams``: dev, serve, migrate."""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import sys

from aiohttp import web

from .config import Settings
from .domain.authz import Principal
from .localpg import LocalPostgres, find_bindir
from .store.migrate import apply_migrations

log = logging.getLogger("workflow_streams")


def _serve(settings: Settings) -> None:
    from .api.app import create_app

    web.run_app(create_app(settings), host=settings.host, port=settings.port, access_log=None)


def cmd_migrate(_args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    applied = asyncio.run(apply_migrations(settings.database_url))
    print(f"applied migrations: {applied or 'none (up to date)'}")
    return 0


def cmd_serve(_args: argparse.Namespace) -> int:
    _serve(Settings.from_env())
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    bindir = find_bindir()
    if bindir is None:
        print("no PostgreSQL binaries found: install postgresql, or `pip install pgserver`", file=sys.stderr)
        return 1
    pg = LocalPostgres(bindir)
    pg.init()
    pg.start()
    try:
        asyncio.run(apply_migrations(pg.dsn))
        token = args.token or secrets.token_urlsafe(24)
        settings = Settings(
            database_url=pg.dsn,
            host="127.0.0.1",
            port=args.port,
            tokens={token: Principal("dev")},
            region=args.region,
            prune_interval_seconds=5.0,
        )
        print(f"workflow-streams dev: Postgres at {pg.dsn} (data in {pg.base_dir})")
        print(f"serving http://127.0.0.1:{args.port}/api/workflow-streams as region {args.region}")
        print(f"dev token (principal 'dev'): {token}")
        print(f"  export WFS_TOKEN={token}", flush=True)
        _serve(settings)
    finally:
        pg.destroy()
    return 0


def cmd_operator(_args: argparse.Namespace) -> int:
    from workflow_streams_operator import handlers

    handlers.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workflow-streams", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", help="throwaway local Postgres + migrations + server on 127.0.0.1:8080")
    dev.add_argument("--port", type=int, default=8080)
    dev.add_argument("--token", help="use this dev token instead of a random one")
    dev.add_argument("--region", default="eu-west-1", help="the region this dev server is in (placement pins)")
    dev.set_defaults(func=cmd_dev)
    sub.add_parser("serve", help="serve the data plane, configured from WFS_* env").set_defaults(func=cmd_serve)
    sub.add_parser("migrate", help="apply pending migrations to WFS_DATABASE_URL").set_defaults(func=cmd_migrate)
    sub.add_parser("operator", help="run the Kopf operator (KUBECONFIG or in-cluster)").set_defaults(func=cmd_operator)
    from .client.cli import add_commands

    add_commands(sub)
    args = parser.parse_args(argv)
    if args.command in ("dev", "serve", "migrate"):  # Kopf configures its own; client commands stay quiet
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
