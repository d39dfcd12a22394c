"""Benchmark: what a chat turn costs besides the model, and the cold import.

Run on demand (pytest does not collect `bench_*.py`):

    python tests/bench/bench_chat.py [--turns 300] [--warmup 30] [--import-runs 5]

1. Turn overhead. POST /chat through the whole ASGI app (httpx ASGITransport,
   in-process: middleware, token check, validation, session resolution,
   prompt, storing, response), on a session that already has history, with a
   model that answers at once: the fake OpenAI-compatible server of the
   tests (`tests/utils/fake_openai.py`, loopback HTTP, echoes). What the
   model call costs is subtracted turn by turn: the chat service reports
   each answered turn to its `on_turn` observer (the hook the Lambda's
   metrics use) with `timings["model_ms"]`, the wall time spent in the model
   client - the `openai` SDK, HTTP to the fake, its answer. So

       overhead = client-side wall time of the request - model_ms

   is the time the app spends outside the model: what a user waits for on top
   of the model's own latency. Also shown: the two database round trips
   (`retrieval_ms`: load the context; `record_ms`: store the turn) and the
   rest (`overhead - retrieval - record`: ASGI, JWT, validation, JSON).
   One database connection, as in Lambda; memory window: the default.

2. Cold import of the module the chat Lambda loads, each in a fresh
   interpreter (the timing functions of `bench_import.py`): wall time of
   `python -c "import <module>"` (median and best of --import-runs) and
   `python -X importtime`'s cumulative microseconds for the module (the
   aim is bench_import.py's ratio against the stack's import).

The database is the embedded PostgreSQL (pgserver, temporary directory)
unless DATABASE_URL names a disposable one (see `_common.database`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import uuid
from pathlib import Path
from time import perf_counter_ns

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memchat import devtokens
from memchat.config import load_settings
from memchat.usecases.chat import ChatResult
from tests.bench import _common as common
from tests.bench import bench_import
from tests.utils.api import ApiClient
from tests.utils.fake_openai import FakeOpenAI

IMPORT_MODULES = [
    ("memchat.api.main", "the FastAPI app"),
    ("memchat.handlers.chat", "the chat Lambda handler (app + Mangum + Powertools)"),
]
MESSAGE = "What did I tell you about my plans for the weekend? " * 3


async def time_turns(url: str, model_url: str, turns: int, warmup: int) -> dict[str, list[float]]:
    settings = load_settings(
        database_url=url,
        supabase_jwt_secret=common.JWT_SECRET,
        openai_api_key="bench-key",
        openai_base_url=model_url,
        openai_model="fake-model",
        openai_max_retries=0,
        db_max_connections=1,
        # The throttle's work is part of every turn; its limit must not be.
        chat_rate_per_minute=100_000,
        chat_rate_burst=100_000,
    )
    api = ApiClient(settings)
    reported: list[ChatResult] = []
    api.app.state.memchat.chat.on_turn = reported.append
    samples: dict[str, list[float]] = {
        k: [] for k in ("wall", "model", "overhead", "retrieval", "record", "rest")
    }
    try:
        admin = common.admin_connection(url)
        caller = common.create_user(admin)
        admin.close()
        auth = {"Authorization": f"Bearer {devtokens.mint(common.JWT_SECRET, caller.user_id)}"}
        session_id = str(uuid.uuid4())
        for i in range(warmup + turns):
            body = {"message": f"{i}: {MESSAGE}", "session_id": session_id}
            started = perf_counter_ns()
            response = await api.post("/chat", json=body, headers=auth)
            wall = (perf_counter_ns() - started) / 1e6
            if response.status_code != 200:
                raise RuntimeError(f"turn {i}: {response.status_code} {response.text}")
            timings = reported.pop().timings
            if i < warmup:
                continue
            overhead = wall - timings["model_ms"]
            samples["wall"].append(wall)
            samples["model"].append(timings["model_ms"])
            samples["overhead"].append(overhead)
            samples["retrieval"].append(timings["retrieval_ms"])
            samples["record"].append(timings["record_ms"])
            samples["rest"].append(overhead - timings["retrieval_ms"] - timings["record_ms"])
        in_context = response.json()["memory"]["messages_in_context"]
        samples["messages_in_context"] = [float(in_context)]
    finally:
        await api.aclose()
    return samples


def time_imports(runs: int) -> list[list[str]]:
    env = bench_import._environment(None)
    rows = []
    for module, what in IMPORT_MODULES:
        walls = [bench_import.wall_ms(sys.executable, module, env) for _ in range(runs)]
        cumulative = [
            next(
                total
                for _, total, _, name in bench_import.importtime(sys.executable, module, env)
                if name == module
            )
            for _ in range(runs)
        ]
        median = statistics.median(walls)
        rows.append(
            [
                f"{module} ({what})",
                f"{median:.0f}",
                f"{min(walls):.0f}",
                f"{statistics.median(cumulative) / 1000:.0f}",
            ]
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300, help="timed turns")
    parser.add_argument("--warmup", type=int, default=30, help="untimed turns first (history)")
    parser.add_argument("--import-runs", type=int, default=5, help="interpreters per module")
    args = parser.parse_args()

    load_at_start = common.load_average()
    model = FakeOpenAI()
    try:
        with common.database() as target:
            samples = asyncio.run(time_turns(target.url, model.url, args.turns, args.warmup))
            with common.admin_connection(target.url) as admin:
                machine = common.machine_report(admin, target, load_at_start=load_at_start)
    finally:
        model.close()
    import_rows = time_imports(args.import_runs)

    print(machine)
    print(
        f"\nTurn overhead: {args.turns} turns (after {args.warmup} untimed) on one session with"
        f" history ({int(samples['messages_in_context'][0])} messages in context), one"
        " database connection, instant fake model over loopback HTTP.\n"
        "overhead = request wall time (client side, ASGI in-process) - model_ms (time in"
        " the model client, from the chat service's on_turn timings).\n"
    )
    labels = {
        "overhead": "overhead (wall - model)",
        "retrieval": "  load context (1 DB round trip)",
        "record": "  record turn (1 DB round trip)",
        "rest": "  rest (ASGI, auth, validation, JSON)",
        "model": "model client (subtracted)",
        "wall": "request wall time",
    }
    rows = []
    for key, label in labels.items():
        stats = common.summarize(samples[key])
        rows.append([label, f"{stats.median:.2f}", f"{stats.p95:.2f}", f"{stats.minimum:.2f}"])
    print(common.format_table(["per turn", "median ms", "p95 ms", "min ms"], rows))

    print(
        "\nCold import, a fresh interpreter per run (modules from this checkout;"
        " tests/bench/bench_import.py holds it against its stack's import),"
        f" {args.import_runs} runs each:\n"
    )
    print(
        common.format_table(
            [
                "module",
                "wall median ms",
                "wall best ms",
                "-X importtime cumulative ms",
            ],
            import_rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
