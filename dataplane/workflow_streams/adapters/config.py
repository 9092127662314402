"""Settings from the environment (``WFS_*``), documented in the README."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ..domain.admission import Served
from ..domain.authz import Principal
from ..domain.templates import Templates, base_template, parse_templates
from ..store.db import DEFAULT_TIMEOUT_SECONDS, POOLERS, Connecting, Pooler
from .objectstore import RegionConfig

# Where a pod's projected service-account token and CA live. Here, not in api/kubeauth.py, because settings
# sit below the shells that use them: config must not import api (tests/test_layers.py enforces it).
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
T = TypeVar("T")


@dataclass(frozen=True)
class KubeAuthSettings:
    """How the data plane asks the API server about service-account tokens (``api.kubeauth.TokenReviewer``)."""

    api_url: str
    ca_file: str
    token_file: str  # the data plane's own token, re-read so a rotated projected token is picked up
    audiences: tuple[str, ...]
    cache_seconds: float = 30.0
    negative_cache_seconds: float = 5.0


def kube_auth_from_env(env: Mapping[str, str]) -> KubeAuthSettings | None:
    """Enabled by WFS_TOKEN_AUDIENCES; in a pod the API server and credentials are found as usual."""
    audiences = tuple(a for a in env.get("WFS_TOKEN_AUDIENCES", "").split(",") if a)
    if not audiences:
        return None
    in_cluster = f"https://{env.get('KUBERNETES_SERVICE_HOST', '')}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
    return KubeAuthSettings(
        api_url=env.get("WFS_KUBE_API_URL", in_cluster),
        ca_file=env.get("WFS_KUBE_CA_FILE", str(IN_CLUSTER / "ca.crt")),
        token_file=env.get("WFS_KUBE_TOKEN_FILE", str(IN_CLUSTER / "token")),
        audiences=audiences,
        cache_seconds=_parsed(env, "WFS_TOKEN_CACHE_SECONDS", _number(float), 30.0),
    )


class SettingsError(SystemExit):
    """A ``WFS_*`` setting that cannot be used. A ``SystemExit`` whose message is one line with a stable
    code (``error: invalid_setting: WFS_TOKENS: ...``), so a process ends on it with exit status 1 and no
    traceback wherever it is raised: ``serve``, ``migrate``, ``dev``, the operator."""

    def __init__(self, setting: str, message: str, code: str = "invalid_setting") -> None:
        super().__init__(f"error: {code}: {' '.join(message.split())}")
        self.setting = setting
        self.problem_code = code


_REGION_FIELDS = frozenset(f.name for f in dataclasses.fields(RegionConfig))
_REGION_REQUIRED = ("endpoint_url", "bucket", "access_key_id", "secret_access_key")


def parse_regions(text: str) -> dict[str, RegionConfig]:
    """``{"eu-west-1": {"endpoint_url": ..., "bucket": ..., "access_key_id": ..., "secret_access_key": ...}}``"""
    raw = _json_object(text, "a JSON object of region -> object store")
    regions = {}
    for region, value in raw.items():
        if not isinstance(value, dict):
            raise ValueError(f"region {region!r} must be an object with {', '.join(_REGION_REQUIRED)}")
        missing = [name for name in _REGION_REQUIRED if name not in value]
        if missing:
            raise ValueError(f"region {region!r} lacks {', '.join(missing)} (needs {', '.join(_REGION_REQUIRED)})")
        unknown = sorted(set(value) - _REGION_FIELDS)
        if unknown:
            raise ValueError(f"region {region!r} has unknown field(s) {', '.join(unknown)}")
        regions[region] = RegionConfig(**value)
    return regions


def parse_tokens(text: str) -> dict[str, Principal]:
    """``{"<token>": {"principal": "alice", "groups": ["ops"]}}`` or ``{"<token>": "alice"}``."""
    raw = _json_object(text, "a JSON object of token -> principal")
    tokens = {}
    for token, value in raw.items():
        if isinstance(value, str):
            tokens[token] = Principal(value)
        elif isinstance(value, dict) and isinstance(value.get("principal"), str):
            groups = value.get("groups", [])
            if not isinstance(groups, list) or not all(isinstance(group, str) for group in groups):
                raise ValueError("a token's groups must be a list of names")
            tokens[token] = Principal(value["principal"], frozenset(groups))
        else:
            raise ValueError('each token maps to a principal name or {"principal": ..., "groups": [...]}')
    return tokens


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"must be {what}")
    return raw


def _parsed(env: Mapping[str, str], name: str, parse: Callable[[str], T], default: T) -> T:
    """``env[name]`` parsed, ``default`` when unset or empty; a value that does not parse is a SettingsError."""
    text = env.get(name)
    if not text:
        return default
    try:
        return parse(text)
    except (ValueError, TypeError) as exc:
        raise SettingsError(name, f"{name}: {exc or type(exc).__name__}") from None


def integer_setting(env: Mapping[str, str], name: str, default: int) -> int:
    """``env[name]`` as an integer, ``default`` when unset or empty; anything else is a ``SettingsError``
    naming it (for the operator's own settings, read as the data plane's are)."""
    return _parsed(env, name, _number(int), default)


def _number(kind: Callable[[str], T]) -> Callable[[str], T]:
    def parse(text: str) -> T:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None

    return parse


def _file(name: str, env: Mapping[str, str]) -> str | None:
    path = env.get(name)
    if not path:
        return None
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise SettingsError(name, f"{name}: cannot read {path}: {exc.strerror}") from None


def redacted_dsn(dsn: str) -> str:
    """A DSN as it may be printed: no user or password, no parameters (they may hold a password too)."""
    return re.sub(r"//[^@/]*@", "//", dsn).split("?", 1)[0]


def _pooler(text: str) -> Pooler:
    if text == "none":
        return "none"
    if text == "transaction":
        return "transaction"
    raise SettingsError("WFS_DATABASE_POOLER", f"WFS_DATABASE_POOLER must be one of {', '.join(POOLERS)}, not {text!r}")


def _wake_source(text: str | None, pooler: Pooler, listen_url: str | None) -> str:
    """LISTEN by default; behind a transaction pooler only with a direct DSN for it, else polling."""
    through_pooler = pooler == "transaction" and listen_url is None
    if text is None:
        return "poll" if through_pooler else "listen"
    if text not in ("listen", "poll"):
        raise SettingsError("WFS_WAKE_SOURCE", f"WFS_WAKE_SOURCE must be 'listen' or 'poll', not {text!r}")
    if text == "listen" and through_pooler:
        raise SettingsError(
            "WFS_WAKE_SOURCE",
            "WFS_WAKE_SOURCE=listen does not work through a transaction pooler (LISTEN receives nothing"
            " there): set WFS_LISTEN_DATABASE_URL to a direct DSN, or leave WFS_WAKE_SOURCE unset to poll",
        )
    return text


def durable_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The Durable Streams surface's settings (``WFS_DS_*``)."""
    template_file = _file("WFS_DS_TEMPLATE_FILE", env)
    name = "WFS_DS_TEMPLATE_FILE" if template_file is not None else "WFS_DS_TEMPLATE"
    template = _parsed({name: template_file or env.get("WFS_DS_TEMPLATE", "")}, name, _template, None)
    return {
        "durable_prefix": env.get("WFS_DS_PREFIX", "/api/durable-streams"),
        "durable_anonymous": env.get("WFS_DS_ANONYMOUS", "").lower() in ("1", "true", "yes"),
        "durable_run_id": env.get("WFS_DS_RUN_ID", "durable-streams"),
        "durable_template": template,
        "durable_long_poll_seconds": _parsed(env, "WFS_DS_LONG_POLL_SECONDS", _number(float), 10.0),
        "durable_sse_seconds": _parsed(env, "WFS_DS_SSE_SECONDS", _number(float), 60.0),
    }


def _templates_raw(env: Mapping[str, str]) -> tuple[str, Any] | None:
    """The configured pins templates (``WFS_PINS_TEMPLATES_FILE``, YAML or JSON by its extension, or
    ``WFS_PINS_TEMPLATES``, JSON) and the setting they came from; None when neither is set."""
    path = env.get("WFS_PINS_TEMPLATES_FILE")
    if path:
        text = _file("WFS_PINS_TEMPLATES_FILE", env) or ""
        if path.endswith((".yaml", ".yml")):
            try:
                return "WFS_PINS_TEMPLATES_FILE", yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise SettingsError("WFS_PINS_TEMPLATES_FILE", f"WFS_PINS_TEMPLATES_FILE: {path}: {exc}") from None
        name = "WFS_PINS_TEMPLATES_FILE"
        return name, _parsed({name: text}, name, _any_json, None)
    inline = env.get("WFS_PINS_TEMPLATES")
    if inline:
        return "WFS_PINS_TEMPLATES", _parsed(env, "WFS_PINS_TEMPLATES", _any_json, None)
    return None


def _any_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None


def _template(text: str) -> dict[str, Any] | None:
    return _json_object(text, "a JSON object of pins")


def _cidrs(text: str) -> dict[str, list[str]]:
    raw = _json_object(text, "a JSON object of region -> list of CIDRs")
    if not all(isinstance(v, list) and all(isinstance(c, str) for c in v) for v in raw.values()):
        raise ValueError("each region maps to a list of CIDRs")
    return raw


@dataclass(frozen=True)
class Settings:
    database_url: str
    host: str = "127.0.0.1"
    port: int = 8080
    tokens: Mapping[str, Principal] = field(default_factory=dict)
    region: str = "local"
    # the region of this data plane's Postgres: definitions whose metadata home differs are refused
    metadata_region: str | None = None
    # region -> client CIDRs, to tell which region a caller is in
    region_cidrs: Mapping[str, list[str]] = field(default_factory=dict)
    # proxies whose X-Forwarded-For is believed
    trusted_proxies: list[str] = field(default_factory=list)
    pool_min: int = 2
    pool_max: int = 20
    # how often the retention pruner sweeps (0 disables it in this process)
    prune_interval_seconds: float = 30.0
    sse_heartbeat_seconds: float = 15.0
    # subscriptions end after this long and clients resume elsewhere: keeps replicas balanced
    sse_max_connection_seconds: float = 3600.0
    max_request_bytes: int = 4 * 1024 * 1024
    # a JSON body must arrive within this long; an upload may stall no longer than this between chunks
    body_timeout_seconds: float = 10.0
    # open subscriptions per principal on one replica
    sse_max_per_principal: int = 100
    # the workflow wait service that input records are delivered to (unset: no dispatcher here)
    wait_service_url: str | None = None
    worker_lease_seconds: float = 15.0
    delivery_timeout_seconds: float = 5.0
    delivery_backoff_base_seconds: float = 0.5
    delivery_max_attempts: int = 25
    # object store per object region (unset: the objects API answers 421 object_region_unavailable)
    s3_regions: Mapping[str, RegionConfig] = field(default_factory=dict)
    # why there is no object store yet, when more is known than "none is configured": the detail of the
    # objects API's 421 (`workflow-streams dev` while MinIO is still being built)
    objects_pending: str | None = None
    # orphan expiry and deletion sweep interval (0 disables it in this process)
    janitor_interval_seconds: float = 10.0
    # the janitor purges deletion-outbox rows this long after their object was deleted: long enough to
    # answer "what happened to that object" for a week, short enough that the table stays small
    deletion_outbox_retention_seconds: float = 7 * 24 * 3600.0
    # Kubernetes service-account tokens through TokenReview (unset: static tokens only)
    kube_auth: KubeAuthSettings | None = None
    # backlog and outbox gauges are sampled from Postgres this often
    metrics_sample_seconds: float = 15.0
    # how the LISTEN connection names itself in pg_stat_activity
    listen_application_name: str = "wfs-listen"
    # the Durable Streams protocol surface (api/durable): where it is mounted ("" leaves it out)
    durable_prefix: str = "/api/durable-streams"
    # callers without an Authorization header may use that surface (`workflow-streams dev` allows it)
    durable_anonymous: bool = False
    # the run that single-segment stream names belong to: <name> is (durable_run_id, name)
    durable_run_id: str = "durable-streams"
    # pins of streams created through the surface ($creator: the creating principal); None: built in
    durable_template: Mapping[str, Any] | None = None
    # how long a long-poll waits for records before answering 204
    durable_long_poll_seconds: float = 10.0
    # SSE connections end after this long; clients resume at their last offset (PROTOCOL.md 8.2)
    durable_sse_seconds: float = 60.0
    # "transaction" behind PgBouncer or another transaction pooler (store.db says what changes)
    database_pooler: Pooler = "none"
    # how long a request waits for Postgres (connect, a pooled connection, statements) before a 503
    database_timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    # a direct DSN (no pooler) for LISTEN/NOTIFY; unset: database_url
    listen_database_url: str | None = None
    # how other processes' commits wake this one: "listen" (LISTEN/NOTIFY, plus a slow head poll as a
    # safety net) or "poll" (head polling only: behind a transaction pooler without a direct DSN)
    wake_source: str = "listen"
    # how often watched streams' heads are polled (None: 1 s with LISTEN, 0.2 s in poll-only mode)
    wake_poll_seconds: float | None = None
    # serving processes sharing the port (SO_REUSEPORT); 0 = one per core
    workers: int = 1
    # named pins templates (domain.templates), as configured; None: the built-in default only
    pins_templates: Mapping[str, Any] | None = None

    @property
    def served(self) -> Served:
        """What this data plane serves, which new definitions' pins must meet (domain.admission)."""
        return Served(self.region, tuple(self.region_cidrs), tuple(self.s3_regions))

    @functools.cached_property
    def templates(self) -> Templates:
        """The pins templates over the built-in base for this data plane's regions."""
        base = base_template(self.region, self.metadata_region, list(self.s3_regions))
        return parse_templates(self.pins_templates if self.pins_templates is not None else {}, base)

    @property
    def connecting(self) -> Connecting:
        return Connecting(pooler=self.database_pooler, timeout_seconds=self.database_timeout_seconds)

    @property
    def listen_url(self) -> str:
        return self.listen_database_url or self.database_url

    @property
    def head_poll_seconds(self) -> float:
        if self.wake_poll_seconds is not None:
            return self.wake_poll_seconds
        return 0.2 if self.wake_source == "poll" else 1.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """Settings from ``WFS_*``; a missing or malformed one is a ``SettingsError`` naming it."""
        none: dict[str, Principal] = {}
        tokens_file = _file("WFS_TOKENS_FILE", env) or ""
        tokens = {
            **_parsed({"WFS_TOKENS_FILE": tokens_file}, "WFS_TOKENS_FILE", parse_tokens, none),
            **_parsed(env, "WFS_TOKENS", parse_tokens, none),
        }
        database_url = env.get("WFS_DATABASE_URL")
        if not database_url:
            raise SettingsError(
                "WFS_DATABASE_URL", "WFS_DATABASE_URL is required (a postgresql:// DSN)", code="missing_setting"
            )
        pooler = _pooler(env.get("WFS_DATABASE_POOLER", "none"))
        listen_url = env.get("WFS_LISTEN_DATABASE_URL") or None
        integer, number = _number(int), _number(float)
        settings = cls(
            database_url=database_url,
            host=env.get("WFS_HOST", "127.0.0.1"),
            port=_parsed(env, "WFS_PORT", integer, 8080),
            tokens=tokens,
            region=env.get("WFS_REGION", "local"),
            metadata_region=env.get("WFS_METADATA_REGION") or None,
            region_cidrs=_parsed(env, "WFS_REGION_CIDRS", _cidrs, {}),
            trusted_proxies=[p for p in env.get("WFS_TRUSTED_PROXIES", "").split(",") if p],
            pool_min=_parsed(env, "WFS_POOL_MIN", integer, 2),
            pool_max=_parsed(env, "WFS_POOL_MAX", integer, 20),
            prune_interval_seconds=_parsed(env, "WFS_PRUNE_INTERVAL_SECONDS", number, 30.0),
            body_timeout_seconds=_parsed(env, "WFS_BODY_TIMEOUT_SECONDS", number, 10.0),
            sse_max_per_principal=_parsed(env, "WFS_SSE_MAX_PER_PRINCIPAL", integer, 100),
            sse_heartbeat_seconds=_parsed(env, "WFS_SSE_HEARTBEAT_SECONDS", number, 15.0),
            sse_max_connection_seconds=_parsed(env, "WFS_SSE_MAX_CONNECTION_SECONDS", number, 3600.0),
            wait_service_url=env.get("WFS_WAIT_SERVICE_URL") or None,
            s3_regions=_parsed(env, "WFS_S3_REGIONS", parse_regions, {}),
            janitor_interval_seconds=_parsed(env, "WFS_JANITOR_INTERVAL_SECONDS", number, 10.0),
            deletion_outbox_retention_seconds=_parsed(
                env, "WFS_DELETION_OUTBOX_RETENTION_SECONDS", number, 7 * 24 * 3600.0
            ),
            kube_auth=kube_auth_from_env(env),
            worker_lease_seconds=_parsed(env, "WFS_WORKER_LEASE_SECONDS", number, 15.0),
            delivery_timeout_seconds=_parsed(env, "WFS_DELIVERY_TIMEOUT_SECONDS", number, 5.0),
            delivery_backoff_base_seconds=_parsed(env, "WFS_DELIVERY_BACKOFF_BASE_SECONDS", number, 0.5),
            delivery_max_attempts=_parsed(env, "WFS_DELIVERY_MAX_ATTEMPTS", integer, 25),
            **durable_from_env(env),
            database_pooler=pooler,
            database_timeout_seconds=_parsed(env, "WFS_DATABASE_TIMEOUT_SECONDS", number, DEFAULT_TIMEOUT_SECONDS),
            listen_database_url=listen_url,
            wake_source=_wake_source(env.get("WFS_WAKE_SOURCE") or None, pooler, listen_url),
            wake_poll_seconds=_parsed(env, "WFS_WAKE_POLL_SECONDS", number, None),
            workers=_parsed(env, "WFS_WORKERS", integer, 0),
        )
        templates = _templates_raw(env)
        if templates is not None:
            name, raw = templates
            settings = dataclasses.replace(settings, pins_templates=raw)
            try:
                settings.templates  # noqa: B018  (resolves each template once: a bad one stops the start)
            except ValueError as exc:
                raise SettingsError(name, f"{name}: {exc}") from None
        return settings
