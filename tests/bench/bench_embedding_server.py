"""Benchmark: what a request costs the local embeddings server (`memchat
embeddings serve`: memchat.model.embedding_server, all-MiniLM-L6-v2 in numpy).

Run on demand (pytest does not collect `bench_*.py`):

    python tests/bench/bench_embedding_server.py [--long-inputs 256]
        [--long-chars 8000] [--busy-inputs 128] [--queries 5]

An EmbeddingServer in this process, on a free port, each request over HTTP
(httpx, a connection each) as a client sends it:

- one string of 10,000,000 characters of prose: the time to its answer
  (413 where the server bounds an input; an embedding where it tokenizes
  the whole string first);
- --long-inputs inputs of --long-chars characters of prose each (each far
  more than the 256 word pieces the model reads): the time to the answer;
- a one-line query sent while a request of --busy-inputs such inputs is in
  flight, --queries times one after another: each query's latency, and
  whether it was answered before the large request.

The forward passes run on one core (BLAS on one thread, taking turns), so
the machine's other work shows in the times: the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

from memchat.model import minilm
from memchat.model.embedding_server import EmbeddingServer
from tests.bench import _common as common

PROSE = (
    "The committee met on Tuesday to review the quarterly figures, and after a long"
    " discussion about the budget it agreed to postpone the decision until spring. "
)
QUERY = "what is my favourite colour?"


def prose(chars: int, seed: int = 0) -> str:
    """`chars` characters of sentences, numbered from `seed` (no two inputs alike)."""
    parts: list[str] = []
    size = 0
    n = seed
    while size < chars:
        part = f"{n}. {PROSE}"
        parts.append(part)
        size += len(part)
        n += 1
    return "".join(parts)[:chars]


def post(url: str, inputs: str | list[str], timeout: float = 600) -> tuple[int, float]:
    """(status, seconds) of one embeddings request on a connection of its own."""
    body = {"model": minilm.NAME, "input": inputs, "encoding_format": "base64"}
    start = time.perf_counter()
    with httpx.Client(timeout=timeout) as client:
        status = client.post(f"{url}/embeddings", json=body).status_code
    return status, time.perf_counter() - start


def busy_queries(url: str, inputs: list[str], queries: int) -> list[list[Any]]:
    """Rows for the queries sent one after another while `inputs` are embedded."""
    done = threading.Event()
    large: dict[str, Any] = {}

    def send_large() -> None:
        large["status"], large["seconds"] = post(url, inputs)
        done.set()

    thread = threading.Thread(target=send_large, daemon=True)
    thread.start()
    time.sleep(0.5)  # its body sent and read: the server is at work on it
    rows: list[list[Any]] = []
    for n in range(1, queries + 1):
        status, seconds = post(url, QUERY)
        rows.append(
            [
                f"one-line query {n} during {len(inputs)} inputs",
                status,
                f"{seconds:.3f}",
                "yes" if not done.is_set() else "no",
            ]
        )
    thread.join()
    rows.append(
        [f"the {len(inputs)}-input request itself", large["status"], f"{large['seconds']:.3f}", ""]
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-inputs", type=int, default=256)
    parser.add_argument("--long-chars", type=int, default=8000)
    parser.add_argument("--busy-inputs", type=int, default=128)
    parser.add_argument("--queries", type=int, default=5)
    args = parser.parse_args()

    load_at_start = common.load_average()
    server = EmbeddingServer(minilm.load(), port=0)
    server.start()
    try:
        url = server.url
        post(url, QUERY)  # warm: the first forward pass allocates
        rows: list[list[Any]] = []
        status, seconds = post(url, prose(10_000_000))
        rows.append(["one 10,000,000-character string", status, f"{seconds:.3f}", ""])
        long = [prose(args.long_chars, seed=i * 1000) for i in range(args.long_inputs)]
        status, seconds = post(url, long)
        rows.append(
            [
                f"{args.long_inputs} inputs of {args.long_chars:,} characters",
                status,
                f"{seconds:.3f}",
                "",
            ]
        )
        rows += busy_queries(url, long[: args.busy_inputs], args.queries)
        post(url, QUERY)
    finally:
        server.close()

    print(f"python:     {platform.python_version()} ({platform.python_implementation()})")
    print(
        f"cpus:       {os.cpu_count()} (load average 1/5/15 min: {load_at_start} at start,"
        f" {common.load_average()} at end)"
    )
    print(f"platform:   {platform.platform()}")
    print(f"command:    {common.command_line()}")
    print()
    print(
        common.format_table(
            ["request", "status", "seconds to answer", "before the large one"], rows
        )
    )


if __name__ == "__main__":
    main()
