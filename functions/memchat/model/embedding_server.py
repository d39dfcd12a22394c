"""A local OpenAI-compatible embeddings server: all-MiniLM-L6-v2, offline.

For development and benchmarks: real embeddings (meaning, not shared
words; memchat.model.minilm) with no key and no network. It speaks the part
of OpenAI's API that embedding clients use:

- `POST /v1/embeddings` (or `/embeddings`): `{"model", "input": a string or
  an array of strings, "dimensions"?, "encoding_format"?: "float" |
  "base64"}` answered as OpenAI does (`{"object": "list", "data": [{"object":
  "embedding", "index", "embedding"}], "model", "usage"}`), 384 floats per
  input, unit length;
- `GET /v1/models` and `GET /v1/models/{id}`: the one model.

What it refuses, in OpenAI's error shape (`{"error": {"message", "type",
"param", "code"}}`): a model other than all-MiniLM-L6-v2 (404
`model_not_found`: the model a client names is the one memchat records with
each embedding, so it must be the one that made it), `dimensions` other
than 384 (400: the model has one size), token-id inputs, an empty or
too-long input list, a body that is not such JSON (400), a body over
MAX_BODY_BYTES, an input over MAX_INPUT_CHARS characters (naming it:
`input[3]`) and inputs over MAX_REQUEST_CHARS characters in all (413).

A thread per connection (the standard library's ThreadingHTTPServer). The
work is done in steps that take turns, since each uses the cores (numpy's
BLAS, the tokenizer's threads): the tokenizing of at most
_TOKENIZE_CHARS characters, or one forward pass (minilm's batches). The
next turn goes to the waiting request that has had the least time so far,
so a new request goes ahead of one that has been running, and a one-line
query waits for one step of a large request, not all of it. It logs
nothing of what it embeds.

Example:
    server = EmbeddingServer(minilm.load(), port=0)
    server.start()                      # in a background thread
    # EMBEDDING_BASE_URL=server.url, OPENAI_EMBEDDING_MODEL=all-MiniLM-L6-v2,
    # EMBEDDING_DIMENSIONS=384
    server.close()
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import itertools
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from memchat.model.minilm import DIMENSIONS, MAX_CHARS, MAX_TOKENS, NAME
from memchat.packing import packed

if TYPE_CHECKING:
    from memchat.model.minilm import MiniLM

logger = logging.getLogger(__name__)

# Names a client may ask for: the model's, and its Hugging Face id.
MODEL_NAMES = frozenset({NAME, f"sentence-transformers/{NAME}"})
MAX_INPUTS = 2048  # OpenAI's limit per request
MAX_BODY_BYTES = 16 * 1024 * 1024
# The longest input (characters): all the tokenizer is ever shown of a text
# (minilm.MAX_CHARS: ten times the most that the model's 256 word pieces can
# span, and the longest message memchat stores by default), so what is
# accepted is embedded exactly as the whole text would be.
MAX_INPUT_CHARS = MAX_CHARS
# The most characters a request may hold, its inputs together: the most
# memchat sends with its defaults (EMBEDDING_BATCH_SIZE 64 messages of
# MAX_MESSAGE_CHARS 16,000, and their fact sentences, parts of them) fits.
# The forward passes are bounded by MAX_INPUTS texts of 256 word pieces
# whatever the characters; this bounds the tokenizing.
MAX_REQUEST_CHARS = 2 * 1024 * 1024
# Characters tokenized in one turn: no longer than a forward pass takes.
_TOKENIZE_CHARS = 64 * 1024
_MODEL_CARD = {"id": NAME, "object": "model", "created": 0, "owned_by": "sentence-transformers"}


class _Refused(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": code,
            }
        }


class EmbeddingServer:
    """The server on `host`:`port` (0: a free port; `url` says which)."""

    def __init__(self, model: MiniLM, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.model = model
        self._turns = _Turns()
        self._thread: threading.Thread | None = None
        server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
        self._http = server_class((host, port), _handler(self))
        self._http.daemon_threads = True

    @property
    def url(self) -> str:
        """The base URL clients use (OPENAI_BASE_URL's form: ends in /v1)."""
        host, port = self._http.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        shown = f"[{name}]" if ":" in name else name
        return f"http://{shown}:{port}/v1"

    def start(self) -> None:
        """Serve in a background thread (until `close`)."""
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="embeddings", daemon=True
        )
        self._thread.start()

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (Ctrl-C)."""
        try:
            self._http.serve_forever()
        finally:
            self._http.server_close()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) for one request."""
        route = path.split("?", 1)[0].rstrip("/")
        route = route.removeprefix("/v1")
        try:
            if method == "POST" and route == "/embeddings":
                return 200, self._embeddings(_request_body(body))
            if method == "GET" and route == "/models":
                return 200, {"object": "list", "data": [_MODEL_CARD]}
            if method == "GET" and route.startswith("/models/"):
                _check_model(route.removeprefix("/models/"))
                return 200, _MODEL_CARD
            raise _Refused(404, f"no route {method} {path}", code="not_found")
        except _Refused as refused:
            return refused.status, refused.body

    def _embeddings(self, request: dict[str, Any]) -> dict[str, Any]:
        model = request.get("model")
        if not isinstance(model, str):
            raise _Refused(400, "model is required (all-MiniLM-L6-v2)", param="model")
        _check_model(model)
        texts = _inputs(request.get("input"))
        dimensions = request.get("dimensions")
        if dimensions is not None and (type(dimensions) is not int or dimensions != DIMENSIONS):
            raise _Refused(
                400,
                f"{NAME} makes {DIMENSIONS}-dimensional embeddings; dimensions must be"
                f" {DIMENSIONS} or left out",
                param="dimensions",
            )
        encoding = request.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise _Refused(400, "encoding_format must be float or base64", param="encoding_format")
        job = self._turns.job()
        ids: list[list[int]] = []
        for chunk in _chunks(texts):
            with job.turn():
                ids += self.model.tokenize(chunk)
        vectors = self.model.embed_tokens(ids, turn=job.turn)
        tokens = sum(len(i) for i in ids)
        data = [
            {
                "object": "embedding",
                "index": index,
                # base64: the little-endian float32 bytes (what the openai SDK asks for).
                "embedding": (
                    base64.b64encode(vector.astype("<f4").tobytes()).decode()
                    if encoding == "base64"
                    else vector.tolist()
                ),
            }
            for index, vector in enumerate(vectors)
        ]
        return {
            "object": "list",
            "data": data,
            "model": NAME,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


class _Turns:
    """One step at a time (a forward pass, or some tokenizing), the next to
    the waiting job that has had the least time in its turns, the first to
    ask of equals: least attained service. A new request (none yet) goes
    before those already running, and two large ones share the steps."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[float, int]] = []  # a heap of (time had, ticket)
        self._tickets = itertools.count()

    def job(self) -> _Job:
        return _Job(self)

    @contextlib.contextmanager
    def take(self, job: _Job) -> Iterator[None]:
        place = (job.seconds, next(self._tickets))
        with self._changed:
            heapq.heappush(self._waiting, place)
            while self._busy or self._waiting[0] != place:
                self._changed.wait()
            heapq.heappop(self._waiting)
            self._busy = True
        start = time.perf_counter()
        try:
            yield
        finally:
            job.seconds += time.perf_counter() - start
            with self._changed:
                self._busy = False
                self._changed.notify_all()


class _Job:
    """One request's share of the turns."""

    def __init__(self, turns: _Turns) -> None:
        self._turns = turns
        self.seconds = 0.0  # time had in its turns

    def turn(self) -> contextlib.AbstractContextManager[None]:
        return self._turns.take(self)


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _check_model(model: str) -> None:
    if model not in MODEL_NAMES:
        raise _Refused(
            404,
            f"The model `{model[:100]}` does not exist: this server has {NAME}",
            param="model",
            code="model_not_found",
        )


def _request_body(body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        raise _Refused(400, "the body is not JSON") from None
    if not isinstance(request, dict):
        raise _Refused(400, "the body must be a JSON object")
    return request


def _inputs(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise _Refused(
            400,
            "input must be a string or an array of strings (token ids are not accepted)",
            param="input",
        )
    if not texts or len(texts) > MAX_INPUTS:
        raise _Refused(400, f"input must hold 1 to {MAX_INPUTS} strings", param="input")
    for index, text in enumerate(texts):
        if len(text) > MAX_INPUT_CHARS:
            name = "input" if isinstance(value, str) else f"input[{index}]"
            raise _Refused(
                413,
                f"{name} is {len(text)} characters; an input may have at most"
                f" {MAX_INPUT_CHARS} ({NAME} reads its first {MAX_TOKENS} word pieces only)",
                param="input",
                code="input_too_long",
            )
    total = sum(len(text) for text in texts)
    if total > MAX_REQUEST_CHARS:
        raise _Refused(
            413,
            f"the inputs are {total} characters in all; a request may have at most"
            f" {MAX_REQUEST_CHARS} (send them in several requests)",
            param="input",
            code="request_too_large",
        )
    return texts


def _chunks(texts: list[str]) -> Iterator[list[str]]:
    """`texts` in runs of at most _TOKENIZE_CHARS characters as the tokenizer
    is shown them (one text alone may be more)."""
    return packed(texts, lambda text: min(len(text), MAX_CHARS), _TOKENIZE_CHARS)


def _handler(server: EmbeddingServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse their connection

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("embeddings server: " + format, *args)

        def do_GET(self) -> None:
            self._reply(*server.answer("GET", self.path, b""))

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("content-length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY_BYTES:
                refused = _Refused(413, f"the body must be at most {MAX_BODY_BYTES} bytes")
                self.close_connection = True  # its body is left unread
                self._reply(refused.status, refused.body)
                return
            self._reply(*server.answer("POST", self.path, self.rfile.read(length)))

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
