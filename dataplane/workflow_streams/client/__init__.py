"""An asyncio client for workflow services (aiohttp).

async with StreamsClient("http://workflow-streams.svc", token) as client:
    await client.append("run-1", "out", {"token": "Hel"})
    async for record in client.subscribe("run-1", "out", after=0):
        ...
"""

from .client import StreamsClient
from .errors import BackpressureError, CursorExpiredError, ProblemError, StreamClosedError
from .models import AppendResult, Page, Record

__all__ = [
    "AppendResult",
    "BackpressureError",
    "CursorExpiredError",
    "Page",
    "ProblemError",
    "Record",
    "StreamClosedError",
    "StreamsClient",
]
