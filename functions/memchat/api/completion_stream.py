"""A streamed turn as OpenAI's `chat.completion.chunk` events (`stream: true`).

The turn and its delivery are POST /chat's (api/sse.py: every piece sent as
it comes, keep-alive comments, the turn finished and stored even when the
client leaves); only the writing differs: `data: {chunk}` events with no
event names, the opening chunk carrying the role (and memchat's report of
the memory loaded), one chunk per piece of the answer, the client's tool
calls, a closing chunk with the finish reason, when the turn asked for them
a chunk with no choices whose `memchat.suggestions` are its follow-ups, a
usage chunk when `stream_options.include_usage` asks for one, then `data:
[DONE]`. A failure after the start is an `error` chunk in OpenAI's shape.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from memchat.api import sse
from memchat.api.errors import error_body
from memchat.api.openai_errors import openai_body
from memchat.usecases import completions

if TYPE_CHECKING:
    from starlette.requests import Request

    from memchat.usecases.chat import ChatResult
    from memchat.usecases.completions import CompletionRequest
    from memchat.usecases.streaming import StreamedTurn, TurnEvent

DONE = b"data: [DONE]\n\n"


def data(payload: dict[str, Any]) -> bytes:
    """One `data:` event (JSON never spans lines)."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


class ChunkStream(sse.EventStream):
    """The rest of a turn whose memory is loaded, as Chat Completions chunks."""

    def __init__(
        self,
        request: Request,
        turn: StreamedTurn,
        start: TurnEvent,
        completion: CompletionRequest,
        keepalive_seconds: float,
    ) -> None:
        # No `done` body: encode_done writes the closing chunks itself.
        super().__init__(request, turn, start, lambda _: {}, keepalive_seconds)
        self.headers.update(
            completions.memory_headers(str(start.data["session_id"]), start.data["memory"])
        )
        self._completion = completion
        self._id = completions.new_id()
        self._created = completions.now()

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        payload: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._completion.model,
            "choices": choices,
        }
        if self._completion.include_usage:
            payload["usage"] = None  # in every chunk but the last, as OpenAI sends it
        return data({**payload, **extra})

    @staticmethod
    def _choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def encode(self, event: TurnEvent) -> bytes:
        if event.name == "start":
            return self._chunk(
                [self._choice({"role": "assistant", "content": ""})],
                memchat={
                    "session_id": event.data["session_id"],
                    "agent_name": event.data["agent_name"],
                    "memory": event.data["memory"],
                },
            )
        if event.name == "delta":
            return self._chunk([self._choice({"content": event.data["text"]})])
        return b""  # the notes' changes: memchat's own, never the client's

    def encode_error(self, failure: BaseException) -> bytes:
        body = error_body(self._request, failure)
        status = getattr(failure, "status", 500)
        return data(openai_body(status, body))

    def encode_done(self, result: ChatResult) -> bytes:
        chunks = []
        calls = completions.tool_calls(result)
        if calls:
            delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
            chunks.append(self._chunk([self._choice(delta)]))
        chunks.append(
            self._chunk(
                [self._choice({}, completions.finish_reason(result))],
                memchat=completions.memchat_info(result),
            )
        )
        return b"".join(chunks)

    def encode_suggestions(self, suggestions: list[str]) -> bytes:
        return self._chunk([], memchat={"suggestions": suggestions})

    def encode_end(self, result: ChatResult) -> bytes:
        # The usage chunk last before [DONE], as OpenAI sends it.
        usage = (
            self._chunk([], usage=completions.usage(result))
            if self._completion.include_usage
            else b""
        )
        return usage + DONE
