"""An asyncio client for workflow services (aiohttp).

async with StreamsClient("http://workflow-streams.svc", token) as client:
    await client.append("run-1", "out", {"token": "Hel"})
    async for record in client.subscribe("run-1", "out", after=0):
        if record.kind == "object":
            data = await client.read_object("run-1", "out", record.sequence)
"""

from .client import StreamsClient
from .errors import BackpressureError, CursorExpiredError, ObjectDigestMismatch, ProblemError, StreamClosedError
from .models import AppendResult, ObjectInfo, Page, Record

__all__ = [
    "AppendResult",
    "BackpressureError",
    "CursorExpiredError",
    "ObjectDigestMismatch",
    "ObjectInfo",
    "Page",
    "ProblemError",
    "Record",
    "StreamClosedError",
    "StreamsClient",
]
