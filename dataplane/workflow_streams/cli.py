"""workflow-streams: durable, strictly ordered data streams for workflow runs.

Run the whole product on this machine with `dev`; run the data plane (`serve`), its migrations and
the Kubernetes operator in production; and talk to a data plane as a client (create, get, ls, read,
tail, append, ack, close, deliveries, requeue) or place legal holds through Kubernetes (hold, release).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
from pathlib import Path

from aiohttp import web

from .config import Settings
from .store.migrate import apply_migrations

log = logging.getLogger("workflow_streams")


SETTINGS_HELP = """settings (environment variables; the README's Configuration table says more):
  WFS_DATABASE_URL                 Postgres DSN (required)
  WFS_HOST, WFS_PORT               listen address (127.0.0.1, 8080)
  WFS_TOKENS, WFS_TOKENS_FILE      JSON {"<token>": "alice"} or {"<token>": {"principal": ..., "groups": [...]}}
  WFS_REGION                       the region this process runs in (local)
  WFS_METADATA_REGION              the region of this Postgres; definitions homed elsewhere are refused
  WFS_REGION_CIDRS                 JSON region -> client CIDRs, for client-egress checks
  WFS_TRUSTED_PROXIES              comma-separated CIDRs whose X-Forwarded-For is believed
  WFS_TOKEN_AUDIENCES              service-account tokens through TokenReview for these audiences
  WFS_KUBE_API_URL, WFS_KUBE_CA_FILE, WFS_KUBE_TOKEN_FILE, WFS_TOKEN_CACHE_SECONDS
  WFS_BODY_TIMEOUT_SECONDS         slow-body limit (10)
  WFS_SSE_MAX_PER_PRINCIPAL        open subscriptions per principal per replica (100)
  WFS_SSE_HEARTBEAT_SECONDS        heartbeat interval on idle subscriptions (15)
  WFS_SSE_MAX_CONNECTION_SECONDS   a subscription's lifetime before the client resumes (3600)
  WFS_POOL_MIN, WFS_POOL_MAX       connection pool size (2, 20)
  WFS_WORKERS                      serving processes on one port, SO_REUSEPORT (0 = one per core)
  WFS_WAKE_SOURCE                  listen (LISTEN/NOTIFY) or poll (no LISTEN, e.g. behind PgBouncer)
  WFS_WAKE_POLL_SECONDS            head-poll interval for lost wakes (1 with listen, 0.2 with poll)
  WFS_PRUNE_INTERVAL_SECONDS       retention sweep interval, 0 disables (30)
  WFS_S3_REGIONS                   JSON region -> {endpoint_url, bucket, access_key_id, secret_access_key, ...}
  WFS_JANITOR_INTERVAL_SECONDS     orphan expiry and object deletion sweep (10)
  WFS_DELETION_OUTBOX_RETENTION_SECONDS  finished deletion-outbox rows are purged after this (604800: 7 days)
  WFS_WAIT_SERVICE_URL             where input records are delivered (unset: no dispatcher)
  WFS_WORKER_LEASE_SECONDS         worker claim lease (15)
  WFS_DELIVERY_TIMEOUT_SECONDS, WFS_DELIVERY_BACKOFF_BASE_SECONDS, WFS_DELIVERY_MAX_ATTEMPTS (5, 0.5, 25)
"""
SERVE_HELP = "Serve the data plane (HTTP + SSE) and run its background workers.\n\n" + SETTINGS_HELP
DEV_HELP = (
    """The whole product on this machine: a throwaway Postgres, migrations, the data plane, large objects
on a local MinIO (when built), input delivery to a built-in wait service that logs what it receives,
and with --kube a local etcd + kube-apiserver + the operator (kubeconfig in the data directory).
Ctrl-C stops everything and removes the throwaway data. The dev token is kept in the data directory
($WFS_DEV_DIR, default $WFS_CACHE/dev), so it survives restarts.

Every WFS_* setting of `serve` overrides dev's default (e.g. WFS_DATABASE_URL uses that database,
WFS_WAIT_SERVICE_URL your wait service); --port, --region and --token override both.

"""
    + SETTINGS_HELP
)


def _serve(settings: Settings) -> None:
    from .api.app import create_app

    web.run_app(create_app(settings), host=settings.host, port=settings.port, access_log=None)


def cmd_migrate(_args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    applied = asyncio.run(apply_migrations(settings.database_url, connecting=settings.connecting))
    print(f"applied migrations: {applied or 'none (up to date)'}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .serving import serve

    settings = Settings.from_env()
    if args.workers is not None:
        settings = dataclasses.replace(settings, workers=args.workers)
    return serve(settings)


def cmd_dev(args: argparse.Namespace) -> int:
    from .devserver import DevOptions, run

    return run(DevOptions(port=args.port, token=args.token, region=args.region, kube=args.kube, data_dir=args.data_dir))


def cmd_operator(_args: argparse.Namespace) -> int:
    from workflow_streams_operator import handlers

    handlers.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="workflow-streams", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser(
        "dev",
        help="the whole product on this machine: Postgres, data plane, objects, delivery (and --kube)",
        description=DEV_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dev.add_argument("--port", type=int, help="listen port (default: $WFS_PORT, else 8080)")
    dev.add_argument("--token", help="use this dev token (default: one kept in the data directory)")
    dev.add_argument("--region", help="the region this dev server is in (default: $WFS_REGION, else eu-west-1)")
    dev.add_argument("--kube", action="store_true", help="also run etcd + kube-apiserver + the operator")
    dev.add_argument("--data-dir", type=Path, help="where the token and kubeconfig are kept (default: $WFS_DEV_DIR)")
    dev.set_defaults(func=cmd_dev)
    serve = sub.add_parser(
        "serve",
        help="serve the data plane, configured from WFS_* env",
        description=SERVE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="serving processes sharing the port via SO_REUSEPORT (default: $WFS_WORKERS, else one per core)",
    )
    serve.set_defaults(func=cmd_serve)
    sub.add_parser("migrate", help="apply pending migrations to WFS_DATABASE_URL").set_defaults(func=cmd_migrate)
    sub.add_parser("operator", help="run the Kopf operator (KUBECONFIG or in-cluster)").set_defaults(func=cmd_operator)
    from .client.cli import add_commands

    add_commands(sub)
    try:  # shell completion (`workflow-streams completion bash`), where argcomplete is installed
        import argcomplete

        argcomplete.autocomplete(parser)
    except ImportError:
        pass
    args = parser.parse_args(argv)
    if args.command in ("dev", "serve", "migrate"):  # Kopf configures its own; client commands stay quiet
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
