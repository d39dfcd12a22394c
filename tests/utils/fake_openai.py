"""A small OpenAI-compatible server for tests, on a free loopback port.

The real `openai` client talks to it over HTTP. By default it echoes the
last user message; tests queue scripted replies (tool calls, errors, delays,
broken bodies) and read back every request it received.

`POST /v1/embeddings` has its own script (`script_embeddings`) and request
log (`embedding_requests`): a turn embeds while it talks to the model, so an
embedding must never take a chat reply, and `calls`/`requests` count chat
completions only. By default it answers with memchat's local embedder
(`memchat.model.embeddings.local_embedding`), honouring `dimensions`.
"""

from __future__ import annotations

import array
import base64
import json
import sys
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from memchat.model.embeddings import local_embedding

# text-embedding-3-small's size, when a request does not ask for one.
DEFAULT_DIMENSIONS = 1536


def tool_call(operation: str, **arguments: Any) -> dict[str, Any]:
    """A scripted reply that calls manage_long_term_memory."""
    return {
        "tool_calls": [
            {
                "id": f"call_{uuid.uuid4().hex[:10]}",
                "type": "function",
                "function": {
                    "name": "manage_long_term_memory",
                    "arguments": json.dumps({"operation": operation, **arguments}),
                },
            }
        ]
    }


class FakeOpenAI:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []  # chat completions only
        self.embedding_requests: list[dict[str, Any]] = []
        self._script: deque[dict[str, Any]] = deque()
        self._embedding_script: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length))
                if self.path.endswith("/embeddings"):
                    reply = fake._next(fake.embedding_requests, fake._embedding_script, body)
                    status, content_type, data = fake._respond_embeddings(body, reply)
                else:
                    reply = fake._next(fake.requests, fake._script, body)
                    status, content_type, data = fake._respond(self.path, body, reply)
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                trickle = reply.get("trickle")
                if not trickle:
                    self.wfile.write(data)
                    return
                for i in range(len(data)):  # one byte at a time, `trickle` s apart
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(trickle)

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # tests fire dozens of turns at once

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client that gave up (a timeout test) closed the socket while
                # a delayed reply was being written: not an error of the fake.
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *replies: dict[str, Any]) -> None:
        """Queue replies, one per request, each a dict of:

        - {"content"} / {"tool_calls"}: the assistant message (any JSON values,
          so wrong types and escaped lone surrogates can be sent too);
        - {"override": {...}}: top-level fields replacing those of the normal
          completion (e.g. {"usage": "lots"}, {"model": 5});
        - {"raw": str | bytes, "content_type", "status"}: that body as is
          (defaults: application/json, 200), e.g. HTML or truncated JSON;
        - {"status", "error"}: an OpenAI-style error with that HTTP status;
        - {"delay"}: seconds to wait first (with any of the above);
        - {"trickle"}: seconds between the body's bytes, sent one at a time.
        """
        with self._lock:
            self._script.extend(replies)

    def script_embeddings(self, *replies: dict[str, Any]) -> None:
        """Queue embedding replies, one per `POST /embeddings`, each a dict of:

        - {} : the local embedder's vectors, of the requested `dimensions`;
        - {"dimensions": n}: vectors of n dimensions whatever was asked
          (a provider that ignores `dimensions`);
        - {"vector": value}: `data[i].embedding` is `value` as is (any JSON:
          wrong types, [], NaN, a wrong length);
        - {"override": {...}}: top-level fields replacing the normal ones
          (e.g. {"data": []});
        - {"raw"}, {"status", "error"}, {"delay"}, {"trickle"}: as in `script`.
        """
        with self._lock:
            self._embedding_script.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self.requests.clear()
            self._embedding_script.clear()
            self.embedding_requests.clear()

    @property
    def calls(self) -> int:
        """Chat completions received (embedding requests are not counted)."""
        return len(self.requests)

    def _next(
        self, log: list[dict[str, Any]], script: deque[dict[str, Any]], body: dict[str, Any]
    ) -> dict[str, Any]:
        """Log the request; the next scripted reply of that queue ({}: the default)."""
        with self._lock:
            log.append(body)
            return script.popleft() if script else {}

    def _scripted(self, reply: dict[str, Any]) -> tuple[int, str, bytes] | None:
        """What a reply's delay, raw body or error status makes of it (else None)."""
        if reply.get("delay"):
            time.sleep(reply["delay"])
        if "raw" in reply:
            raw = reply["raw"]
            data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
            return reply.get("status", 200), reply.get("content_type", "application/json"), data
        if "status" in reply:
            error = {"error": {"message": reply.get("error", "fake failure")}}
            return reply["status"], "application/json", _json(error)
        return None

    def _respond(
        self, path: str, body: dict[str, Any], reply: dict[str, Any]
    ) -> tuple[int, str, bytes]:
        """(status, content type, body) for one chat request."""
        scripted = self._scripted(reply)
        if scripted is not None:
            return scripted
        if not path.endswith("/chat/completions"):
            return 404, "application/json", _json({"error": {"message": "not found"}})
        return (
            200,
            "application/json",
            _json({**_completion(body, reply), **reply.get("override", {})}),
        )

    def _respond_embeddings(
        self, body: dict[str, Any], reply: dict[str, Any]
    ) -> tuple[int, str, bytes]:
        """(status, content type, body) for one embeddings request."""
        scripted = self._scripted(reply)
        if scripted is not None:
            return scripted
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
            error = {"error": {"message": "input must be a string or a list of strings"}}
            return 400, "application/json", _json(error)
        dimensions = reply.get("dimensions", body.get("dimensions", DEFAULT_DIMENSIONS))
        data = []
        for index, text in enumerate(inputs):
            vector: Any = reply.get("vector")
            if "vector" not in reply:
                vector = local_embedding(text, dimensions)
                if body.get("encoding_format") == "base64":  # the SDK's default
                    vector = base64.b64encode(array.array("f", vector).tobytes()).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(len(text.split()) for text in inputs)
        payload = {
            "object": "list",
            "data": data,
            "model": body.get("model", "fake-embedding-model"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return 200, "application/json", _json({**payload, **reply.get("override", {})})

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _completion(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """A normal chat completion for `body`, with the reply's message."""
    message: dict[str, Any] = {"role": "assistant"}
    if "tool_calls" in reply:
        message["content"] = reply.get("content")
        message["tool_calls"] = reply["tool_calls"]
    else:
        last_user = next((m for m in reversed(body["messages"]) if m.get("role") == "user"), {})
        message["content"] = reply.get("content", f"echo: {last_user.get('content', '')}")
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake-model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def _json(payload: Any) -> bytes:
    # ensure_ascii (the default) writes lone surrogates as \udXXX escapes,
    # which is how a real server's JSON would carry them.
    return json.dumps(payload).encode()
