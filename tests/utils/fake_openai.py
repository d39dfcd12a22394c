"""A small OpenAI-compatible server for tests, on a free loopback port.

The real `openai` client talks to it over HTTP. By default it echoes the
last user message; tests queue scripted replies (tool calls, errors, delays)
and read back every request it received.
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
                status, payload = fake._respond(self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
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
        """Queue replies: {"content"}, {"tool_calls"}, {"status", "error"}, {"delay"}."""
        with self._lock:
            self._script.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self.requests.clear()

    @property
    def calls(self) -> int:
        return len(self.requests)

    def _respond(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            reply = self._script.popleft() if self._script else {}
        if reply.get("delay"):
            time.sleep(reply["delay"])
        if "status" in reply:
            return reply["status"], {"error": {"message": reply.get("error", "fake failure")}}
        if not path.endswith("/chat/completions"):
            return 404, {"error": {"message": "not found"}}
        message: dict[str, Any] = {"role": "assistant"}
        if "tool_calls" in reply:
            message["content"] = reply.get("content")
            message["tool_calls"] = reply["tool_calls"]
        else:
            last_user = next((m for m in reversed(body["messages"]) if m.get("role") == "user"), {})
            message["content"] = reply.get("content", f"echo: {last_user.get('content', '')}")
        return 200, {
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

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
