"""Legal holds end to end: Postgres first (pruning and deletion stop at once), then S3 Object Lock.

One function for the HTTP API and the operator alike. It trusts no caller: ``store.definitions`` checks
the ``legal_hold`` right on the stream row it locks (the operator passes ``Trusted``, as Kubernetes RBAC on
StreamLegalHold objects authorized it).
"""

from __future__ import annotations

from ..adapters.objectstore import ObjectStore
from ..domain.authz import Caller
from ..store import db, definitions, objects
from ..store.definitions import StreamState


async def apply_legal_hold(
    pool: db.Pool,
    object_store: ObjectStore | None,
    run_id: str,
    stream_id: str,
    hold_id: str,
    enabled: bool,
    reason: str,
    caller: Caller,
) -> StreamState:
    async with pool.acquire() as conn:
        state = await definitions.set_legal_hold(conn, run_id, stream_id, hold_id, enabled, reason, caller)
        keys = await objects.stream_objects(conn, run_id, stream_id) if object_store is not None else []
    held = bool(state.holds)
    for region, key in keys:
        assert object_store is not None
        await object_store.set_legal_hold(region, key, held)
    return state
