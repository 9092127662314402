"""One process's notifier: coalesced NOTIFYs, at most one in flight, started at least an interval apart."""

from __future__ import annotations

import asyncio

import asyncpg

from tests.waiting import eventually
from workflow_streams.domain.wakes import CHANNEL, RECORDS, Signal, decode
from workflow_streams.runtime.listen_notify import ListenNotify
from workflow_streams.runtime.supervisor import Supervisor


async def test_sends_are_spaced_and_what_queues_meanwhile_travels_together(database_url: str) -> None:
    heard: list[tuple[float, list[Signal]]] = []
    loop = asyncio.get_running_loop()

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        _sender, signals = decode(payload)
        heard.append((loop.time(), signals))

    listener = await asyncpg.connect(database_url)
    await listener.add_listener(CHANNEL, on_notify)
    interval = 1.0  # long enough that a missing limiter shows, whatever the machine's load
    source = ListenNotify(database_url, "sender-under-test", min_interval=interval)
    supervisor = Supervisor()
    for name, loop_ in source.loops(lambda _signals: None, lambda: None).items():
        supervisor.start(name, loop_)
    try:
        source.send([Signal(RECORDS, "r", "a", 1, 1)])  # a quiet process: goes at once
        await eventually(lambda: len(heard) == 1)
        for n in range(2, 12):  # within the interval: one NOTIFY after it, merged per stream
            source.send([Signal(RECORDS, "r", "a", n, n), Signal(RECORDS, "r", f"s{n}", n, n)])
        await eventually(lambda: len(heard) == 2)
        (first_at, first), (second_at, second) = heard
        assert first == [Signal(RECORDS, "r", "a", 1, 1)]
        # arrival times: the first send also connected, so it may have taken longer than the second
        assert second_at - first_at >= interval * 0.8
        assert Signal(RECORDS, "r", "a", 2, 11) in second
        assert {s.stream_id for s in second} == {"a", *(f"s{n}" for n in range(2, 12))}
    finally:
        await supervisor.stop()
        await source.stop()
        await listener.close()
