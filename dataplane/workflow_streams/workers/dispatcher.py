"""The input-delivery dispatcher: outbox rows -> deterministic events -> the workflow wait service.

Every replica runs one. A replica claims whole streams (a lease in wfs_worker_claims), delivers each
stream's rows strictly in sequence, renews the lease before every delivery, and keeps attempts, next
attempt time and last error in Postgres. Delivery is at least once with a stable event id.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import uuid
from dataclasses import dataclass

import aiohttp
import asyncpg

from ..adapters import metrics
from ..adapters.wire import record_json
from ..domain.delivery import Outcome, backoff_seconds, classify, event_body
from ..runtime import wakes
from ..runtime.durability import Durability
from ..store import claims, db, deliveries
from ..store.db import DB_UNAVAILABLE

log = logging.getLogger(__name__)

KIND = "dispatch"


@dataclass(frozen=True)
class DispatchSettings:
    url: str
    lease_seconds: float = 15.0
    request_timeout_seconds: float = 5.0
    poll_seconds: float = 1.0
    backoff_base_seconds: float = 0.5
    backoff_cap_seconds: float = 300.0
    max_attempts: int = 25
    concurrency: int = 8
    batch: int = 50


def holder_id() -> str:
    """Names this replica in claims: readable in SQL, unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Dispatcher:
    def __init__(self, pool: db.Pool, hub: wakes.WakeHub, durability: Durability, settings: DispatchSettings) -> None:
        self.pool = pool
        self.hub = hub
        self.durability = durability
        self.settings = settings
        self.holder = holder_id()
        self.lease = dt.timedelta(seconds=settings.lease_seconds)

    async def run(self) -> None:
        """Deliver until cancelled; a lost database raises, for the supervisor to restart (claims whose
        holder stopped renewing are taken over by whoever claims next, this replica included)."""
        timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout_seconds)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            with self.hub.watch_kind(wakes.INPUTS) as wake:
                while True:
                    wake.clear()
                    if not await self._tick(http):
                        await wake.wait(self.settings.poll_seconds)

    async def _tick(self, http: aiohttp.ClientSession) -> bool:
        """Claim what is due (taken-over leases first) and deliver it; True if anything was claimed."""
        limit = self.settings.concurrency
        async with self.pool.acquire() as conn:
            keys = await claims.take_over_expired(conn, KIND, self.holder, self.lease, limit)
            metrics.WORKER_CLAIMS.labels(KIND, "takeover").inc(len(keys))
            if len(keys) < limit:
                due = await deliveries.due_streams(conn, KIND, limit - len(keys))
                fresh = await claims.claim(conn, KIND, self.holder, self.lease, due)
                metrics.WORKER_CLAIMS.labels(KIND, "new").inc(len(fresh))
                keys += fresh
        if keys:
            await asyncio.gather(*(self._deliver_stream(http, key) for key in keys))
        return bool(keys)

    async def _deliver_stream(self, http: aiohttp.ClientSession, key: str) -> None:
        run_id, stream_id = claims.split_stream_key(key)
        try:
            while await self._deliver_batch(http, run_id, stream_id):
                pass
        except DB_UNAVAILABLE as exc:
            log.warning("dispatcher: lost the database while delivering %s: %s", key, exc)
            return  # the lease expires and the stream is taken over (maybe by us)
        async with self.pool.acquire() as conn:
            await claims.release(conn, KIND, key, self.holder)

    async def _deliver_batch(self, http: aiohttp.ClientSession, run_id: str, stream_id: str) -> bool:
        """Deliver the stream's head rows in order; True if there may be more to do right away."""
        key = claims.stream_key(run_id, stream_id)
        async with self.pool.acquire() as conn:
            rows = await deliveries.head(conn, run_id, stream_id, self.settings.batch)
        read_at = self.durability.tick()
        if rows:
            # an event delivered is never taken back: only records as durable as an acknowledged append
            # (runtime.durability); a failover could give an unconfirmed one's sequence to another record
            until = asyncio.get_running_loop().time() + self.pool.connecting.timeout_seconds
            last = rows[-1].record.sequence
            if not await self.durability.covers(run_id, stream_id, last, read_at, rows[-1].timeline, until):
                return False
        for row in rows:
            if row.state == "failed" or not row.due:
                return False  # a failed head blocks the stream; a backing-off head waits
            async with self.pool.acquire() as conn:
                if not await claims.renew(conn, KIND, key, self.holder, self.lease):
                    log.warning("dispatcher: lease on %s lost; another replica continues", key)
                    return False
            outcome, error = await self._post(http, run_id, stream_id, row)
            async with self.pool.acquire() as conn:
                await self._record(conn, run_id, stream_id, row, outcome, error)
            if outcome is not Outcome.DELIVERED:
                return False
        return len(rows) == self.settings.batch

    async def _record(
        self,
        conn: asyncpg.Connection,
        run_id: str,
        stream_id: str,
        row: deliveries.Undelivered,
        outcome: Outcome,
        error: str,
    ) -> None:
        sequence, attempts = row.record.sequence, row.attempts + 1
        metrics.DELIVERIES.labels(outcome.value).inc()
        if outcome is Outcome.DELIVERED:
            await deliveries.mark_delivered(conn, run_id, stream_id, sequence)
        elif outcome is Outcome.PERMANENT or attempts >= self.settings.max_attempts:
            await deliveries.mark_failed(conn, run_id, stream_id, sequence, error)
            log.error("dispatcher: %s/%s/%d failed permanently: %s", run_id, stream_id, sequence, error)
        else:
            delay = backoff_seconds(attempts, self.settings.backoff_base_seconds, self.settings.backoff_cap_seconds)
            await deliveries.mark_retry(conn, run_id, stream_id, sequence, dt.timedelta(seconds=delay), error)
            log.info(
                "dispatcher: %s/%s/%d attempt %d failed (%s); next in %.2fs",
                run_id,
                stream_id,
                sequence,
                attempts,
                error,
                delay,
            )

    async def _post(
        self, http: aiohttp.ClientSession, run_id: str, stream_id: str, row: deliveries.Undelivered
    ) -> tuple[Outcome, str]:
        body = event_body(run_id, stream_id, row.record.sequence, record_json(row.record))
        try:
            async with http.post(self.settings.url, json=body, headers={"Idempotency-Key": body["event_id"]}) as resp:
                await resp.read()
                return classify(resp.status), f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return Outcome.RETRY, f"{type(exc).__name__}: {exc}"
