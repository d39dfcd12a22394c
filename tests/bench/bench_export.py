"""Benchmark: streaming export of one large session.

Run on demand (pytest does not collect `bench_*.py`):

    python tests/bench/bench_export.py [--messages 100000] [--runs 3]

One session is filled with N LangChain-shaped messages (generate_series on a
superuser connection, ~200 characters each, some non-ASCII), then
`GET /chat/export/{id}` is called on the ASGI app itself (token check,
middleware, StreamingResponse; one database connection, as in Lambda) for
json, ndjson and markdown. The bytes are written to a temporary file as each
body message arrives and checked after the timed runs (json.loads of the
document, of every NDJSON line; the Markdown message headers counted).

- seconds: wall clock from the request to the last body byte (median of runs).
- messages/s: N / seconds.
- peak RSS MB: this process's resident set (Python, the app, psycopg; the
  PostgreSQL server is another process), sampled every 2 ms with psutil
  while the export runs; the highest sample over all runs of that format.

Targets for json and ndjson: >= 50,000 messages/s and peak RSS < 150 MB.
Markdown is reported for information (it re-reads every message in Python).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil

from memchat import bootstrap, devtokens
from memchat.config import load_settings
from tests.bench import _common as common

FORMATS = ("json", "ndjson", "markdown")
TARGETS = {"json", "ndjson"}
MIN_RATE = 50_000
MAX_RSS_MB = 150.0
SAMPLE_SECONDS = 0.002
MB = 1024 * 1024

# Odd positions human, even ai (with the metadata a real answer carries).
_FILL = """
insert into public.chat_message_history (session_id, user_id, message)
select %(session_id)s, %(user_id)s,
       case when g %% 2 = 1 then jsonb_build_object(
           'type', 'human',
           'data', jsonb_build_object(
               'content', 'question ' || g || ': ' || %(text)s, 'type', 'human',
               'additional_kwargs', '{}'::jsonb, 'response_metadata', '{}'::jsonb,
               'name', null, 'id', null))
       else jsonb_build_object(
           'type', 'ai',
           'data', jsonb_build_object(
               'content', 'answer ' || g || ': ' || %(text)s, 'type', 'ai',
               'additional_kwargs', '{}'::jsonb,
               'response_metadata', jsonb_build_object('model_name', 'gpt-4o-mini'),
               'tool_calls', '[]'::jsonb, 'invalid_tool_calls', '[]'::jsonb,
               'usage_metadata', jsonb_build_object(
                   'input_tokens', 120, 'output_tokens', 40, 'total_tokens', 160),
               'name', null, 'id', null))
       end
  from generate_series(1, %(count)s) g
 order by g
"""
_TEXT = "héllo 👋 日本 — " + "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 3


def fill_session(admin: Any, user_id: uuid.UUID, count: int) -> uuid.UUID:
    session_id = uuid.uuid4()
    admin.execute(
        "insert into public.chat_sessions (id, user_id, title, message_count, expires_at)"
        " values (%s, %s, 'benchmark', %s, now() + interval '1 day')",
        (session_id, user_id, count),
    )
    admin.execute(
        _FILL, {"session_id": session_id, "user_id": user_id, "count": count, "text": _TEXT}
    )
    return session_id


class PeakRss:
    """Samples this process's RSS in a thread while the block runs."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(SAMPLE_SECONDS)

    def __enter__(self) -> PeakRss:
        self.peak = self._process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


@dataclass
class Run:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    bytes: int = 0
    chunks: int = 0


async def get(app: Any, path: str, query: str, token: str, sink: BinaryIO) -> Run:
    """One GET through the ASGI app; body messages go to `sink` as they arrive."""
    run = Run()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"bench"), (b"authorization", f"Bearer {token}".encode())],
        "server": ("bench", 80),
        "client": ("127.0.0.1", 50000),
    }
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            run.status = message["status"]
            run.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message.get("body"):
            run.chunks += 1
            run.bytes += len(message["body"])
            sink.write(message["body"])

    await app(scope, receive, send)
    return run


def check(fmt: str, path: Path, count: int) -> str:
    """Parse what was streamed; returns a short description or raises."""
    if fmt == "json":
        with path.open("rb") as f:
            body = json.load(f)
        assert len(body["messages"]) == count, len(body["messages"])
        assert "👋" in body["messages"][0]["content"]
        return f"json.loads: {count} messages"
    if fmt == "ndjson":
        lines = 0
        with path.open("rb") as f:
            for line in f:
                item = json.loads(line)
                assert item["type"] == ("session" if lines == 0 else "message")
                lines += 1
        assert lines == count + 1, lines
        return f"{lines} lines, each json.loads"
    text = path.read_text(encoding="utf-8")
    users = text.count("\n**user** · ")
    assert users == count // 2 + count % 2, users
    return f"{users} '**user** ·' headers"


async def bench(target: common.Target, count: int, runs: int) -> None:
    admin = common.admin_connection(target.url)
    load_at_start = common.load_average()
    caller = common.create_user(admin)
    session_id = fill_session(admin, caller.user_id, count)
    warmup_id = fill_session(admin, caller.user_id, 200)
    common.vacuum_analyze(admin, "public.chat_message_history", "public.chat_sessions")

    settings = load_settings(
        database_url=target.url,
        supabase_jwt_secret=common.JWT_SECRET,
        openai_api_key="unused",
        db_max_connections=1,
    )
    app = bootstrap.app(settings)
    token = devtokens.mint(common.JWT_SECRET, caller.user_id)
    baseline = 0
    seconds: dict[str, list[float]] = {f: [] for f in FORMATS}
    peaks: dict[str, int] = dict.fromkeys(FORMATS, 0)
    sizes: dict[str, tuple[int, int]] = {}
    checks: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="memchat-bench-export-") as tmp:
        outputs = {f: Path(tmp) / f"export.{f}" for f in FORMATS}
        for fmt in FORMATS:  # warm up imports, the connection, the code paths
            with outputs[fmt].open("wb") as sink:
                await get(app, f"/chat/export/{warmup_id}", f"format={fmt}", token, sink)
        baseline = psutil.Process().memory_info().rss
        for _ in range(runs):
            for fmt in FORMATS:
                with outputs[fmt].open("wb") as sink, PeakRss() as rss:
                    started = time.perf_counter()
                    result = await get(
                        app, f"/chat/export/{session_id}", f"format={fmt}", token, sink
                    )
                    elapsed = time.perf_counter() - started
                assert result.status == 200, result.status
                seconds[fmt].append(elapsed)
                peaks[fmt] = max(peaks[fmt], rss.peak)
                sizes[fmt] = (result.bytes, result.chunks)
        for fmt in FORMATS:  # after timing: parsing a whole document costs memory
            checks[fmt] = check(fmt, outputs[fmt], count)
    await app.state.memchat.close()

    rows = []
    verdicts = []
    for fmt in FORMATS:
        median = statistics.median(seconds[fmt])
        rate = count / median
        peak_mb = peaks[fmt] / MB
        rows.append(
            [
                fmt,
                f"{count:,}",
                f"{median:.3f}",
                f"{rate:,.0f}",
                f"{sizes[fmt][0] / MB:.1f}",
                f"{sizes[fmt][1]}",
                f"{peak_mb:.1f}",
                checks[fmt],
            ]
        )
        if fmt in TARGETS:
            ok = rate >= MIN_RATE and peak_mb < MAX_RSS_MB
            verdicts.append(
                f"{fmt}: {'PASS' if ok else 'FAIL'} "
                f"({rate:,.0f} >= {MIN_RATE:,} messages/s, {peak_mb:.1f} < {MAX_RSS_MB:.0f} MB)"
            )
    print(common.machine_report(admin, target, load_at_start=load_at_start))
    print(
        f"rss:        {baseline / MB:.1f} MB after warm-up, before the timed runs;"
        f" ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB"
        " (includes the checks)"
    )
    print(f"runs:       {runs} per format, seconds = median\n")
    print(
        common.format_table(
            [
                "format",
                "messages",
                "seconds",
                "messages/s",
                "MB out",
                "chunks",
                "peak RSS MB",
                "checked",
            ],
            rows,
        )
    )
    print()
    print("\n".join(verdicts))
    admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with common.database() as target:
        asyncio.run(bench(target, args.messages, args.runs))


if __name__ == "__main__":
    main()
