"""Kopf handlers: WorkflowStream -> Postgres definition + bucket policies; StreamLegalHold -> holds.

Shared resources (the Postgres pool, S3 clients) live in ``memo``, opened at start-up and closed at
cleanup. Transient failures raise ``kopf.TemporaryError`` (Kopf retries with the given delay);
definitions that can never be valid raise ``kopf.PermanentError``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Mapping
from typing import Any

import kopf
import prometheus_client
from botocore.exceptions import BotoCoreError, ClientError

from workflow_streams.adapters.objectstore import ObjectStore
from workflow_streams.domain.admission import refusal
from workflow_streams.domain.authz import Trusted
from workflow_streams.domain.errors import NotFound, OwnedElsewhere, PinsConflict, StreamError, StreamHeld
from workflow_streams.domain.ownership import ADOPT_ANNOTATION, Owner, check_run_prefix
from workflow_streams.domain.pins import StreamPins
from workflow_streams.domain.placement import check_metadata_home
from workflow_streams.domain.templates import NAMESPACE_CREATOR, Templates
from workflow_streams.runtime.holds import apply_legal_hold
from workflow_streams.store import definitions, notify
from workflow_streams.store.db import DB_UNAVAILABLE, create_pool

from . import bucketpolicy, peering
from .conditions import set_condition
from .convert import pins_from_spec
from .settings import OperatorSettings

GROUP, VERSION = "workflowstreams.dev", "v1alpha1"
STREAMS, HOLDS = "workflowstreams", "streamlegalholds"
OPERATOR = "system:workflow-streams-operator"
RETRY_SECONDS = 5
S3_ERRORS = (ClientError, BotoCoreError)
RECONCILES = prometheus_client.Counter(
    "wfs_operator_reconciles_total", "WorkflowStream reconciles by outcome", ["resource", "outcome"]
)
HOLDS_APPLIED = prometheus_client.Counter("wfs_operator_holds_total", "Legal holds placed or released", ["action"])


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    # every setting is read once, here; handlers use memo.settings and never os.environ
    config = memo.settings = OperatorSettings.from_env()
    # HA: every replica peers; only the highest priority one handles events, the others stand by
    settings.peering.name = config.peering_name
    settings.peering.clusterwide = config.namespace is None
    settings.peering.mandatory = True
    settings.peering.priority = config.peering_priority
    settings.peering.lifetime = config.peering_lifetime
    settings.persistence.finalizer = "workflowstreams.dev/finalizer"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    memo.pool = await create_pool(
        config.shared.database_url,
        min_size=1,
        max_size=5,
        connecting=config.shared.connecting,
        application_name="wfs-operator",
    )
    regions = dict(config.shared.s3_regions)
    memo.object_store = None
    if regions:
        memo.object_store = ObjectStore(regions)
        await memo.object_store.open()
    memo.bucket_locks = collections.defaultdict(asyncio.Lock)
    # (run_id, stream_id) -> set when the stream's hold state may have changed (report_legal_hold)
    memo.hold_changes = collections.defaultdict(asyncio.Event)
    if config.metrics_port:
        prometheus_client.start_http_server(config.metrics_port)
    # Kopf peers once this returns: the peering object must exist by then for replicas to see each other
    await peering.ensure_peering(config, settings, logger)
    logger.info("operator ready: %d object regions", len(regions))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("object_store") is not None:
        await memo.object_store.close()
    if memo.get("pool") is not None:
        await memo.pool.close()


@kopf.index(GROUP, VERSION, STREAMS)
def stream_ids(
    namespace: str | None, name: str, uid: str | None, spec: kopf.Spec, **_: Any
) -> dict[tuple[str | None, str], tuple[str, str, str]]:
    """(namespace, name) -> (runId, streamId, uid), so holds can find their stream, and act only as its
    owner object, without an API call."""
    return {(namespace, name): (spec["runId"], spec["streamId"], uid or "")}


def _owner(namespace: str | None, name: str, uid: str | None) -> Owner:
    """The object as a stream's owner. The operator watches namespaced objects, so a namespace is there."""
    return Owner(namespace or "", name, uid or "")


def resolve_pins(spec: Mapping[str, Any], namespace: str, templates: Templates) -> StreamPins:
    """A WorkflowStream's pins: ``spec.pins`` whole, or ``spec.template`` (default: the default template)
    with ``spec.pins`` merged over it, for every service account of the object's namespace as creator."""
    raw = spec.get("pins")
    pins = pins_from_spec(raw) if raw is not None else None
    return templates.requested(spec.get("template"), pins, NAMESPACE_CREATOR.format(namespace=namespace), namespace)


def _conditions(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in status.get("conditions", [])]


@kopf.on.resume(GROUP, VERSION, STREAMS)
@kopf.on.create(GROUP, VERSION, STREAMS)
@kopf.on.update(GROUP, VERSION, STREAMS)
async def reconcile_stream(
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    uid: str | None,
    **_: Any,
) -> None:
    generation = meta.get("generation")
    conditions = _conditions(status)
    run_id, stream_id = spec["runId"], spec["streamId"]
    settings = memo.settings
    owner = _owner(namespace, name, uid)

    def mark(type_: str, ok: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, type_, ok, reason, message, generation)
        patch.status["conditions"] = conditions
        patch.status["observedGeneration"] = generation

    try:
        check_run_prefix(run_id, settings.run_prefix, owner.namespace)
        pins = resolve_pins(spec, owner.namespace, settings.shared.templates)
        check_metadata_home(pins, settings.shared.metadata_region)
        adopt = settings.adopt and meta.get("annotations", {}).get(ADOPT_ANNOTATION) == "true"
        async with memo.pool.acquire() as conn:
            definition, created = await definitions.create_definition(
                conn,
                run_id,
                stream_id,
                pins,
                Trusted(OPERATOR, owner),
                refusal=refusal(pins, settings.shared.served),
                adopt=adopt,
            )
    except (PinsConflict, StreamError) as exc:
        reason, detail = _reason(exc.code), exc.explained()
        mark("DefinitionSynced", False, reason, detail)
        mark("Ready", False, reason if isinstance(exc, OwnedElsewhere) else "DefinitionNotSynced", detail)
        RECONCILES.labels("workflowstream", "permanent_error").inc()
        kopf.warn(body, reason=reason, message=detail)
        raise kopf.PermanentError(f"{exc.code}: {detail}") from None
    except DB_UNAVAILABLE as exc:
        mark("DefinitionSynced", False, "DatabaseUnavailable", str(exc))
        mark("Ready", False, "DefinitionNotSynced", "waiting for the database")
        raise kopf.TemporaryError(f"database unavailable: {exc}", delay=RETRY_SECONDS) from None
    patch.status["pinsDigest"] = definition.pins_digest
    # what the deletion needs when spec.pins does not hold them whole (a template)
    patch.status["objectRegions"] = list(definition.pins.placement.object_regions)
    mark("DefinitionSynced", True, "Created" if created else "UpToDate", "the Postgres definition matches")

    try:
        placement = definition.pins.placement
        synced = await _sync_bucket_policies(
            memo, run_id, stream_id, placement.object_regions, placement.client_egress_regions
        )
    except (*S3_ERRORS, StreamError) as exc:
        mark("BucketPolicySynced", False, "ObjectStoreError", str(exc))
        mark("Ready", False, "BucketPolicyNotSynced", str(exc))
        raise kopf.TemporaryError(f"bucket policy: {exc}", delay=RETRY_SECONDS) from None
    mark("BucketPolicySynced", True, "Applied", f"residency statement on {synced} bucket(s)")
    mark("Ready", True, "Reconciled", "definition and bucket policies are in place")
    RECONCILES.labels("workflowstream", "ready").inc()
    memo.hold_changes[(run_id, stream_id)].set()  # (re)defined: report its hold state afresh


async def _sync_bucket_policies(
    memo: kopf.Memo, run_id: str, stream_id: str, object_regions: list[str], egress_regions: list[str]
) -> int:
    object_store: ObjectStore | None = memo.object_store
    if object_store is None:
        return 0
    for region in object_regions:
        bucket = object_store.bucket(region)  # ObjectRegionUnavailable if this region has no object store
        async with memo.bucket_locks[bucket]:
            policy = await object_store.bucket_policy(region)
            statement = bucketpolicy.stream_statement(
                bucket, run_id, stream_id, egress_regions, memo.settings.shared.region_cidrs
            )
            await object_store.put_bucket_policy(region, bucketpolicy.with_statement(policy, statement))
    return len(object_regions)


@kopf.on.delete(GROUP, VERSION, STREAMS)
async def delete_stream(
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    namespace: str | None,
    name: str,
    uid: str | None,
    **_: Any,
) -> None:
    """Close the stream and schedule its objects for deletion; blocked while a legal hold exists. Only
    the stream's owner deletes it: an object refused as another's claimant goes without touching it."""
    run_id, stream_id = spec["runId"], spec["streamId"]
    try:
        async with memo.pool.acquire() as conn:
            deleted = await definitions.delete_stream(
                conn, run_id, stream_id, Trusted(OPERATOR, _owner(namespace, name, uid))
            )
            # committed: the replicas' subscribers see the stream end (the operator has no wake hub)
            await notify.send(conn, deleted.signals, sender="operator")
        queued = deleted.value
    except OwnedElsewhere as exc:
        logger.info("stream %s/%s left as it is: %s", run_id, stream_id, exc.detail)
        return
    except StreamHeld as exc:
        patch.status["conditions"] = set_condition(
            _conditions(status), "Deleting", False, "LegalHold", exc.detail, meta.get("generation")
        )
        raise kopf.TemporaryError(f"deletion blocked: {exc.detail}", delay=RETRY_SECONDS) from None
    except DB_UNAVAILABLE as exc:
        raise kopf.TemporaryError(f"database unavailable: {exc}", delay=RETRY_SECONDS) from None
    logger.info("stream %s/%s deleted; %d objects queued for deletion", run_id, stream_id, len(queued))
    object_store: ObjectStore | None = memo.object_store
    regions = status.get("objectRegions") or (spec.get("pins") or {}).get("placement", {}).get("objectRegions", [])
    if object_store is not None:
        sid = bucketpolicy.statement_id(run_id, stream_id)
        for region in regions:
            try:
                bucket = object_store.bucket(region)
                async with memo.bucket_locks[bucket]:
                    policy = await object_store.bucket_policy(region)
                    await object_store.put_bucket_policy(region, bucketpolicy.without_statement(policy, sid))
            except (*S3_ERRORS, StreamError) as exc:
                logger.warning("could not remove the bucket policy statement in %s: %s", region, exc)


# How often a stream's hold state is re-read when nothing announced a change: holds placed through the
# HTTP API are seen by then. The operator's own hold and release writes, and each reconcile, report at
# once (memo.hold_changes), so the steady cost is one small query per stream per interval, not per 2 s.
HOLD_REPORT_SECONDS = 60.0


@kopf.timer(GROUP, VERSION, STREAMS, interval=0.5, idle=0)
async def report_legal_hold(
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """Mirror the stream's hold state into its LegalHold condition (holds are separate objects).

    Each run first waits for news: an announced change (the operator's own hold/release of this stream,
    or its reconcile) or ``HOLD_REPORT_SECONDS`` of quiet. Kopf applies the patch when the run returns.
    """
    stopped: kopf.DaemonStopped = kwargs["stopped"]  # timers get it as daemons do; TimerFn does not name it
    key = (spec["runId"], spec["streamId"])
    changed: asyncio.Event = memo.hold_changes[key]
    if _current_condition(status) is not None and not await _news(changed, stopped):
        return  # stopping: the stream is being deleted or the operator is shutting down
    changed.clear()
    try:
        async with memo.pool.acquire() as conn:
            found = await definitions.ownership(conn, key[0], key[1])
    except DB_UNAVAILABLE:
        return
    conditions = _conditions(status)
    owner = _owner(kwargs.get("namespace"), kwargs["name"], kwargs.get("uid"))
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    owned = found.owner == owner
    # Ready only while Postgres holds this object's definition (a database restored from a backup, a
    # stream deleted by hand); a claimant refused as another's was never Ready
    if not owned and ready is not None and ready.get("status") == "True":
        reason = "DefinitionMissing" if not found.exists else "OwnedElsewhere"
        message = (
            f"Postgres has no definition of {key[0]}/{key[1]}"
            if not found.exists
            else f"{key[0]}/{key[1]} belongs to {found.owner.describe() if found.owner else 'the HTTP API'}"
        )
        conditions = set_condition(conditions, "Ready", False, reason, message, meta.get("generation"))
        patch.status["conditions"] = conditions
        kopf.warn(kwargs["body"], reason=reason, message=message)
    held = owned and found.held  # another's holds are not this object's to show
    current = _current_condition(status)
    message = "a legal hold stops pruning and deletion" if held else "no legal hold"
    if not owned:
        message = "no legal hold of this object's: it owns no stream (see Ready)"
    if current is None or current.get("status") != ("True" if held else "False") or current.get("message") != message:
        patch.status["conditions"] = set_condition(
            conditions, "LegalHold", held, "Held" if held else "NotHeld", message, meta.get("generation")
        )


def _current_condition(status: kopf.Status) -> dict[str, Any] | None:
    return next((c for c in _conditions(status) if c.get("type") == "LegalHold"), None)


async def _news(changed: asyncio.Event, stopped: kopf.DaemonStopped) -> bool:
    """Wait until ``changed`` is set or the report interval passed: True; False once ``stopped``."""
    news = asyncio.ensure_future(changed.wait())
    stop = asyncio.ensure_future(stopped.wait(HOLD_REPORT_SECONDS))
    try:
        await asyncio.wait({news, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        news.cancel()
        stop.cancel()
    return not stopped


def _hold_target(spec: kopf.Spec, namespace: str | None, stream_ids: kopf.Index[Any, Any]) -> tuple[str, str, str]:
    key = (namespace, spec["streamRef"]["name"])
    if key not in stream_ids:
        raise kopf.TemporaryError(f"WorkflowStream {key[1]!r} not found in {namespace}", delay=RETRY_SECONDS)
    (ids,) = stream_ids[key]
    return ids  # type: ignore[no-any-return]


def _requester(spec: kopf.Spec, namespace: str | None, uid: str) -> Trusted:
    """Who asked for the hold, as recorded: Kubernetes RBAC on StreamLegalHold objects authorized it,
    not the stream's pins, for the WorkflowStream it names, which must own the stream."""
    return Trusted(spec["requestedBy"], _owner(namespace, spec["streamRef"]["name"], uid))


def hold_id(namespace: str | None, name: str) -> str:
    return f"k8s.{namespace}.{name}"


@kopf.on.resume(GROUP, VERSION, HOLDS)
@kopf.on.create(GROUP, VERSION, HOLDS)
async def place_hold(
    spec: kopf.Spec,
    name: str,
    namespace: str | None,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    run_id, stream_id, uid = _hold_target(spec, namespace, kwargs["stream_ids"])
    reason = f"matter {spec['matterId']}: {spec['reason']}"
    requester = _requester(spec, namespace, uid)
    try:
        await apply_legal_hold(
            memo.pool, memo.object_store, run_id, stream_id, hold_id(namespace, name), True, reason, requester
        )
    except OwnedElsewhere as exc:
        message = f"WorkflowStream {spec['streamRef']['name']} does not own {run_id}/{stream_id}: {exc.detail}"
        patch.status["conditions"] = set_condition(
            [], "Applied", False, "OwnedElsewhere", message, meta.get("generation")
        )
        kopf.warn(kwargs["body"], reason="OwnedElsewhere", message=message)
        raise kopf.PermanentError(f"owned_elsewhere: {message}") from None
    except NotFound:
        raise kopf.TemporaryError("the stream has no definition yet", delay=RETRY_SECONDS) from None
    except (*DB_UNAVAILABLE, *S3_ERRORS) as exc:
        raise kopf.TemporaryError(f"hold not yet applied: {exc}", delay=RETRY_SECONDS) from None
    HOLDS_APPLIED.labels("place").inc()
    memo.hold_changes[(run_id, stream_id)].set()
    patch.status["conditions"] = set_condition(
        [], "Applied", True, "Held", f"stream {run_id}/{stream_id} is held", meta.get("generation")
    )


@kopf.on.delete(GROUP, VERSION, HOLDS)
async def release_hold(
    spec: kopf.Spec,
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    stream_ids: kopf.Index[Any, Any] = kwargs["stream_ids"]  # Kopf passes indices by their name
    key = (namespace, spec["streamRef"]["name"])
    if key not in stream_ids:
        logger.info("hold %s: its stream is gone; nothing to release", name)
        return
    (ids,) = stream_ids[key]
    try:
        await apply_legal_hold(
            memo.pool,
            memo.object_store,
            ids[0],
            ids[1],
            hold_id(namespace, name),
            False,
            "",
            _requester(spec, namespace, ids[2]),
        )
    except (NotFound, OwnedElsewhere):  # nothing of this hold's is on a stream its object does not own
        return
    except (*DB_UNAVAILABLE, *S3_ERRORS) as exc:
        raise kopf.TemporaryError(f"hold not yet released: {exc}", delay=RETRY_SECONDS) from None
    memo.hold_changes[(ids[0], ids[1])].set()


def _reason(code: str) -> str:
    """problem codes (snake_case) as condition reasons (CamelCase)."""
    return "".join(part.capitalize() for part in code.split("_"))


def run() -> None:
    """``workflow-streams operator``: all namespaces, or only ``WFS_OPERATOR_NAMESPACE``; peering for HA."""
    kopf.configure(verbose=False)
    # before Kopf starts: which namespaces to watch is decided at run(), ahead of the start-up handler
    namespace = OperatorSettings.from_env().namespace
    if namespace:
        kopf.run(namespaces=[namespace])
    else:
        kopf.run(clusterwide=True)
