"""The peer users would pick instead: NATS JetStream, file storage, fsync on every write.

Debian's nats-server (2.9) has no per-write sync option, so for equal durability the bench uses
nats-server built from its Go module (2.11, ``sync_interval: always``), cached by scripts/bootstrap.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StorageType, StreamConfig

from bench.harness import percentiles, run_for
from workflow_streams.local.process import Process
from workflow_streams.localpg import free_port


class NatsServer:
    def __init__(self, binary: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="wfs-nats-"))
        self.port = free_port()
        config = self.dir / "nats.conf"
        config.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"jetstream {{\n  store_dir: {self.dir / 'js'}\n  sync_interval: always\n}}\n"
        )
        self.process = Process([str(binary), "-c", str(config)], log=self.dir / "nats.log", name="nats-server")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.stop(grace=10)


async def measure(binary: Path, seconds: float, records: int) -> dict[str, Any]:
    server = NatsServer(binary)
    try:
        for _ in range(100):
            try:
                nc = await nats.connect(server.url, connect_timeout=1)
                break
            except Exception:
                await asyncio.sleep(0.1)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="BENCH", subjects=["bench.>"], storage=StorageType.FILE))
        payload = b"x" * 100

        async def publish(worker: int) -> int:
            await js.publish("bench.tp", payload)
            return 1

        throughput = {}
        for producers in (1, 8, 32):
            throughput[producers] = round(await run_for(seconds, producers, publish))
            print(f"  nats {producers} producers: {throughput[producers]}/s", flush=True)

        samples: list[float] = []
        done = asyncio.Event()

        async def on_message(msg: Any) -> None:
            samples.append((time.time_ns() - int(msg.data)) / 1e6)
            await msg.ack()
            if len(samples) == records:
                done.set()

        await js.subscribe("bench.lat", cb=on_message)
        await asyncio.sleep(0.3)
        for _ in range(records):
            await js.publish("bench.lat", str(time.time_ns()).encode())
            await asyncio.sleep(1 / 20)
        await asyncio.wait_for(done.wait(), 60)
        await nc.close()
        return {
            "version": "nats-server 2.11 (JetStream, file storage, sync_interval: always)",
            "throughput": throughput,
            "latency_1_subscriber_ms": percentiles(samples),
        }
    finally:
        server.stop()
