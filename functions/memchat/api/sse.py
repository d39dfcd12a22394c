"""A streamed chat turn as Server-Sent Events (text/event-stream).

Events: `start` (the memory loaded), `delta` (a piece of the answer),
`notes` (the memory tool changed the notes), then `done` (the body the
non-streaming POST /chat returns) or `error` (the error JSON), and after
`done`, when the turn asked for them, `suggestions` (its follow-ups, made
once the answer was written); a `: keep-alive` comment after
STREAM_KEEPALIVE_SECONDS without an event.

Every event is sent as its own body chunk the moment it exists: nothing is
buffered here. When the client goes away the turn still runs to its end
(stored, or failed and rolled back) before this response returns, so a
Lambda invocation is not frozen under a turn half-done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from memchat.api.errors import error_body
from memchat.usecases.chat import ChatResult
from memchat.usecases.streaming import StreamedTurn, TurnEvent
from memchat.usecases.suggestions import settled

logger = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"
KEEP_ALIVE = b": keep-alive\n\n"
# A streamed turn's follow-ups wait at most this long after `done`.
SUGGESTIONS_WAIT_SECONDS = 20.0


def _event(name: str, description: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "required": ["event", "data"],
        "properties": {
            "event": {"const": name},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": data,
            },
        },
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


# One event of the stream, as OpenAPI 3.1 describes text/event-stream items
# (`schema` there stands for 3.2's `itemSchema`); comments are not events.
EVENT_SCHEMA: dict[str, Any] = {
    "oneOf": [
        _event(
            "start",
            "The turn's memory is loaded; the model is asked next.",
            {
                "type": "object",
                "required": ["session_id", "agent_name", "memory"],
                "properties": {
                    "session_id": {"type": "string", "format": "uuid"},
                    "agent_name": {"type": "string"},
                    "memory": _ref("MemoryInfo"),
                },
            },
        ),
        _event(
            "delta",
            "The next piece of the answer, as the model wrote it.",
            {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
        ),
        _event(
            "notes",
            "The memory tool changed the long-term notes.",
            {
                "type": "object",
                "required": ["operation"],
                "properties": {"operation": {"type": "string"}},
            },
        ),
        _event("done", "The turn is stored: the non-streaming body.", _ref("ChatResponse")),
        _event(
            "suggestions",
            "After `done`, when asked for: up to 3 follow-up questions (never stored).",
            {
                "type": "object",
                "required": ["suggestions"],
                "properties": {"suggestions": {"type": "array", "items": {"type": "string"}}},
            },
        ),
        _event("error", "The turn failed after it started; nothing was stored.", _ref("ErrorOut")),
    ]
}


def frame(event: str, data: dict[str, Any]) -> bytes:
    """One SSE event; JSON never spans lines, so one `data:` line is enough."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n".encode()


def wants_stream(accept: str | None) -> bool:
    """Whether an Accept header asks for text/event-stream (with a q above 0)."""
    for item in (accept or "").split(","):
        media, _, params = item.partition(";")
        if media.strip().lower() == MEDIA_TYPE:
            weight = re.search(r"\bq\s*=\s*([0-9.]+)", params)
            try:
                return weight is None or float(weight.group(1)) > 0
            except ValueError:
                return True
    return False


class EventStream(Response):
    """The rest of a turn whose `start` event is known, sent as it happens."""

    media_type = MEDIA_TYPE

    def __init__(
        self,
        request: Request,
        turn: StreamedTurn,
        start: TurnEvent,
        done: Callable[[ChatResult], dict[str, Any]],
        keepalive_seconds: float,
    ) -> None:
        super().__init__(
            status_code=200,
            headers={
                "X-Session-ID": str(start.data["session_id"]),
                "Cache-Control": "no-cache",
                # nginx and some proxies buffer responses unless told not to.
                "X-Accel-Buffering": "no",
            },
        )
        # Response.__init__ sets a Content-Length for an empty body: a stream has none.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._request = request
        self._turn = turn
        self._start = start
        self._done = done
        self._keepalive = keepalive_seconds
        self._pending: asyncio.Task[list[str]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await self._body(send, self.encode(self._start))
            while True:
                item = await self._turn.next(wait=self._keepalive)
                if item is None:
                    await self._body(send, KEEP_ALIVE)
                elif isinstance(item, TurnEvent):
                    chunk = self.encode(item)
                    if chunk:
                        await self._body(send, chunk)
                elif isinstance(item, BaseException):
                    await self._body(send, self.encode_error(item), last=True)
                    return
                else:
                    await self._body(send, self.encode_done(item))
                    pending = self._pending = item.pending_suggestions
                    if pending is not None:
                        follow_ups = await settled(pending, SUGGESTIONS_WAIT_SECONDS)
                        await self._body(send, self.encode_suggestions(follow_ups))
                    await self._body(send, self.encode_end(item), last=True)
                    return
        except OSError:
            # The client is gone (ASGI 2.4 servers raise on send); the turn goes on.
            logger.info("stream client disconnected; finishing the turn")
        finally:
            # Also when cancelled (servers on older ASGI cancel on disconnect).
            with anyio.CancelScope(shield=True):
                await self._turn.finished()
            if self._pending is not None:
                self._pending.cancel()  # sent, or nobody is left to send them to

    # How the events are written (POST /v1/chat/completions writes them as
    # OpenAI's chunks: api/completion_stream.py); b"" sends nothing.

    def encode(self, event: TurnEvent) -> bytes:
        return frame(event.name, event.data)

    def encode_error(self, failure: BaseException) -> bytes:
        return frame("error", error_body(self._request, failure))

    def encode_done(self, result: ChatResult) -> bytes:
        return frame("done", self._done(result))

    def encode_suggestions(self, suggestions: list[str]) -> bytes:
        return frame("suggestions", {"suggestions": suggestions})

    def encode_end(self, result: ChatResult) -> bytes:
        return b""

    @staticmethod
    async def _body(send: Send, chunk: bytes, *, last: bool = False) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": not last})
