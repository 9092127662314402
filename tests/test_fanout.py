"""The live fan-out (runtime/fanout.py) on a real Postgres: followers joining at any moment get every
record once, in order, including one that joins behind a read already in flight."""

from __future__ import annotations

import asyncio

from tests.support import StreamsApi
from tests.waiting import eventually
from workflow_streams.domain.wakes import RECORDS, Signal
from workflow_streams.runtime.durability import Durability
from workflow_streams.runtime.fanout import Fanout
from workflow_streams.runtime.reads import SharedPage, SharedReads
from workflow_streams.runtime.supervisor import Supervisor
from workflow_streams.runtime.wakes import PollOnly, WakeHub
from workflow_streams.store.db import create_pool


class Recorder:
    """A follower that records the sequences of the events it is offered."""

    def __init__(self, last: int, pins_digest: str) -> None:
        self.last = last
        self.pins_digest = pins_digest
        self.seen: list[int] = []
        self.detached = False

    def offer(self, shared: SharedPage) -> bool:
        records = shared.page.records[shared.start_after(self.last) :]
        self.seen += [r.sequence for r in records]
        if records:
            self.last = records[-1].sequence
        return True

    def detach(self) -> None:
        self.detached = True


class GatedReads(SharedReads):
    """Real shared reads that wait at a gate first, so a test can act while a read is in flight."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self.lows: list[int] = []

    async def page(self, run_id: str, stream_id: str, after: int, limit: int, woken_at: int) -> SharedPage:
        self.lows.append(after)
        self.waiting.set()
        await self.gate.wait()
        return await super().page(run_id, stream_id, after, limit, woken_at)


async def test_a_follower_joining_behind_a_read_in_flight_gets_every_record(api: StreamsApi, database_url: str) -> None:
    await api.create("r", "s")
    for n in range(1, 11):
        assert (await api.append("r", "s", n)).status == 201
    digest = (await (await api.get("r", "s")).json())["pins_digest"]
    pool = await create_pool(database_url, 1, 2)
    hub = WakeHub(PollOnly(), None, 0)
    reads = GatedReads(pool, hub, Durability(pool))
    fanout = Fanout(hub, reads, 500, lambda *gap: None, Supervisor())
    try:
        ahead = Recorder(10, digest)
        fanout.join("r", "s", ahead)
        await reads.waiting.wait()  # the fan-out's read from 10 is in flight
        for n in (11, 12):
            assert (await api.append("r", "s", n)).status == 201  # committed, never announced here
        behind = Recorder(5, digest)  # e.g. a subscriber whose own backfill was older
        fanout.join("r", "s", behind)
        reads.gate.set()
        await eventually(lambda: len(behind.seen) >= 7, message="the follower behind never caught up")
        assert behind.seen == list(range(6, 13))
        assert ahead.seen == [11, 12]
        assert reads.lows[:2] == [10, 5], "the follower behind the first read got a read of its own"
        assert not ahead.detached and not behind.detached
    finally:
        await fanout.close()
        await pool.close()


async def test_an_ended_read_is_joined_until_a_signal_ticks_the_clock(api: StreamsApi, database_url: str) -> None:
    """A burst's readers of one key share a read that has already ended, as they would one in flight,
    but never once a signal has been delivered since it started: that reader reads again and finds the
    commit the signal announced. Kept reads are bounded."""
    for stream in ("s", "t"):
        await api.create("r", stream)
        assert (await api.append("r", stream, 1)).status == 201
    pool = await create_pool(database_url, 1, 2)
    hub = WakeHub(PollOnly(), None, 0)
    reads = SharedReads(pool, hub, Durability(pool))
    try:
        first = await reads.page("r", "s", 0, 100, hub.clock)
        assert await reads.page("r", "s", 0, 100, hub.clock) is first, "the ended read was not joined"
        assert (await api.append("r", "s", 2)).status == 201
        hub.publish([Signal(RECORDS, "r", "s", 2, 2)])
        after = await reads.page("r", "s", 0, 100, hub.clock)
        assert after is not first
        assert [r.sequence for r in after.page.records] == [1, 2]

        reads.MAX_KEPT = 1  # one key kept: reading another evicts it
        await reads.page("r", "t", 0, 100, hub.clock)
        assert await reads.page("r", "s", 0, 100, hub.clock) is not after
    finally:
        await pool.close()
