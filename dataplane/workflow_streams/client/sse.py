"""A text/event-stream parser (the WHATWG rules the server relies on)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class Event:
    event: str
    data: str
    id: str | None


async def iter_events(content: aiohttp.StreamReader) -> AsyncIterator[Event | str]:
    """Events, and comments (as plain strings, e.g. heartbeats), until the server ends the stream."""
    fields: dict[str, str] = {}
    data: list[str] = []
    async for raw in content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data or "event" in fields:
                yield Event(fields.get("event", "message"), "\n".join(data), fields.get("id"))
            fields, data = {}, []
        elif line.startswith(":"):
            yield line[1:].strip()
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            else:
                fields[name] = value
