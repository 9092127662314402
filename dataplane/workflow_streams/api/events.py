"""Server-Sent Events responses, for both surfaces: the live-read engine's ``Sink`` over aiohttp.

A response's writes are watched (``runtime.live.StallWatch``): a reader that stops taking bytes is cut
off, not buffered. Open responses are ended on shutdown so that clients resume on another replica.
"""

from __future__ import annotations

import asyncio
import weakref

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter

from ..runtime.live import StallWatch
from .state import STREAMING, state_of

# the fan-out writes to a connection only while its socket's buffer stays under this; beyond it, the
# connection's own task writes (and a stall is cut off by the watch)
_OFFER_BUFFER_BYTES = 256 * 1024

# handler tasks of open event streams, cancelled on shutdown
OPEN_STREAMS = web.AppKey("workflow_streams_open_sse", weakref.WeakSet[asyncio.Task[object]])

HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}


class EventStream(web.StreamResponse):
    """A streaming response the live-read engine writes to (``runtime.live.Sink``)."""

    stalled = False
    _stalls: StallWatch | None = None
    _transport: asyncio.Transport | None = None
    _chunked = False  # HTTP/1.1 chunked body: the fan-out may write framed chunks itself
    # aiohttp's switch (web.Response sets it so too): the headers wait for the first write, which
    # carries the response's first events (``start``), so a connection's start is one socket write,
    # not three; on loopback each write also runs the reader's side of TCP in the kernel. ``offer``
    # writes to the transport itself, so it must never come first: it follows that write.
    _send_headers_immediately = False

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        self._transport = request.transport
        if request.version >= HttpVersion11:
            self.enable_chunked_encoding()
            self._chunked = True
        return await super().prepare(request)

    @property
    def can_offer(self) -> bool:
        return self._chunked and self._transport is not None

    def offer(self, chunk: bytes) -> bool:
        """Write ``chunk`` now, without waiting, if the socket takes it: True if written. This is the
        fan-out's write: no task, no timer. It frames the chunk as aiohttp's writer does for the chunked
        body it started; the bytes go to the same transport in order with every other write of this
        response."""
        transport = self._transport
        if transport is None or self.stalled or transport.is_closing():
            return False
        if transport.get_write_buffer_size() + len(chunk) > _OFFER_BUFFER_BYTES:
            return False  # backed up: the connection's own task writes, under the stall watch
        transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
        return True

    async def send(self, chunk: bytes) -> None:
        if self.stalled:
            raise TimeoutError("reader stopped reading")
        stalls = self._stalls
        if stalls is not None:
            stalls.begin(self)
        try:
            await self.write(chunk)  # returns at once unless the socket's buffers are full
        finally:
            if stalls is not None:
                stalls.end(self)
        if self.stalled:  # cut off while this write waited: what it buffered went with the connection
            raise TimeoutError("reader stopped reading")

    def cut_off(self) -> None:
        """Abort the connection: the waiting write returns, and the handler ends (see ``send``)."""
        self.stalled = True
        self.abort()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


async def start(request: web.Request, headers: dict[str, str], first: bytes) -> EventStream:
    """Start the response: its headers and ``first`` (its first events) in one write."""
    response = EventStream(headers=headers)
    request[STREAMING] = True  # from the first byte on, a failure can no longer become a problem (or a retry)
    await response.prepare(request)
    response._stalls = state_of(request).live.stalls
    task = asyncio.current_task()
    if task is not None:
        request.config_dict[OPEN_STREAMS].add(task)
    await response.send(first)
    return response


async def close_open_streams(app: web.Application) -> None:
    """On shutdown: end open event streams so that clients reconnect to another replica promptly."""
    tasks: weakref.WeakSet[asyncio.Task[object]] = app[OPEN_STREAMS]
    for task in list(tasks):
        task.cancel()
