"""A workload that checks itself, for the tests and benchmarks that break things on purpose.

Producers append as a careful client does: every append carries an Idempotency-Key and is retried, with
the same key, on a 5xx or a lost connection, until acknowledged (201, or 200 replayed), so "acknowledged"
means what the API promises. Subscribers follow over SSE and resume with Last-Event-ID whenever their
connection ends, as a browser's EventSource does, each on a data plane of its own. ``check`` then reads
what is stored and compares: every acknowledged record is stored exactly once, and every subscriber saw
exactly the stored records, in order, no more (a record a later failover erased would show as a record
that is not stored at its sequence, or as a gap), no fewer.

Speaks HTTP only (aiohttp), like any client of the data plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .. import API_PREFIX

# a lost connection or an unanswered request, as a producer sees it: retried with its key
_TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


@dataclass
class Acknowledged:
    key: str
    stream: str
    sequence: int
    data: str


@dataclass
class Attempts:
    """What producers met on the way: per status (0 for no answer), and the slowest answer."""

    statuses: dict[int, int] = field(default_factory=dict)
    slowest: float = 0.0
    # (time.monotonic() it started, of its answer, status) of every attempt, for recovery times
    timeline: list[tuple[float, float, int]] = field(default_factory=list)

    def record(self, started: float, status: int) -> None:
        now = time.monotonic()
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.slowest = max(self.slowest, now - started)
        self.timeline.append((started, now, status))

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    def failed(self) -> int:
        return sum(n for status, n in self.statuses.items() if status == 0 or status >= 500)

    def first_success_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first answer acknowledging an append that started after it."""
        answers = [at for started, at, status in self.timeline if started >= moment and status in (200, 201)]
        return min(answers) - moment if answers else None


class Subscriber:
    """One SSE subscriber of one stream on one data plane, resuming with Last-Event-ID.

    A connection silent for ``idle_timeout`` seconds (several of the server's heartbeats) is taken for dead
    and resumed: a server that vanishes without closing its sockets (a pod deleted by force, a partition)
    sends no FIN to wait for. A connection not made within that time is tried again too: a SYN that nothing
    answers is retried by the kernel for about two minutes before the connect fails."""

    def __init__(
        self, session: aiohttp.ClientSession, base: str, run: str, stream: str, token: str, *, idle_timeout: float
    ) -> None:
        self.base, self.run, self.stream = base, run, stream
        self._session = session
        self._token = token
        self._timeout = aiohttp.ClientTimeout(sock_connect=idle_timeout, sock_read=idle_timeout)
        self.seen: list[tuple[int, str]] = []
        self.reconnects = 0
        self.errors: list[str] = []
        self.task: asyncio.Task[None] | None = None
        # where the current connection is, for a message about a subscriber that fell behind
        self._phase = "not started"
        self._since = time.monotonic()
        self._bytes = 0  # received on the current connection
        self._heard = 0.0  # time.monotonic() of its latest bytes

    def state(self) -> str:
        """The current connection in words: its phase and what it has received."""
        now = time.monotonic()
        heard = f", last {now - self._heard:.1f} s ago" if self._bytes else ""
        return f"{self._phase} for {now - self._since:.1f} s, {self._bytes} bytes received{heard}"

    def _enter(self, phase: str) -> None:
        self._phase, self._since = phase, time.monotonic()

    def start(self) -> None:
        self.task = asyncio.create_task(self._follow(), name=f"subscriber {self.stream}@{self.base}")

    @property
    def last(self) -> int:
        return self.seen[-1][0] if self.seen else 0

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _follow(self) -> None:
        url = f"{self.base}{API_PREFIX}/runs/{self.run}/streams/{self.stream}/subscribe"
        while True:
            headers = {"Authorization": f"Bearer {self._token}", "Last-Event-ID": str(self.last)}
            self._enter("requested")
            self._bytes = 0
            try:
                async with self._session.get(url, headers=headers, timeout=self._timeout) as resp:
                    self._enter(f"answered {resp.status}")
                    if resp.status != 200:
                        self.errors.append(f"{resp.status} {await resp.text()}")
                    else:
                        await self._read(resp)
            except _TRANSIENT as exc:
                self.errors.append(type(exc).__name__)
            except Exception as exc:  # a defect of this client or the server: said, not swallowed by the task
                self.errors.append(repr(exc))
                self._enter(f"failed ({exc!r})")
                raise
            self.reconnects += 1
            await asyncio.sleep(0.2)

    async def _read(self, resp: aiohttp.ClientResponse) -> None:
        event, data, ident = "message", "", None
        async for raw in resp.content:
            self._bytes += len(raw)
            self._heard = time.monotonic()
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if event == "record" and ident is not None:
                    record = json.loads(data)
                    self.seen.append((int(ident), json.dumps(record.get("data"), sort_keys=True)))
                elif event == "error":
                    self.errors.append(data)
                event, data, ident = "message", "", None
            elif line.startswith(":"):
                continue
            else:
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "event":
                    event = value
                elif name == "data":
                    data = value if not data else data + "\n" + value
                elif name == "id":
                    ident = value


class Workload:
    """Producers and subscribers over the data planes at ``bases`` (root URLs, e.g. http://host:port)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        bases: Sequence[str],
        token: str,
        *,
        run: str = "workload",
        streams: int = 3,
        request_timeout: float = 30.0,
        idle_timeout: float = 60.0,
    ) -> None:
        self.session = session
        self.bases = list(bases)
        self.token = token
        self.run = run
        self.streams = [f"s{i}" for i in range(streams)]
        self.timeout = aiohttp.ClientTimeout(total=request_timeout)
        self.idle_timeout = idle_timeout
        self.acknowledged: list[Acknowledged] = []
        self.attempts = Attempts()
        self.subscribers: list[Subscriber] = []

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def _url(self, base: str, stream: str | None = None, tail: str = "") -> str:
        path = f"{base}{API_PREFIX}/runs/{self.run}/streams"
        return path if stream is None else f"{path}/{stream}{tail}"

    async def create(self, pins: dict[str, Any]) -> None:
        for stream in self.streams:
            body = {"stream_id": stream, "pins": pins}
            await self._until_answered("POST", self._url(self.bases[0]), body, {201, 200})

    def subscribe(self, per_stream_and_base: int = 1) -> None:
        for base in self.bases:
            for stream in self.streams:
                for _ in range(per_stream_and_base):
                    subscriber = Subscriber(
                        self.session, base, self.run, stream, self.token, idle_timeout=self.idle_timeout
                    )
                    subscriber.start()
                    self.subscribers.append(subscriber)

    async def produce(self, producers: int, appends_each: int, *, on_ack: Callable[[int], None] | None = None) -> None:
        """``producers`` loops of ``appends_each`` appends, round robin over streams and data planes."""

        async def producer(n: int) -> None:
            for i in range(appends_each):
                stream = self.streams[(n + i) % len(self.streams)]
                base = self.bases[(n + i) % len(self.bases)]
                await self.append(base, stream, f"p{n}-{i}")
                if on_ack is not None:
                    on_ack(len(self.acknowledged))

        await asyncio.gather(*(producer(n) for n in range(producers)))

    async def append(self, base: str, stream: str, key: str) -> Acknowledged:
        """Append ``{"data": key}`` with Idempotency-Key ``key`` until acknowledged."""
        body = {"data": key}
        headers = {**self._headers, "Idempotency-Key": key}
        while True:
            started = time.monotonic()
            try:
                async with self.session.post(
                    self._url(base, stream, "/records"), json=body, headers=headers, timeout=self.timeout
                ) as resp:
                    self.attempts.record(started, resp.status)
                    if resp.status in (200, 201):
                        sequence = int((await resp.json())["last_sequence"])
                        ack = Acknowledged(key, stream, sequence, json.dumps(key))
                        self.acknowledged.append(ack)
                        return ack
                    if resp.status < 500:
                        raise AssertionError(f"append refused: {resp.status} {await resp.text()}")
            except _TRANSIENT:
                self.attempts.record(started, 0)
            await asyncio.sleep(0.05)

    async def _until_answered(self, method: str, url: str, body: Any, ok: set[int]) -> Any:
        while True:
            try:
                async with self.session.request(
                    method, url, json=body, headers=self._headers, timeout=self.timeout
                ) as resp:
                    if resp.status in ok:
                        return await resp.json()
                    if resp.status < 500:
                        raise AssertionError(f"{method} {url}: {resp.status} {await resp.text()}")
            except _TRANSIENT:
                pass
            await asyncio.sleep(0.1)

    async def stored(self, stream: str) -> list[tuple[int, str]]:
        """What a read finds, from the start (retried like any careful reader)."""
        out: list[tuple[int, str]] = []
        after = 0
        while True:
            url = self._url(self.bases[0], stream, f"/records?after={after}&limit=1000")
            page = await self._until_answered("GET", url, None, {200})
            out.extend((r["sequence"], json.dumps(r["data"], sort_keys=True)) for r in page["records"])
            if page["next_after"] == after:
                return out
            after = page["next_after"]

    async def lagging(self) -> list[str]:
        """The subscribers that have not yet seen as far as what is stored now, in words."""
        heads = {stream: (await self.stored(stream))[-1:] for stream in self.streams}
        return [
            f"{s.stream}@{s.base}: at {s.last} of {heads[s.stream][0][0]},"
            f" {s.reconnects} reconnections, last errors {s.errors[-3:]}; now {s.state()}"
            for s in self.subscribers
            if heads[s.stream] and s.last < heads[s.stream][0][0]
        ]

    async def caught_up(self) -> bool:
        """Whether every subscriber has seen as far as what is stored now. A subscriber that stopped (its
        task ended: only a defect ends it) never will: that raises at once, with its reason."""
        for s in self.subscribers:
            if s.task is not None and s.task.done():
                raise AssertionError(f"subscriber of {s.stream}@{s.base} stopped: {s.state()}, errors {s.errors[-3:]}")
        return not await self.lagging()

    async def check(self) -> list[str]:
        """Everything that is wrong, in words (empty when all is well)."""
        problems: list[str] = []
        for stream in self.streams:
            stored = await self.stored(stream)
            sequences = [s for s, _ in stored]
            if sequences != sorted(set(sequences)):
                problems.append(f"{stream}: stored sequences not strictly ascending")
            data = [d for _, d in stored]
            if len(data) != len(set(data)):
                problems.append(f"{stream}: a record stored twice")
            at = dict(stored)
            for ack in (a for a in self.acknowledged if a.stream == stream):
                if at.get(ack.sequence) != ack.data:
                    problems.append(f"{stream}: acknowledged {ack.key} at {ack.sequence} is not stored there")
            for sub in (s for s in self.subscribers if s.stream == stream):
                pairs = zip(sub.seen, stored, strict=False)
                wrong = next((i for i, (seen, kept) in enumerate(pairs) if seen != kept), None)
                if wrong is None and len(sub.seen) > len(stored):
                    wrong = len(stored)
                if wrong is not None:
                    problems.append(
                        f"{stream}@{sub.base}: subscriber saw {sub.seen[wrong : wrong + 3]} where the store"
                        f" holds {stored[wrong : wrong + 3]}"
                    )
                elif len(sub.seen) < len(stored):
                    problems.append(f"{stream}@{sub.base}: subscriber saw {len(sub.seen)} of {len(stored)} records")
        return problems

    async def close(self) -> None:
        for subscriber in self.subscribers:
            await subscriber.stop()
