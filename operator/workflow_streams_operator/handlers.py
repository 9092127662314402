"""Kopf handlers: WorkflowStream -> Postgres definition + bucket policies; StreamLegalHold -> holds.

Shared resources (the Postgres pool, S3 clients) live in ``memo``, opened at start-up and closed at
cleanup. Transient failures raise ``kopf.TemporaryError`` (Kopf retries with the given delay);
definitions that can never be valid raise ``kopf.PermanentError``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import random
from collections.abc import Mapping
from typing import Any

import kopf
import prometheus_client
from botocore.exceptions import BotoCoreError, ClientError

from workflow_streams.config import parse_regions
from workflow_streams.domain.authz import Trusted
from workflow_streams.domain.errors import NotFound, PinsConflict, StreamError, StreamHeld
from workflow_streams.domain.pins import parse_pins
from workflow_streams.domain.placement import check_metadata_home
from workflow_streams.holds import apply_legal_hold
from workflow_streams.objectstore import ObjectStore
from workflow_streams.store import definitions
from workflow_streams.store.db import DB_UNAVAILABLE, create_pool
from workflow_streams.store.retention import is_held

from . import bucketpolicy
from .conditions import set_condition
from .convert import pins_from_spec

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
    # HA: every replica peers; only the highest priority one handles events, the others stand by
    settings.peering.name = os.environ.get("WFS_OPERATOR_PEERING", "workflow-streams")
    settings.peering.clusterwide = not os.environ.get("WFS_OPERATOR_NAMESPACE")
    settings.peering.mandatory = True
    settings.peering.priority = int(os.environ.get("WFS_OPERATOR_PRIORITY", random.randint(1, 1_000_000)))
    settings.peering.lifetime = int(os.environ.get("WFS_OPERATOR_PEERING_LIFETIME", "30"))
    settings.persistence.finalizer = "workflowstreams.dev/finalizer"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    memo.pool = await create_pool(os.environ["WFS_DATABASE_URL"], min_size=1, max_size=5)
    regions = parse_regions(os.environ["WFS_S3_REGIONS"]) if os.environ.get("WFS_S3_REGIONS") else {}
    memo.store = None
    if regions:
        memo.store = ObjectStore(regions)
        await memo.store.open()
    memo.region_cidrs = json.loads(os.environ.get("WFS_REGION_CIDRS", "{}"))
    memo.bucket_locks = collections.defaultdict(asyncio.Lock)
    metrics_port = int(os.environ.get("WFS_OPERATOR_METRICS_PORT", "8081"))
    if metrics_port:
        prometheus_client.start_http_server(metrics_port)
    logger.info("operator ready: %d object regions", len(regions))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("store") is not None:
        await memo.store.close()
    if memo.get("pool") is not None:
        await memo.pool.close()


@kopf.index(GROUP, VERSION, STREAMS)
def stream_ids(
    namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[tuple[str | None, str], tuple[str, str]]:
    """(namespace, name) -> (runId, streamId), so holds can find their stream without an API call."""
    return {(namespace, name): (spec["runId"], spec["streamId"])}


def _conditions(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in status.get("conditions", [])]


@kopf.on.resume(GROUP, VERSION, STREAMS)
@kopf.on.create(GROUP, VERSION, STREAMS)
@kopf.on.update(GROUP, VERSION, STREAMS)
async def reconcile_stream(
    spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, **_: Any
) -> None:
    generation = meta.get("generation")
    conditions = _conditions(status)
    run_id, stream_id = spec["runId"], spec["streamId"]

    def mark(type_: str, ok: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, type_, ok, reason, message, generation)
        patch.status["conditions"] = conditions
        patch.status["observedGeneration"] = generation

    try:
        pins = parse_pins(pins_from_spec(spec["pins"]))
        check_metadata_home(pins, os.environ.get("WFS_METADATA_REGION") or None)
        async with memo.pool.acquire() as conn:
            definition, created = await definitions.create_definition(conn, run_id, stream_id, pins, Trusted(OPERATOR))
    except (PinsConflict, StreamError) as exc:
        mark("DefinitionSynced", False, _reason(exc.code), exc.detail)
        mark("Ready", False, "DefinitionNotSynced", exc.detail)
        RECONCILES.labels("workflowstream", "permanent_error").inc()
        raise kopf.PermanentError(f"{exc.code}: {exc.detail}") from None
    except DB_UNAVAILABLE as exc:
        mark("DefinitionSynced", False, "DatabaseUnavailable", str(exc))
        mark("Ready", False, "DefinitionNotSynced", "waiting for the database")
        raise kopf.TemporaryError(f"database unavailable: {exc}", delay=RETRY_SECONDS) from None
    patch.status["pinsDigest"] = definition.pins_digest
    mark("DefinitionSynced", True, "Created" if created else "UpToDate", "the Postgres definition matches")

    try:
        synced = await _sync_bucket_policies(
            memo, run_id, stream_id, pins.placement.object_regions, pins.placement.client_egress_regions
        )
    except (*S3_ERRORS, StreamError) as exc:
        mark("BucketPolicySynced", False, "ObjectStoreError", str(exc))
        mark("Ready", False, "BucketPolicyNotSynced", str(exc))
        raise kopf.TemporaryError(f"bucket policy: {exc}", delay=RETRY_SECONDS) from None
    mark("BucketPolicySynced", True, "Applied", f"residency statement on {synced} bucket(s)")
    mark("Ready", True, "Reconciled", "definition and bucket policies are in place")
    RECONCILES.labels("workflowstream", "ready").inc()


async def _sync_bucket_policies(
    memo: kopf.Memo, run_id: str, stream_id: str, object_regions: list[str], egress_regions: list[str]
) -> int:
    store: ObjectStore | None = memo.store
    if store is None:
        return 0
    for region in object_regions:
        bucket = store.bucket(region)  # ObjectRegionUnavailable if this region has no store
        async with memo.bucket_locks[bucket]:
            policy = await store.bucket_policy(region)
            statement = bucketpolicy.stream_statement(bucket, run_id, stream_id, egress_regions, memo.region_cidrs)
            await store.put_bucket_policy(region, bucketpolicy.with_statement(policy, statement))
    return len(object_regions)


@kopf.on.delete(GROUP, VERSION, STREAMS)
async def delete_stream(
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Close the stream and schedule its objects for deletion; blocked while a legal hold exists."""
    run_id, stream_id = spec["runId"], spec["streamId"]
    try:
        async with memo.pool.acquire() as conn:
            queued = await definitions.delete_stream(conn, run_id, stream_id, Trusted(OPERATOR))
    except StreamHeld as exc:
        patch.status["conditions"] = set_condition(
            _conditions(status), "Deleting", False, "LegalHold", exc.detail, meta.get("generation")
        )
        raise kopf.TemporaryError(f"deletion blocked: {exc.detail}", delay=RETRY_SECONDS) from None
    except DB_UNAVAILABLE as exc:
        raise kopf.TemporaryError(f"database unavailable: {exc}", delay=RETRY_SECONDS) from None
    logger.info("stream %s/%s deleted; %d objects queued for deletion", run_id, stream_id, len(queued))
    store: ObjectStore | None = memo.store
    if store is not None:
        sid = bucketpolicy.statement_id(run_id, stream_id)
        for region in spec["pins"]["placement"]["objectRegions"]:
            try:
                bucket = store.bucket(region)
                async with memo.bucket_locks[bucket]:
                    policy = await store.bucket_policy(region)
                    await store.put_bucket_policy(region, bucketpolicy.without_statement(policy, sid))
            except (*S3_ERRORS, StreamError) as exc:
                logger.warning("could not remove the bucket policy statement in %s: %s", region, exc)


@kopf.timer(GROUP, VERSION, STREAMS, interval=2, idle=0)
async def report_legal_hold(
    spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, **_: Any
) -> None:
    """Mirror the stream's hold state into its LegalHold condition (holds are separate objects)."""
    try:
        async with memo.pool.acquire() as conn:
            held = await is_held(conn, spec["runId"], spec["streamId"])
    except DB_UNAVAILABLE:
        return
    conditions = _conditions(status)
    current = next((c for c in conditions if c.get("type") == "LegalHold"), None)
    if current is None or current.get("status") != ("True" if held else "False"):
        message = "a legal hold stops pruning and deletion" if held else "no legal hold"
        patch.status["conditions"] = set_condition(
            conditions, "LegalHold", held, "Held" if held else "NotHeld", message, meta.get("generation")
        )


def _hold_target(spec: kopf.Spec, namespace: str | None, stream_ids: kopf.Index[Any, Any]) -> tuple[str, str]:
    key = (namespace, spec["streamRef"]["name"])
    if key not in stream_ids:
        raise kopf.TemporaryError(f"WorkflowStream {key[1]!r} not found in {namespace}", delay=RETRY_SECONDS)
    (ids,) = stream_ids[key]
    return ids  # type: ignore[no-any-return]


def _requester(spec: kopf.Spec) -> Trusted:
    """Who asked for the hold, as recorded: Kubernetes RBAC on StreamLegalHold objects authorized it,
    not the stream's pins."""
    return Trusted(spec["requestedBy"])


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
    run_id, stream_id = _hold_target(spec, namespace, kwargs["stream_ids"])
    reason = f"matter {spec['matterId']}: {spec['reason']}"
    try:
        await apply_legal_hold(
            memo.pool, memo.store, run_id, stream_id, hold_id(namespace, name), True, reason, _requester(spec)
        )
    except NotFound:
        raise kopf.TemporaryError("the stream has no definition yet", delay=RETRY_SECONDS) from None
    except (*DB_UNAVAILABLE, *S3_ERRORS) as exc:
        raise kopf.TemporaryError(f"hold not yet applied: {exc}", delay=RETRY_SECONDS) from None
    HOLDS_APPLIED.labels("place").inc()
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
            memo.pool, memo.store, ids[0], ids[1], hold_id(namespace, name), False, "", _requester(spec)
        )
    except NotFound:
        return
    except (*DB_UNAVAILABLE, *S3_ERRORS) as exc:
        raise kopf.TemporaryError(f"hold not yet released: {exc}", delay=RETRY_SECONDS) from None


def _reason(code: str) -> str:
    """problem codes (snake_case) as condition reasons (CamelCase)."""
    return "".join(part.capitalize() for part in code.split("_"))


def run() -> None:
    """``workflow-streams operator``: all namespaces, or only ``WFS_OPERATOR_NAMESPACE``; peering for HA."""
    kopf.configure(verbose=False)
    namespace = os.environ.get("WFS_OPERATOR_NAMESPACE")
    if namespace:
        kopf.run(namespaces=[namespace])
    else:
        kopf.run(clusterwide=True)
