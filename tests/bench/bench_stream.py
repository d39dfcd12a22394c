"""Benchmark: streamed chat turns - time to the first words, and passthrough.

Run on demand (pytest does not collect `bench_*.py`):

    python tests/bench/bench_stream.py [--turns 100] [--words 40] [--chunks 2000]
                                       [--endpoint chat|openai]

The app runs under uvicorn on 127.0.0.1 in a process of its own (as `memchat
dev` and the Lambda web adapter run it, logged in as memchat_api) and is
called over loopback HTTP by httpx from this process; the model is the
tests' OpenAI-compatible server (`tests/utils/fake_openai.py`) in a third
process, which streams the answer word by word (one word is about one
token) after a fixed first-token delay of 200 ms. Separate processes: no
component waits for another's interpreter, as none does when deployed.

1. Time to first words. Turns alternate, on sessions with history and the
   whole memory (context, recall's embedding, notes): streamed (`Accept:
   text/event-stream`) and plain JSON. For a streamed turn, the time from
   sending the request to the first byte of the first `delta` event at the
   client, minus the model's 200 ms: what memchat adds before the user sees
   the answer start (auth, context load, recall, the model request, the
   relay). Target: <= 10 ms median. For the JSON turn the user sees nothing
   until the whole answer is there: its wall time, minus the model's whole
   answer time (200 ms + the words' pacing), for comparison.

2. Passthrough. One streamed turn (no memory) whose model echoes a message
   of `--chunks` words as fast as it can, then one paced at 1 ms a word:
   chunks (tokens) a second the model sends when read directly with the
   `openai` SDK, against `delta`
   events a second at the client through memchat, and how many deltas came
   per model chunk (1.00: every chunk was flushed on its own as it came, no
   buffering or coalescing).

Where the processes run: the app alone on one CPU (the last this process may
use), everything else - this client, the model, the embedded database - on
the others (`os.sched_setaffinity`), as deployed: a Lambda instance has its
own vCPU, and the database and the provider are other machines. On a small
machine the four processes would otherwise take turns on the same CPUs, and
the app's share would include waiting for the benchmark's own model server
and client. `--shared-cpus` runs them all on every CPU. With one CPU,
nothing is pinned.

With `--endpoint openai` the turns of 1. go through POST /v1/chat/completions
instead (`stream: true`; the session in X-Session-ID; a delta is a chunk
with `delta.content`): the OpenAI-compatible endpoint's share, measured the
same way against the same budget.

The database is the embedded PostgreSQL (pgserver, temporary directory)
unless DATABASE_URL names a disposable one (see `_common.database`).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx

from memchat import devdb, devtokens
from tests.bench import _common as common
from tests.utils.processes import free_port

FIRST_TOKEN_S = 0.2
TARGET_MS = 10.0
# What starts a piece of the answer on the wire, per endpoint (the OpenAI
# chunk that opens with the role has `"delta":{"role"...`, not this).
DELTA = {"chat": b"event: delta", "openai": b'"delta":{"content":'}
_SPAWN = multiprocessing.get_context("spawn")


# ------------------------------------------------------------ processes


def _model_process(first_token: float, chunk: float, ready: Any, stop: Any) -> None:
    from tests.utils.fake_openai import FakeOpenAI

    model = FakeOpenAI(first_token_delay=first_token, chunk_delay=chunk)
    ready.put(model.url)
    stop.wait()
    model.close()


def _app_process(database_url: str, model_url: str, port: int, cpus: set[int] | None) -> None:
    import uvicorn

    if cpus:
        os.sched_setaffinity(0, cpus)

    from memchat import bootstrap
    from memchat.config import load_settings

    settings = load_settings(
        database_url=database_url,
        supabase_jwt_secret=common.JWT_SECRET,
        openai_api_key="bench-key",
        openai_base_url=model_url,
        openai_model="fake-model",
        openai_max_retries=0,
        db_max_connections=1,  # as in Lambda
        chat_rate_per_minute=0,
        turn_timeout_seconds=60,
        max_message_chars=100_000,
    )
    app = bootstrap.app(settings)
    uvicorn.run(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")


@contextmanager
def model_server(first_token: float, chunk: float) -> Iterator[str]:
    """The fake OpenAI-compatible server in its own process; yields its URL."""
    ready, stop = _SPAWN.Queue(), _SPAWN.Event()
    process = _SPAWN.Process(target=_model_process, args=(first_token, chunk, ready, stop))
    process.start()
    try:
        yield str(ready.get(timeout=60))
    finally:
        stop.set()
        process.join(10)


def place_processes(shared: bool) -> tuple[set[int] | None, str]:
    """Pin this process (and so what it starts: the database, the model) to
    all CPUs but one, kept for the app; (the app's CPUs or None, a line
    saying where each runs)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if shared or len(cpus) < 2:
        return None, f"every process on CPUs {cpus or 'any'} (shared)"
    app, rest = {cpus[-1]}, set(cpus[:-1])
    os.sched_setaffinity(0, rest)
    return app, f"the app alone on CPU {cpus[-1]}; client, model and database on {sorted(rest)}"


@contextmanager
def app_server(database_url: str, model_url: str, cpus: set[int] | None = None) -> Iterator[str]:
    """The app under uvicorn in its own process (on `cpus`, None: any); yields its base URL."""
    port = free_port()
    process = _SPAWN.Process(target=_app_process, args=(database_url, model_url, port, cpus))
    process.start()
    base = f"http://127.0.0.1:{port}"
    try:
        common.wait_for_health(base, process.is_alive)
        yield base
    finally:
        process.terminate()
        process.join(10)


# ---------------------------------------------------------------- turns


def turn_request(
    endpoint: str, body: dict[str, Any], *, stream: bool
) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(path, JSON body, headers) of a turn of POST /chat's `body` at `endpoint`."""
    if endpoint == "chat":
        return "/chat", body, {"Accept": "text/event-stream"} if stream else {}
    if "recall_k" in body or body.get("use_memory") is False:
        raise SystemExit("--endpoint openai takes neither --recall-k nor memory off")
    session = {"X-Session-ID": body["session_id"]} if body.get("session_id") else {}
    openai_body = {
        "model": "memchat",
        "messages": [{"role": "user", "content": body["message"]}],
        "stream": stream,
    }
    return "/v1/chat/completions", openai_body, session


async def streamed(
    client: httpx.AsyncClient, body: dict[str, Any], endpoint: str = "chat"
) -> tuple[float, float, float, list[float]]:
    """(ms to the start event, ms to the first delta byte, ms to the end, and
    when each delta arrived) of one streamed turn."""
    started = time.perf_counter()
    start = 0.0
    seen = b""
    deltas: list[float] = []
    marker = DELTA[endpoint]
    path, sent, headers = turn_request(endpoint, body, stream=True)
    async with client.stream("POST", path, json=sent, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"{response.status_code} {response.text}")
        async for chunk in response.aiter_raw():
            now = time.perf_counter()
            start = start or now
            window = seen[-len(marker) :] + chunk
            deltas.extend([now] * window.count(marker))
            seen = chunk
    if not deltas:
        raise RuntimeError("no delta event")
    ended = time.perf_counter()
    start_ms, first_ms, end_ms = ((t - started) * 1000 for t in (start, deltas[0], ended))
    return start_ms, first_ms, end_ms, deltas


async def plain(client: httpx.AsyncClient, body: dict[str, Any], endpoint: str = "chat") -> float:
    started = time.perf_counter()
    path, sent, headers = turn_request(endpoint, body, stream=False)
    response = await client.post(path, json=sent, headers=headers)
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code} {response.text}")
    return (time.perf_counter() - started) * 1000


async def model_direct(sdk: Any, message: str) -> tuple[float, float, list[float]]:
    """(ms to the first content chunk, ms to the end, when each chunk arrived),
    the model read directly with the openai SDK (one client, as memchat's)."""
    started = time.perf_counter()
    times: list[float] = []
    stream = await sdk.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": message}],
        stream=True,
        stream_options={"include_usage": True},  # as memchat asks: one chunk more
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter())
    ended = time.perf_counter()
    return (times[0] - started) * 1000, (ended - started) * 1000, times


def sdk_for(model_url: str) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(api_key="bench-key", base_url=model_url, max_retries=0)


def client_for(base: str, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120
    )


async def first_words(args: argparse.Namespace, base: str, model_url: str, token: str) -> Any:
    words = " ".join(f"word{i}" for i in range(args.words))
    results: dict[str, list[Any]] = {
        k: []
        for k in (
            "stream_start",
            "stream_first",
            "stream_end",
            "deltas",
            "plain",
            "direct",
            "direct_end",
        )
    }
    async with client_for(base, token) as client, sdk_for(model_url) as sdk:
        sessions = [str(uuid.uuid4()), str(uuid.uuid4())]
        for i in range(args.warmup + args.turns):
            timed = i >= args.warmup
            extra = {} if args.recall_k is None else {"recall_k": args.recall_k}
            body = {"message": f"{i}: {words}", "session_id": sessions[0], **extra}
            start, first, end, deltas = await streamed(client, body, args.endpoint)
            wall = await plain(client, {**body, "session_id": sessions[1]}, args.endpoint)
            # The same answer from the model alone ("echo: " and the message).
            direct, direct_end, _ = await model_direct(sdk, body["message"])
            if timed:
                results["stream_start"].append(start)
                results["stream_first"].append(first)
                results["stream_end"].append(end)
                results["deltas"].append(len(deltas))
                results["plain"].append(wall)
                results["direct"].append(direct)
                results["direct_end"].append(direct_end)
    return results


async def passthrough(base: str, model_url: str, token: str, chunks: int) -> Any:
    message = "w " * (chunks - 2)  # echoed as "echo: " and the message: `chunks` words
    async with client_for(base, token) as client, sdk_for(model_url) as sdk:
        *_, direct = await model_direct(sdk, message)
        *_, relayed = await streamed(client, {"message": message, "use_memory": False})
    return (direct[-1] - direct[0], len(direct)), (relayed[-1] - relayed[0], len(relayed))


def run(args: argparse.Namespace, target: common.Target, cpus: set[int] | None) -> dict[str, Any]:
    url = target.url
    admin = common.admin_connection(url)
    caller = common.create_user(admin)
    admin.close()
    token = devtokens.mint(common.JWT_SECRET, caller.user_id)
    # The embedded server trusts local logins: serve as memchat_api, as deployed.
    api_url = devdb.role_conninfo(url, devdb.API_ROLE) if target.embedded else url
    results: dict[str, Any] = {}
    with (
        model_server(FIRST_TOKEN_S, args.word_delay_ms / 1000) as model_url,
        app_server(api_url, model_url, cpus) as base,
    ):
        results.update(asyncio.run(first_words(args, base, model_url, token)))
    for delay in (0.0, 0.001):
        with model_server(0.0, delay) as model_url, app_server(api_url, model_url, cpus) as base:
            results[f"pass_{delay}"] = asyncio.run(passthrough(base, model_url, token, args.chunks))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100, help="timed turns of each kind")
    parser.add_argument("--warmup", type=int, default=10, help="untimed turns of each kind first")
    parser.add_argument("--words", type=int, default=40, help="words in each message (echoed)")
    parser.add_argument("--word-delay-ms", type=float, default=5.0, help="model pacing")
    parser.add_argument(
        "--recall-k", type=int, default=None, help="recall_k of each turn (default: settings)"
    )
    parser.add_argument("--chunks", type=int, default=2000, help="words in the passthrough turns")
    parser.add_argument(
        "--endpoint",
        choices=sorted(DELTA),
        default="chat",
        help="the turns of part 1: POST /chat, or POST /v1/chat/completions (openai)",
    )
    parser.add_argument(
        "--shared-cpus",
        action="store_true",
        help="run the app on every CPU with the rest, instead of alone on one",
    )
    args = parser.parse_args()

    load_at_start = common.load_average()
    # Before the database starts: it runs where this process may.
    cpus, placement = place_processes(args.shared_cpus)
    with common.database() as target:
        results = run(args, target, cpus)
        with common.admin_connection(target.url) as admin:
            machine = common.machine_report(admin, target, load_at_start=load_at_start)

    # The echoed answer: "echo: ", the turn's number, then the message's words;
    # then the model's finish and usage chunks, paced like the words.
    answer_words = args.words + 2
    model_answer_ms = FIRST_TOKEN_S * 1000 + (answer_words + 1) * args.word_delay_ms
    print(machine)
    print(f"placement:  {placement}")
    path = turn_request(args.endpoint, {"message": ""}, stream=True)[0]
    print(
        f"\nTime to first words through POST {path}:"
        f" {args.turns} turns of each kind (after {args.warmup} untimed),"
        f" interleaved, each kind on its own session with history, whole memory"
        f" (recall_k {'default' if args.recall_k is None else args.recall_k}); the model waits"
        f" {FIRST_TOKEN_S * 1000:.0f} ms before its first token, then sends {answer_words}"
        f" words {args.word_delay_ms:g} ms apart. Each turn is paired with the same answer"
        " read from the model alone (openai SDK, direct).\n"
    )
    pairs = list(zip(results["stream_first"], results["direct"], strict=True))
    minus_fixed = [first - FIRST_TOKEN_S * 1000 for first in results["stream_first"]]
    minus_model = [first - direct for first, direct in pairs]
    rows = []
    for label, samples in (
        ("streamed: start event (memory loaded)", results["stream_start"]),
        ("streamed: first delta byte - 200 ms", minus_fixed),
        (
            "  the model alone: first token - 200 ms",
            [v - FIRST_TOKEN_S * 1000 for v in results["direct"]],
        ),
        ("  memchat's share: first delta - the model alone's first token", minus_model),
        (
            "streamed: last byte - the model alone's whole answer",
            [
                end - alone
                for end, alone in zip(results["stream_end"], results["direct_end"], strict=True)
            ],
        ),
        (
            "JSON: response - the model's whole answer",
            [v - model_answer_ms for v in results["plain"]],
        ),
        ("time to first words, streamed", results["stream_first"]),
        ("time to first words, JSON (the whole response)", results["plain"]),
    ):
        stats = common.summarize(samples)
        rows.append([label, f"{stats.median:.2f}", f"{stats.p95:.2f}", f"{stats.minimum:.2f}"])
    print(common.format_table(["per turn", "median ms", "p95 ms", "min ms"], rows))
    print(f"\ntarget: first delta <= {TARGET_MS:g} ms after the model's first token (median):")
    for what, samples in (
        ("minus the fixed 200 ms", minus_fixed),
        ("minus the model alone's first token, same turn", minus_model),
    ):
        median = common.summarize(samples).median
        print(f"  {what}: {'met' if median <= TARGET_MS else 'NOT met'} ({median:.2f} ms)")
    counts = sorted(set(results["deltas"]))
    print(f"delta events per streamed turn: {counts} (the answer has {answer_words} words)")

    print(
        f"\nPassthrough: one turn of {args.chunks} one-word chunks (no memory): the model read"
        " directly with the openai SDK, then through memchat, at the client.\n"
    )
    rows = []
    for delay in (0.0, 0.001):
        (direct_s, direct_n), (relay_s, relay_n) = results[f"pass_{delay}"]
        rows.append(
            [
                "as fast as it can" if delay == 0 else f"{delay * 1000:g} ms a chunk",
                f"{direct_n / direct_s:,.0f}",
                f"{relay_n / relay_s:,.0f}",
                f"{relay_n / direct_n:.2f}",
            ]
        )
    print(
        common.format_table(
            [
                "model pace",
                "chunks/s, model direct",
                "deltas/s through memchat",
                "deltas per chunk",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
