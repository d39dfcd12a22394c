"""An OpenAI-compatible `/v1/embeddings` proxy that caches on disk, for benchmarks.

Every input is looked up by (model, sha256 of the text as sent, dimensions)
in a SQLite file; only the misses are sent upstream, in one request, and
stored. memchat talks to it through its normal embeddings client
(EMBEDDING_BASE_URL), so a benchmark exercises the production path while a
rerun over the same texts (LongMemEval's haystacks repeat across questions)
costs lookups, not model time.

    with EmbeddingCache(upstream="http://127.0.0.1:8765/v1", path=cache_file) as cache:
        settings = {"embedding_base_url": cache.url, ...}
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import urllib.request
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class EmbeddingCache:
    """The proxy, serving on 127.0.0.1 in a thread while the block runs."""

    def __init__(self, *, upstream: str, path: Path, api_key: str = "local") -> None:
        self.upstream = upstream.rstrip("/")
        self.api_key = api_key
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.execute(
            "create table if not exists vectors"
            " (model text, digest text, dimensions integer, vector blob,"
            "  primary key (model, digest, dimensions))"
        )
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> EmbeddingCache:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._db.close()

    def embed(self, model: str, texts: list[str], dimensions: int | None) -> list[list[float]]:
        """The vectors of `texts`, from the cache or upstream (misses in one request)."""
        digests = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
        key_dims = dimensions or 0
        found: dict[str, list[float]] = {}
        with self._lock:
            for digest in set(digests):
                row = self._db.execute(
                    "select vector from vectors where model = ? and digest = ? and dimensions = ?",
                    (model, digest, key_dims),
                ).fetchone()
                if row:
                    found[digest] = array("f", row[0]).tolist()
        missing = list(dict.fromkeys(d for d in digests if d not in found))
        self.hits += len(texts) - sum(1 for d in digests if d in missing)
        if missing:
            texts_of = dict(zip(digests, texts, strict=True))
            vectors = self._upstream(model, [texts_of[d] for d in missing], dimensions)
            with self._lock:
                for digest, vector in zip(missing, vectors, strict=True):
                    found[digest] = vector
                    self._db.execute(
                        "insert or replace into vectors values (?, ?, ?, ?)",
                        (model, digest, key_dims, array("f", vector).tobytes()),
                    )
                self._db.commit()
            self.misses += len(missing)
        return [found[d] for d in digests]

    def _upstream(self, model: str, texts: list[str], dimensions: int | None) -> list[list[float]]:
        body: dict[str, Any] = {"model": model, "input": texts}
        if dimensions:
            body["dimensions"] = dimensions
        request = urllib.request.Request(
            f"{self.upstream}/embeddings",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json", "authorization": f"Bearer {self.api_key}"},
        )
        with urllib.request.urlopen(request, timeout=3600) as response:
            data = json.loads(response.read())["data"]
        return [item["embedding"] for item in sorted(data, key=lambda item: item["index"])]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        cache = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length))
                inputs = body["input"]
                texts = [inputs] if isinstance(inputs, str) else list(inputs)
                vectors = cache.embed(body["model"], texts, body.get("dimensions"))
                payload = json.dumps(
                    {
                        "object": "list",
                        "model": body["model"],
                        "data": [
                            {"object": "embedding", "index": i, "embedding": v}
                            for i, v in enumerate(vectors)
                        ],
                        "usage": {"prompt_tokens": 0, "total_tokens": 0},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler
