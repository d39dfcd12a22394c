"""Server-Sent Events for tests: parse a body, read a live stream, serve an app.

Bodies and streams are read with the project's one reader (memchat.sse_reader),
held to what the server writes: no unknown line, one JSON data line per
event, and a body that ends where an event ends.

`serve` runs the app under a real uvicorn on 127.0.0.1 in the test's own
event loop, so a streamed response reaches the client chunk by chunk (the
in-process ASGI transport hands a body over only once it is complete).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from memchat.sse_reader import Comment, Item, SSEReader, UnknownLine
from tests.utils.processes import free_port


@dataclass
class Event:
    name: str  # an event's name; "comment" for a `: ...` line
    data: Any  # the parsed JSON (a comment's text)
    at: float = 0.0  # time.perf_counter() when its last byte arrived


def parse(body: str) -> list[Event]:
    """Every event and comment of a complete SSE body, in order."""
    reader = SSEReader()
    events = [_event(item) for item in reader.feed(body.encode())]
    assert reader.between_events, f"the body does not end an event: {body[-80:]!r}"
    return events


def _event(item: Item) -> Event:
    """What the server sends: comments, and events of one JSON data line each."""
    assert not isinstance(item, UnknownLine), f"not an SSE field: {item.line!r}"
    if isinstance(item, Comment):
        return Event("comment", item.text.strip())
    assert "\n" not in item.text, f"one data line per event expected: {item.text!r}"
    return Event(item.name, json.loads(item.data))


async def events_of(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of a streamed response as they arrive, each timestamped."""
    reader = SSEReader()
    async for chunk in response.aiter_bytes():
        for item in reader.feed(chunk):
            yield _stamped(item)
    _assert_ended(reader)


def iter_events(response: httpx.Response) -> Iterator[Event]:
    """`events_of` for a synchronous client's streamed response."""
    reader = SSEReader()
    for chunk in response.iter_bytes():
        for item in reader.feed(chunk):
            yield _stamped(item)
    _assert_ended(reader)


def _stamped(item: Item) -> Event:
    event = _event(item)
    event.at = time.perf_counter()
    return event


def _assert_ended(reader: SSEReader) -> None:
    assert reader.between_events, "the stream ended inside an event"


def names(events: list[Event]) -> list[str]:
    return [e.name for e in events]


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """`app` under uvicorn on a free port of 127.0.0.1; yields its base URL."""
    import uvicorn

    config = uvicorn.Config(
        app, host="127.0.0.1", port=free_port(), lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises why it did not start
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        await task
