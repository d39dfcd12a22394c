"""Benchmark: the rolling summary worker, and chat turns while it runs.

Fills `--due` sessions of `--messages` messages each (so each is past its
window and trigger) spread over `--users` users, all queued for a summary,
plus live sessions of the same users that chat turns use. Then:

* idle: chat turns at the store level (`store.load_context` +
  `store.record_turn`, as the API runs a turn), one client, alone;
* worker: `Summarizer.run` drains the queue (logged in as memchat_worker,
  acting for each owner, the model an instant local OpenAI-compatible
  server; both in a child process, as the worker is its own Lambda) while
  the same turns run: sessions summarized per second, and the turns'
  p50/p99 compared with idle.

Half of the turns go to sessions the worker is summarizing, so a turn and a
summary meet on the same rows. The worker runs `--seconds` twice: at the
default pace (SUMMARY_MAX_PER_SECOND) and with no cap, which shows what an
instant model would do to the turns without it. Target: turn p99 while the
worker runs < 1.5x idle.

    python tests/bench/bench_summaries.py                 # ~1 min
    python tests/bench/bench_summaries.py --due 5000 --users 500
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

import psycopg

from memchat import bootstrap, devdb, messages, store
from memchat.config import Settings, load_settings
from memchat.store.db import Database
from tests.bench import _common as common
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.users import claims_for

WINDOW = 10
TRIGGER = 10
CONTENT = "a reply of ordinary length, a sentence or two about what was asked. " * 2


def fill(
    admin: psycopg.Connection[Any], *, users: int, due: int, per_session: int
) -> tuple[list[tuple[uuid.UUID, uuid.UUID]], list[tuple[uuid.UUID, uuid.UUID]]]:
    """(due sessions, live sessions) as (session_id, user_id); the due ones queued."""
    owners = [uuid.uuid4() for _ in range(users)]
    common.insert_users(admin, owners)
    due_sessions = [(uuid.uuid4(), owners[i % users]) for i in range(due)]
    live_sessions = [(uuid.uuid4(), owner) for owner in owners]
    with admin.transaction():
        for sessions, count in ((due_sessions, per_session), (live_sessions, 12)):
            admin.execute(
                "insert into public.chat_sessions (id, user_id, agent_name, message_count,"
                " expires_at) select s, u, 'default', %s, now() + interval '1 day'"
                " from unnest(%s::uuid[], %s::uuid[]) as t(s, u)",
                (count, [s for s, _ in sessions], [u for _, u in sessions]),
            )
            admin.execute(
                "insert into public.chat_message_history (session_id, user_id, message)"
                " select t.s, t.u, jsonb_build_object("
                "   'type', case when g %% 2 = 1 then 'human' else 'ai' end,"
                "   'data', jsonb_build_object('content', 'message ' || g || ' ' || %s,"
                "   'type', case when g %% 2 = 1 then 'human' else 'ai' end))"
                " from unnest(%s::uuid[], %s::uuid[]) as t(s, u), generate_series(1, %s) g"
                " order by g, t.s",
                (CONTENT, [s for s, _ in sessions], [u for _, u in sessions], count),
            )
        admin.execute(
            "insert into memchat.summary_queue (session_id, user_id)"
            " select s, u from unnest(%s::uuid[], %s::uuid[]) as t(s, u)",
            ([s for s, _ in due_sessions], [u for _, u in due_sessions]),
        )
    common.vacuum_analyze(
        admin, "public.chat_sessions", "public.chat_message_history", "memchat.summary_queue"
    )
    return due_sessions, live_sessions


async def one_turn(db: Database, session_id: uuid.UUID, user_id: uuid.UUID) -> float:
    caller = store.Caller(user_id=user_id, claims=claims_for(user_id))
    began = time.perf_counter()
    ctx = await store.load_context(
        db, caller, session_id=session_id, agent_name="default", window=WINDOW
    )
    assert ctx.session is not None
    await store.record_turn(
        db,
        caller,
        store.Turn(
            session_id=session_id,
            agent_name="default",
            messages=[messages.human("and another thing"), messages.ai(CONTENT)],
            title=None,
            ttl=timedelta(hours=168),
            summary_due_after=WINDOW + TRIGGER,
        ),
    )
    return (time.perf_counter() - began) * 1000


def turns_in_thread(
    url: str,
    sessions: list[tuple[uuid.UUID, uuid.UUID]],
    samples: list[float],
    *,
    count: int | None,
    stop: threading.Event,
    warm: threading.Event,
) -> threading.Thread:
    """One client's turns, one after another, in a thread of its own."""

    async def turns() -> None:
        rng = random.Random(7)
        db = Database(url, max_connections=1)
        try:
            for _ in range(30):
                await one_turn(db, *rng.choice(sessions))
            warm.set()
            while not stop.is_set() and (count is None or len(samples) < count):
                samples.append(await one_turn(db, *rng.choice(sessions)))
        finally:
            await db.close()

    thread = threading.Thread(target=asyncio.run, args=(turns(),))
    thread.start()
    return thread


def idle_turns(url: str, sessions: list[tuple[uuid.UUID, uuid.UUID]], count: int) -> list[float]:
    samples: list[float] = []
    turns_in_thread(
        url, sessions, samples, count=count, stop=threading.Event(), warm=threading.Event()
    ).join()
    return samples


async def drain(worker_url: str, model_url: str, seconds: float, pace: float) -> dict[str, Any]:
    settings = load_settings(
        summary_max_per_second=pace,
        database_url=worker_url,
        job="summaries",
        openai_api_key="bench-key",
        openai_base_url=model_url,
        openai_model="fake-model",
        openai_max_retries=0,
        openai_timeout_seconds=10,
        memory_max_history_messages=WINDOW,
        summary_trigger_messages=TRIGGER,
    )
    summarizer = bootstrap.summarizer(settings)
    try:
        return (await summarizer.run(max_seconds=seconds)).as_dict()
    finally:
        await summarizer.close()


def worker_process(worker_url: str, seconds: float, pace: float, results: Any) -> None:
    """The worker and its model in a process of their own, as deployed (its own
    Lambda): the turns' process never waits for the worker's interpreter."""
    model = FakeOpenAI()
    began = time.perf_counter()
    run = asyncio.run(drain(worker_url, model.url, seconds, pace))
    results.put((run, time.perf_counter() - began, model.calls))
    model.close()


def worker_while_turning(
    api_url: str,
    worker_url: str,
    targets: list[tuple[uuid.UUID, uuid.UUID]],
    args: Any,
    pace: float,
) -> tuple[dict[str, Any], float, int, list[float]]:
    """The worker for `args.seconds` (in its own process) while one client chats."""
    during: list[float] = []
    stop, warm = threading.Event(), threading.Event()
    thread = turns_in_thread(api_url, targets, during, count=None, stop=stop, warm=warm)
    warm.wait()
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    worker = spawn.Process(target=worker_process, args=(worker_url, args.seconds, pace, results))
    worker.start()
    result, seconds, model_calls = results.get()
    worker.join()
    stop.set()
    thread.join()
    return result, seconds, model_calls, during


def run(args: argparse.Namespace) -> None:
    load_at_start = common.load_average()
    with common.database() as target:
        admin = common.admin_connection(target.url)
        worker_url = devdb.role_conninfo(target.url, devdb.WORKER_ROLE)
        api_url = devdb.role_conninfo(target.url, devdb.API_ROLE)
        began = time.perf_counter()
        due, live = fill(admin, users=args.users, due=args.due, per_session=args.messages)
        fill_s = time.perf_counter() - began
        # Half the turns on sessions being summarized, half on others.
        targets = live + random.Random(3).sample(due, min(len(due), len(live)))

        idle = idle_turns(api_url, targets, args.turns)
        idle_p99 = common.percentile(idle, 99)
        worker_rows, turn_rows = (
            [],
            [["idle", len(idle), f"{common.summarize(idle).median:.2f}", f"{idle_p99:.2f}", "-"]],
        )
        verdict = ""
        for pace in (args.pace, 0.0):
            result, seconds, calls, during = worker_while_turning(
                api_url, worker_url, targets, args, pace
            )
            label = f"worker, at most {pace:g}/s" if pace else "worker, no pace cap"
            worker_rows.append(
                [
                    label,
                    f"{result['summarized']:,}",
                    f"{seconds:.2f}",
                    f"{result['summarized'] / seconds:,.0f}",
                    f"{calls:,}",
                    f"{result['failed']}",
                ]
            )
            during_p99 = common.percentile(during, 99)
            turn_rows.append(
                [
                    f"while the {label}",
                    len(during),
                    f"{common.summarize(during).median:.2f}",
                    f"{during_p99:.2f}",
                    f"{during_p99 / idle_p99:.2f}x",
                ]
            )
            if pace:
                ok = "met" if during_p99 < 1.5 * idle_p99 else "MISSED"
                verdict = f"target: turn p99 while the worker runs (default pace) < 1.5x idle: {ok}"

        print("# memchat rolling summaries: the worker and chat turns")
        print()
        print(common.machine_report(admin, target, load_at_start=load_at_start))
        print(
            f"data:       {args.due:,} due sessions x {args.messages} messages, {args.users:,}"
            f" users (+1 live session each); filled in {fill_s:.1f} s; window {WINDOW},"
            f" trigger {TRIGGER}; the model: a local OpenAI-compatible server, no delay;"
            f" the worker runs {args.seconds:g} s in a process of its own"
        )
        print()
        print(
            common.format_table(
                ["", "sessions summarized", "seconds", "sessions/s", "model calls", "failed"],
                worker_rows,
            )
        )
        print()
        print(
            common.format_table(
                ["chat turns", "turns", "p50 ms", "p99 ms", "p99 vs idle"], turn_rows
            )
        )
        print()
        print(verdict)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--due", type=int, default=2000, help="queued sessions (2000)")
    parser.add_argument("--messages", type=int, default=30, help="messages each (30)")
    parser.add_argument("--users", type=int, default=200, help="their owners (200)")
    parser.add_argument("--turns", type=int, default=1000, help="idle turns timed (1000)")
    parser.add_argument("--seconds", type=float, default=20, help="each worker run (20)")
    default_pace = Settings.model_fields["summary_max_per_second"].default
    parser.add_argument(
        "--pace",
        type=float,
        default=default_pace,
        help=f"SUMMARY_MAX_PER_SECOND of the paced run (the default, {default_pace:g})",
    )
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
