"""A small OpenAI-compatible server for tests, on a free loopback port.

The real `openai` client talks to it over HTTP. By default it echoes the
last user message; tests queue scripted replies (tool calls, errors, delays,
broken bodies) and read back every request it received.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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
        self.requests: list[dict[str, Any]] = []
        self._script: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length))
                status, content_type, data = fake._respond(self.path, body)
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # tests fire dozens of turns at once

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
        - {"delay"}: seconds to wait first (with any of the above).
        """
        with self._lock:
            self._script.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self.requests.clear()

    @property
    def calls(self) -> int:
        return len(self.requests)

    def _respond(self, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
        """(status, content type, body) for one request."""
        with self._lock:
            self.requests.append(body)
            reply = self._script.popleft() if self._script else {}
        if reply.get("delay"):
            time.sleep(reply["delay"])
        if "raw" in reply:
            raw = reply["raw"]
            data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
            return reply.get("status", 200), reply.get("content_type", "application/json"), data
        if "status" in reply:
            error = {"error": {"message": reply.get("error", "fake failure")}}
            return reply["status"], "application/json", _json(error)
        if not path.endswith("/chat/completions"):
            return 404, "application/json", _json({"error": {"message": "not found"}})
        return (
            200,
            "application/json",
            _json({**_completion(body, reply), **reply.get("override", {})}),
        )

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
