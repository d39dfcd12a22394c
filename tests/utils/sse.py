"""Server-Sent Events for tests: parse a body, read a live stream, serve an app.

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

from tests.utils.processes import free_port


@dataclass
class Event:
    name: str  # an event's name; "comment" for a `: ...` line
    data: Any  # the parsed JSON (a comment's text)
    at: float = 0.0  # time.perf_counter() when its last byte arrived


def parse(body: str) -> list[Event]:
    """Every event and comment of a complete SSE body, in order."""
    events: list[Event] = []
    for block in body.split("\n\n"):
        event = _block(block)
        if event is not None:
            events.append(event)
    assert body.endswith("\n\n") or not body, f"the body does not end an event: {body[-80:]!r}"
    return events


def _block(block: str) -> Event | None:
    if not block.strip():
        return None
    lines = block.split("\n")
    if all(line.startswith(":") for line in lines):
        return Event("comment", "\n".join(line[1:].strip() for line in lines))
    name, data = "message", []
    for line in lines:
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
        else:
            raise AssertionError(f"not an SSE field: {line!r}")
    assert len(data) == 1, f"one data line per event expected: {block!r}"
    return Event(name, json.loads(data[0]))


async def events_of(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of a streamed response as they arrive, each timestamped."""
    blocks = _Blocks()
    async for text in response.aiter_text():
        for event in blocks.feed(text):
            yield event
    blocks.end()


def iter_events(response: httpx.Response) -> Iterator[Event]:
    """`events_of` for a synchronous client's streamed response."""
    blocks = _Blocks()
    for text in response.iter_text():
        yield from blocks.feed(text)
    blocks.end()


class _Blocks:
    """Splits text received in pieces into events, each stamped when whole."""

    def __init__(self) -> None:
        self.buffer = ""

    def feed(self, text: str) -> Iterator[Event]:
        self.buffer += text
        while "\n\n" in self.buffer:
            block, self.buffer = self.buffer.split("\n\n", 1)
            event = _block(block)
            if event is not None:
                event.at = time.perf_counter()
                yield event

    def end(self) -> None:
        assert not self.buffer.strip(), f"the stream ended inside an event: {self.buffer!r}"


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
