"""A small OpenAI-compatible server for tests, on a free loopback port.

The real `openai` client talks to it over HTTP. By default it echoes the
last user message; tests queue scripted replies (tool calls, errors, delays,
broken bodies) and read back every request it received.

A chat request with `"stream": true` is answered as OpenAI streams:
`text/event-stream`, one `data: {chunk}` event per piece (an opening role
chunk, the content word by word, each tool call in fragments, a closing
chunk with the finish reason, a usage chunk when
`stream_options.include_usage` is set), then `data: [DONE]`, sent with
chunked transfer encoding so that a connection dropped mid-stream is seen
as such. `first_token_delay` and `chunk_delay` (constructor, attributes, or
per reply) pace it; a non-streamed answer waits as long as its stream would
take to end, so the two compare fairly in benchmarks. Connections are kept
alive (HTTP/1.1) as real providers keep them, so a client's pool reuses
them; `close` shuts the ones still open, so that a client calling after it
fails as against a stopped provider.

`POST /v1/embeddings` has its own script (`script_embeddings`) and request
log (`embedding_requests`, and the Authorization header each came with in
`embedding_authorizations`): a turn embeds while it talks to the model, so an
embedding must never take a chat reply, and `calls`/`requests` count chat
completions only. By default it answers with memchat's local embedder
(`memchat.model.embeddings.local_embedding`), honouring `dimensions`.

Requests for suggested follow-ups (memchat.prompts.suggestions: a turn makes
one beside its answer, at the same time) have their own script too
(`script_suggestions`) and log (`suggestion_requests`), for the same reason;
by default each is answered with three questions about the conversation's
last user message (`suggested`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import struct
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


def search_call(query: str) -> dict[str, Any]:
    """A scripted reply that calls memchat's search_memory tool."""
    return {
        "tool_calls": [
            {
                "id": "call_search",
                "type": "function",
                "function": {"name": "search_memory", "arguments": json.dumps({"query": query})},
            }
        ]
    }


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
    def __init__(self, *, first_token_delay: float = 0.0, chunk_delay: float = 0.0) -> None:
        # Defaults for every reply without its own (seconds): before a streamed
        # answer's first content chunk, and between its chunks.
        self.first_token_delay = first_token_delay
        self.chunk_delay = chunk_delay
        self.requests: list[dict[str, Any]] = []  # chat completions only
        self.embedding_requests: list[dict[str, Any]] = []
        self.embedding_authorizations: list[str | None] = []
        self._script: deque[dict[str, Any]] = deque()
        self._embedding_script: deque[dict[str, Any]] = deque()
        self.suggestion_requests: list[dict[str, Any]] = []
        self._suggestion_script: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._connections: set[Any] = set()  # open client connections
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real providers
            # Headers and body are two writes: with Nagle's algorithm the body
            # would wait for the client's delayed ACK (40 ms) on a kept-alive
            # connection.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with fake._lock:
                    fake._connections.add(self.connection)

            def finish(self) -> None:
                with fake._lock:
                    fake._connections.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length))
                if self.path.endswith("/embeddings"):
                    fake.embedding_authorizations.append(self.headers.get("authorization"))
                    reply = fake._next(fake.embedding_requests, fake._embedding_script, body)
                    status, content_type, data = fake._respond_embeddings(body, reply)
                elif _asks_for_suggestions(body):
                    reply = fake._next(fake.suggestion_requests, fake._suggestion_script, body)
                    reply = {"content": suggested(body), **reply}
                    status, content_type, data = fake._respond(self.path, body, reply)
                else:
                    reply = fake._next(fake.requests, fake._script, body)
                    streamed = body.get("stream") is True
                    if streamed and self.path.endswith("/chat/completions"):
                        scripted = fake._scripted(reply)
                        if scripted is None:
                            fake._stream(self, body, reply)
                            return
                        status, content_type, data = scripted
                    else:
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
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

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

        A streamed request (`"stream": true`) takes the same keys: "content"
        and "tool_calls" are streamed (the content word by word, a value that
        is not a string in one chunk as is; each tool call as a first fragment
        with its id, name and "" arguments, then its arguments 8 characters at
        a time; a malformed call in one fragment as is), "override" replaces
        top-level fields of every chunk, "status"/"error", "raw" and "delay"
        act before the stream as above. And these:

        - {"first_token_delay"}, {"chunk_delay"}: seconds before the first
          chunk after the opening role chunk, and between the next ones
          (defaults: the constructor's; a non-streamed answer waits their sum);
        - {"chunks": [...]}: the content pieces, one chunk each (any JSON
          values), instead of the content split word by word;
        - {"fail_after": n}: the opening role chunk and n more, then the
          connection is dropped (no end of the chunked body, no [DONE]);
          with {"error": "message"} (and no "status"), an OpenAI error event
          `data: {"error": {...}}` is sent instead and the body ends cleanly;
        - {"raw_stream": str | bytes | [pieces]}: that body as is (content
          type "content_type", default text/event-stream), the pieces sent
          one write each, "chunk_delay" apart.
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

    def script_suggestions(self, *replies: dict[str, Any]) -> None:
        """Queue replies to suggestions requests, as `script`'s ({}: `suggested`)."""
        with self._lock:
            self._suggestion_script.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self._script.clear()
            self.requests.clear()
            self._suggestion_script.clear()
            self.suggestion_requests.clear()
            self._embedding_script.clear()
            self.embedding_requests.clear()
            self.embedding_authorizations.clear()

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
        # As long as the same answer would take to stream to its end.
        first_token_delay, chunk_delay = self._pacing(reply)
        if first_token_delay or chunk_delay:
            chunks = len(_stream_chunks(body, reply)) - 1  # after the role chunk
            time.sleep(first_token_delay + chunk_delay * max(chunks - 1, 0))
        return (
            200,
            "application/json",
            _json({**_completion(body, reply), **reply.get("override", {})}),
        )

    def _pacing(self, reply: dict[str, Any]) -> tuple[float, float]:
        """(first token delay, chunk delay) for a reply."""
        return (
            float(reply.get("first_token_delay", self.first_token_delay)),
            float(reply.get("chunk_delay", self.chunk_delay)),
        )

    def _stream(
        self, handler: BaseHTTPRequestHandler, body: dict[str, Any], reply: dict[str, Any]
    ) -> None:
        """Answer a streamed chat request (after its delay) as OpenAI does."""
        first_token_delay, chunk_delay = self._pacing(reply)
        handler.send_response(200)
        handler.send_header(
            "content-type", reply.get("content_type", "text/event-stream; charset=utf-8")
        )
        handler.send_header("cache-control", "no-cache")
        handler.send_header("transfer-encoding", "chunked")
        if "fail_after" in reply:  # the body may never end: not reusable
            handler.send_header("connection", "close")
        handler.end_headers()

        def send(data: bytes) -> None:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            handler.wfile.flush()

        def end() -> None:
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()

        if "raw_stream" in reply:
            raw = reply["raw_stream"]
            for i, piece in enumerate(raw if isinstance(raw, list) else [raw]):
                if i:
                    time.sleep(chunk_delay)
                data = piece if isinstance(piece, bytes) else piece.encode("utf-8", "surrogatepass")
                if data:  # an empty chunk would end the body
                    send(data)
            end()
            return

        role, *rest = _stream_chunks(body, reply)
        send(_event(role))
        fail_after = reply.get("fail_after")
        for i, chunk in enumerate(rest):
            if fail_after is not None and i == fail_after:
                break
            time.sleep(first_token_delay if i == 0 else chunk_delay)
            send(_event(chunk))
        else:
            send(b"data: [DONE]\n\n")
            end()
            return
        if "error" in reply:
            error = {"message": reply["error"], "type": "server_error", "code": None}
            send(_event({"error": error}))
            end()
        # Else the connection is dropped: no end of the chunked body.

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
                    vector = float32s(vector)
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
        with self._lock:
            connections = list(self._connections)
        for connection in connections:  # kept-alive ones would otherwise go on serving
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


def float32s(values: list[float]) -> str:
    """`values` as an OpenAI-compatible server sends them for `encoding_format:
    base64`: little-endian float32s, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def _completion(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """A normal chat completion for `body`, with the reply's message."""
    message: dict[str, Any] = {"role": "assistant"}
    if "tool_calls" in reply:
        message["content"] = reply.get("content")
        message["tool_calls"] = reply["tool_calls"]
    else:
        messages = reversed(body["messages"])
        last_user: dict[str, Any] = next((m for m in messages if m.get("role") == "user"), {})
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


def _stream_chunks(body: dict[str, Any], reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of a streamed answer to `body` (the opening role chunk first)."""
    message = _completion(body, reply)["choices"][0]["message"]
    content = message.get("content")
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if "chunks" in reply:
        deltas += [{"content": piece} for piece in reply["chunks"]]
    elif isinstance(content, str):
        deltas += [{"content": piece} for piece in re.findall(r"\S+\s*|\s+", content)]
    elif content is not None:
        deltas.append({"content": content})  # a wrong type, in one chunk
    if "tool_calls" in message:
        deltas += [{"tool_calls": f} for f in _tool_call_fragments(message["tool_calls"])]
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    include_usage = (body.get("stream_options") or {}).get("include_usage") is True
    created = int(time.time())
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": body.get("model", "fake-model"),
        "system_fingerprint": None,
    }
    if include_usage:
        base["usage"] = None  # in every chunk but the last, as OpenAI sends it
    override = reply.get("override", {})
    chunks = [
        {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
            **override,
        }
        for delta in deltas
    ]
    closing = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}
    chunks.append({**base, "choices": [closing], **override})
    if include_usage:
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        chunks.append({**base, "choices": [], "usage": usage, **override})
    return chunks


def _tool_call_fragments(tool_calls: Any) -> list[Any]:
    """Each value of `delta.tool_calls` that streams `tool_calls`, in order."""
    if not isinstance(tool_calls, list):
        return [tool_calls]  # a wrong type, as is
    fragments: list[Any] = []
    for index, call in enumerate(tool_calls):
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(call, dict) or not isinstance(arguments, str):
            fragments.append([{"index": index, **call} if isinstance(call, dict) else call])
            continue
        assert isinstance(function, dict)
        fragments.append([{"index": index, **call, "function": {**function, "arguments": ""}}])
        fragments += [
            [{"index": index, "function": {"arguments": arguments[i : i + 8]}}]
            for i in range(0, len(arguments), 8)
        ]
    return fragments


def _event(payload: Any) -> bytes:
    return b"data: " + _json(payload) + b"\n\n"


def _json(payload: Any) -> bytes:
    # ensure_ascii (the default) writes lone surrogates as \udXXX escapes,
    # which is how a real server's JSON would carry them.
    return json.dumps(payload).encode()


def _asks_for_suggestions(body: dict[str, Any]) -> bool:
    from memchat.prompts import suggestions

    first = (body.get("messages") or [{}])[0]
    return first.get("role") == "system" and first.get("content") == suggestions.INSTRUCTIONS


def suggested(body: dict[str, Any]) -> str:
    """The default answer to a suggestions request: three questions naming
    the quoted conversation's last user message."""
    from memchat.prompts import suggestions

    said = suggestions.conversation_of(str(body["messages"][-1].get("content", "")))
    last = next((text for role, text in reversed(said) if role == "user"), "")
    return json.dumps(
        {"suggestions": [f"{which} about {last}?" for which in ("Why", "How", "When")]}
    )
