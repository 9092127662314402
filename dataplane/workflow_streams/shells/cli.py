"""workflow-streams: durable, strictly ordered data streams for workflow runs.

Run the whole product on this machine with `dev`; run the data plane (`serve`), its migrations and
the Kubernetes operator in production; talk to a data plane as a client (create, get, ls, read, tail,
append, download, ack, close, deliveries, requeue); place legal holds through Kubernetes (hold, release).

Client options (--url, --token, --json) go before or after the command. A failure is one line on
stderr, `error: <code>: <detail>`, with exit status 1.
"""

# Only the standard library at the top: `main` must already be running, and catching Ctrl-C, while the
# heavy modules (aiohttp, asyncpg, aiobotocore, kopf) are imported, which takes a second or more.
from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..adapters.config import Settings


def settings_help(database: str) -> str:
    return f"""settings (environment variables; the README's Configuration table says more):
  WFS_DATABASE_URL                 Postgres DSN ({database})
  WFS_HOST, WFS_PORT               listen address (127.0.0.1, 8080)
  WFS_TOKENS, WFS_TOKENS_FILE      JSON {{"<token>": "alice"}} or {{"<token>": {{"principal": ..., "groups": [...]}}}}
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
  WFS_S3_REGIONS                   JSON region -> {{endpoint_url, bucket, access_key_id, secret_access_key, ...}}
  WFS_JANITOR_INTERVAL_SECONDS     orphan expiry and object deletion sweep (10)
  WFS_DELETION_OUTBOX_RETENTION_SECONDS  finished deletion-outbox rows are purged after this (604800: 7 days)
  WFS_WAIT_SERVICE_URL             where input records are delivered (unset: no dispatcher)
  WFS_WORKER_LEASE_SECONDS         worker claim lease (15)
  WFS_DELIVERY_TIMEOUT_SECONDS, WFS_DELIVERY_BACKOFF_BASE_SECONDS, WFS_DELIVERY_MAX_ATTEMPTS (5, 0.5, 25)
"""


SERVE_HELP = "Serve the data plane (HTTP + SSE) and run its background workers.\n\n" + settings_help("required")
MIGRATE_HELP = """Apply the pending migrations to WFS_DATABASE_URL, each in a transaction under an advisory lock
(several pods may run it at once). WFS_DATABASE_POOLER and WFS_DATABASE_TIMEOUT_SECONDS apply too."""
OPERATOR_HELP = """Run the Kopf operator: WorkflowStream -> Postgres definition and bucket policies, StreamLegalHold ->
legal holds. Reaches the API server through KUBECONFIG or in-cluster; reads the data plane's WFS_* settings
(database, S3 regions, region CIDRs) and its own: WFS_OPERATOR_NAMESPACE, WFS_OPERATOR_PEERING,
WFS_OPERATOR_PRIORITY, WFS_OPERATOR_PEERING_LIFETIME, WFS_OPERATOR_METRICS_PORT."""
DEV_HELP = """The whole product on this machine: a throwaway Postgres, migrations, the data plane, large objects
on a local MinIO (when built), input delivery to a built-in wait service that logs what it receives,
and with --kube a local etcd + kube-apiserver + the operator (kubeconfig and the operator's log in the
data directory). Ctrl-C stops everything and removes the throwaway data. The dev token is kept in the
data directory ($WFS_DEV_DIR, default $WFS_CACHE/dev), so it survives restarts.

Every WFS_* setting of `serve` overrides dev's default (e.g. WFS_DATABASE_URL uses that database,
WFS_WAIT_SERVICE_URL your wait service); --port, --region and --token override both.

""" + settings_help("default: a throwaway cluster from this machine's PostgreSQL binaries")


def cmd_migrate(_args: argparse.Namespace) -> int:
    import asyncio

    from ..adapters.config import Settings
    from ..store.migrate import apply_migrations

    settings = Settings.from_env()
    try:
        applied = asyncio.run(apply_migrations(settings.database_url, connecting=settings.connecting))
    except Exception as exc:
        return _database_failure(settings, exc)
    print(f"applied migrations: {applied or 'none (up to date)'}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses

    from ..adapters.config import Settings
    from ..store.db import create_pool
    from .serving import serve

    settings = Settings.from_env()
    if args.workers is not None:
        settings = dataclasses.replace(settings, workers=args.workers)

    async def reachable() -> None:
        # before any worker starts: an unreachable database is one line here, not a traceback per worker
        pool = await create_pool(settings.database_url, 1, 1, connecting=settings.connecting)
        await pool.close()

    try:
        asyncio.run(reachable())
    except Exception as exc:
        return _database_failure(settings, exc)
    try:
        return serve(settings)
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            return fail("cannot_listen", f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}")
        return _database_failure(settings, exc)


def _database_failure(settings: Settings, exc: Exception) -> int:
    """One line for a database that cannot be reached or refuses us; anything else is a bug: re-raised."""
    import asyncpg

    from ..adapters.config import redacted_dsn
    from ..store.db import DB_UNAVAILABLE

    where = redacted_dsn(settings.database_url)
    if isinstance(exc, DB_UNAVAILABLE):
        return fail("database_unavailable", f"cannot reach Postgres at {where}: {type(exc).__name__}: {exc}")
    if isinstance(exc, asyncpg.PostgresError):
        return fail("database_refused", f"Postgres at {where} refused: {exc}")
    raise exc


def cmd_dev(args: argparse.Namespace) -> int:
    from .devserver import DevOptions, run

    return run(DevOptions(port=args.port, token=args.token, region=args.region, kube=args.kube, data_dir=args.data_dir))


def cmd_operator(_args: argparse.Namespace) -> int:
    from workflow_streams_operator import handlers

    handlers.run()
    return 0


def fail(code: str, detail: str, status: int = 1) -> int:
    print(f"error: {code}: {' '.join(detail.split())}", file=sys.stderr, flush=True)
    return status


def build_parser() -> argparse.ArgumentParser:
    from ..client.cli import add_commands, add_global_options

    parser = argparse.ArgumentParser(
        prog="workflow-streams", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
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
    dev.add_argument(
        "--data-dir",
        type=Path,
        help="where the token, the kubeconfig and the operator's log are kept (default: $WFS_DEV_DIR)",
    )
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
    sub.add_parser(
        "migrate", help="apply pending migrations to WFS_DATABASE_URL", description=MIGRATE_HELP
    ).set_defaults(func=cmd_migrate)
    sub.add_parser(
        "operator", help="run the Kopf operator (KUBECONFIG or in-cluster)", description=OPERATOR_HELP
    ).set_defaults(func=cmd_operator)
    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``workflow-streams`` command. Whatever a user provokes ends as one line with a stable code,
    never a traceback: settings (``config.SettingsError``), the database, client problems, Ctrl-C."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return fail("interrupted", "stopped by Ctrl-C", status=130)


def _main(argv: list[str] | None) -> int:
    import logging

    parser = build_parser()
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
