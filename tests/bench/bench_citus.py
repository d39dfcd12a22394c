"""Benchmark: a turn's memory work on plain PostgreSQL and on Citus.

Run on demand (pytest does not collect `bench_*.py`):

    .venv/bin/python tests/bench/bench_citus.py [--users 20] [--turns 50]
        [--iterations 100] [--warmup 10] [--latency-ms 1]

The same data on two engines: an embedded PostgreSQL 18 (pgserver) and a
Citus 14 cluster of a coordinator and two workers on this machine
(infra/citus.sh, built from the vendored source), both migrated, the Citus
one distributed by `memchat db distribute`. Each of --users users has
--turns turns stored in one session. Then, through a proxy adding
--latency-ms to every round trip (tests/bench/_common.py, LatencyProxy),
each user in turn runs a turn's memory calls as the API does
(`memchat.store.db.Database` logged in as `memchat_api`, one round trip each, under
row-level security): `store.load_context` (window 10), `store.recall` (k 10,
by meaning and words over the stored turns' embeddings) and
`store.record_turn` (a human + ai pair, with its embedding). Timed on the
client, median and p95 ms per call, and Citus's against plain PostgreSQL's;
the timed turns go in rounds alternating between the engines, so that what
else the machine does falls on both alike.

On Citus it also counts each call's shard groups: the call once more with
`citus.log_remote_commands` and `citus.log_local_commands` (a delegated
function's statements run locally on its worker), the shards the commands
name, grouped by their hash range (a user's rows of every co-located table
share one). Every request must touch one.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

import psycopg

from tests.bench import _common as common

common.ensure_import_path()

from memchat import store  # noqa: E402
from memchat.devdb import API_ROLE, role_conninfo  # noqa: E402
from memchat.store.db import Database  # noqa: E402
from memchat.store.distribute import distribute  # noqa: E402
from memchat.store.migrations import migrate  # noqa: E402
from tests.utils.citus_cluster import citus_cluster, shard_groups  # noqa: E402
from tests.utils.store_data import (  # noqa: E402
    exchange,
    load_context_args,
    record_turn_args,
    turn,
)

WINDOW = 10
CALLS = ("load_context", "recall", "record_turn")
MODEL = "bench-citus"
DIMS = 512  # the column as the migrations make it
ROUNDS = 10  # the timed turns in rounds alternating between the engines


def embedding(seed: int) -> store.Embedding:
    """A unit-ish vector of its own per seed: recall has distances to rank."""
    values = [0.0] * DIMS
    values[seed % DIMS] = 1.0
    values[(seed * 7 + 3) % DIMS] = 0.5
    return store.Embedding(MODEL, values)


def recall_query(session: uuid.UUID, i: int) -> store.RecallQuery:
    return store.RecallQuery(
        session_id=session,
        agent_name="default",
        window=WINDOW,
        embedding=embedding(i),
        k=10,
        min_score=0.0,
        text=f"which question {i % 50} did I ask?",
        duplicate_score=0.95,
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--turns", type=int, default=50, help="stored turns per user")
    parser.add_argument("--iterations", type=int, default=100, help="timed turns per user")
    parser.add_argument("--warmup", type=int, default=10, help="untimed turns per user first")
    parser.add_argument("--latency-ms", type=float, default=1.0)
    parser.add_argument(
        "--clients",
        default="1,4,16",
        help="concurrent clients for the throughput part (comma-separated; empty: none)",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="per throughput run")
    return parser.parse_args()


async def fill(db: Database, admin: psycopg.Connection[Any], users: int, turns: int) -> list[Any]:
    """`users` users, each with `turns` turns in one session: (caller, session id)."""
    filled = []
    for _ in range(users):
        caller = common.create_user(admin)
        session = uuid.uuid4()
        for t in range(turns):
            said = turn(session, exchange(f"question {t} of mine", f"answer {t}"))
            await store.record_turn(db, caller, replace(said, embedding=embedding(t)))
        filled.append((caller, session))
    return filled


def calls(db: Database, caller: Any, session: uuid.UUID, i: int) -> dict[str, Any]:
    async def load() -> Any:
        return await store.load_context(
            db, caller, session_id=session, agent_name="default", window=WINDOW
        )

    async def recall() -> Any:
        return await store.recall(db, caller, recall_query(session, i))

    async def record() -> Any:
        said = turn(session, exchange(f"timed question {i}", f"timed answer {i}"))
        return await store.record_turn(db, caller, replace(said, embedding=embedding(i)))

    return {"load_context": load, "recall": recall, "record_turn": record}


async def timed(
    engines: dict[str, tuple[str, list[Any]]], args: argparse.Namespace
) -> dict[str, dict[str, common.Stats]]:
    """Each engine's calls, --warmup untimed turns per user first, then
    --iterations timed ones in ROUNDS rounds that alternate between the
    engines (so both share whatever the machine does meanwhile):
    {engine: {call: Stats}}."""
    dbs = {name: Database(url, max_connections=1) for name, (url, _) in engines.items()}
    samples = {name: {call: list[float]() for call in CALLS} for name in engines}

    async def turns(name: str, begin: int, end: int, timing: bool) -> None:
        for i in range(begin, end):
            for caller, session in engines[name][1]:
                for call, run in calls(dbs[name], caller, session, i).items():
                    with common.Timer() as timer:
                        await run()
                    if timing:
                        samples[name][call].append(timer.ms)

    rounds = max(1, min(ROUNDS, args.iterations))
    try:
        for name in engines:
            await turns(name, 0, args.warmup, False)
        for r in range(rounds):
            begin = args.warmup + r * args.iterations // rounds
            end = args.warmup + (r + 1) * args.iterations // rounds
            for name in list(engines) if r % 2 == 0 else list(reversed(engines)):
                await turns(name, begin, end, True)
    finally:
        for db in dbs.values():
            await db.close()
    return {
        name: {call: common.summarize(values) for call, values in by_call.items()}
        for name, by_call in samples.items()
    }


async def throughput(url: str, filled: list[Any], clients: int, seconds: float) -> float:
    """Turns per second (each a turn's three calls) that `clients` concurrent
    clients, each with a connection of its own and a user of its own (round
    robin), complete in `seconds`, straight to the database (no proxy)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    done = 0

    async def client(k: int) -> None:
        nonlocal done
        caller, session = filled[k % len(filled)]
        db = Database(url, max_connections=1)
        try:
            i = 10_000 * (k + 1)
            while loop.time() < deadline:
                for call in calls(db, caller, session, i).values():
                    await call()
                done += 1
                i += 1
        finally:
            await db.close()

    await asyncio.gather(*(client(k) for k in range(clients)))
    return done / seconds


def call_shard_groups(coordinator_url: str, caller: Any, session: uuid.UUID) -> dict[str, int]:
    """Each call's shard groups on Citus: its statements once more
    (tests/utils/citus_cluster.py, shard_groups)."""
    from memchat.store.embeddings import RECALL, RECALL_MEMORIES, recall_params
    from memchat.store.turns import LOAD_CONTEXT, RECORD_TURN

    counted = exchange("counted question", "counted answer")
    recalled = recall_params(caller.user_id, recall_query(session, 7))
    statements: dict[str, list[tuple[str, Any]]] = {
        "load_context": [(LOAD_CONTEXT, load_context_args(caller.user_id, session, WINDOW))],
        "recall": [(RECALL, recalled), (RECALL_MEMORIES, recalled)],
        "record_turn": [(RECORD_TURN, record_turn_args(caller.user_id, session, counted))],
    }
    return {
        name: shard_groups(coordinator_url, caller.claims, sent)
        for name, sent in statements.items()
    }


async def prepare(
    name: str, url: str, args: argparse.Namespace, stack: ExitStack
) -> tuple[str, str, list[Any], float]:
    """The engine's users filled in and its proxy: (API login url, proxy
    url, filled, round trip ms)."""
    admin = stack.enter_context(psycopg.connect(url, autocommit=True))
    url = role_conninfo(url, API_ROLE)  # the API's login, as deployed
    filler = Database(url, max_connections=1)
    try:
        filled = await fill(filler, admin, args.users, args.turns)
    finally:
        await filler.close()
    proxy = stack.enter_context(common.LatencyProxy(url, args.latency_ms))
    rtt = common.round_trip_ms(proxy.url, 200).median
    print(f"{name}: filled {args.users} users x {args.turns} turns; round trip {rtt:.2f} ms")
    return url, proxy.url, filled, rtt


async def rates(name: str, url: str, filled: list[Any], args: argparse.Namespace) -> Any:
    """Turns per second by --clients."""
    found = {}
    for clients in [int(c) for c in args.clients.split(",") if c]:
        found[clients] = await throughput(url, filled, clients, args.seconds)
        print(f"{name}: {clients} clients, {found[clients]:.0f} turns/s")
    return found


def main() -> None:
    args = parse_args()
    load_at_start = common.load_average()
    home = Path(tempfile.mkdtemp(prefix="memchat-bench-citus-"))
    try:
        with ExitStack() as stack:
            plain = stack.enter_context(common.database())
            cluster = stack.enter_context(citus_cluster(home))
            migrate(cluster.coordinator_url)
            distribute(cluster.coordinator_url)
            loop = asyncio.new_event_loop()
            run: Callable[[Awaitable[Any]], Any] = loop.run_until_complete
            plain_url, plain_proxy, plain_filled, plain_rtt = run(
                prepare("postgresql", plain.url, args, stack)
            )
            citus_url, citus_proxy, filled, citus_rtt = run(
                prepare("citus", cluster.coordinator_url, args, stack)
            )
            stats = run(
                timed(
                    {"postgresql": (plain_proxy, plain_filled), "citus": (citus_proxy, filled)},
                    args,
                )
            )
            plain_stats, citus_stats = stats["postgresql"], stats["citus"]
            plain_rates = run(rates("postgresql", plain_url, plain_filled, args))
            citus_rates = run(rates("citus", citus_url, filled, args))
            groups = call_shard_groups(cluster.coordinator_url, *filled[0])
            loop.close()
            with psycopg.connect(plain.url) as conn:
                report = common.machine_report(conn, plain, load_at_start=load_at_start)
        rows = []
        for call in CALLS:
            p, c = plain_stats[call], citus_stats[call]
            rows.append(
                [
                    call,
                    f"{p.median:.2f} / {p.p95:.2f}",
                    f"{c.median:.2f} / {c.p95:.2f}",
                    f"{c.median / p.median:.2f}x",
                    groups[call],
                ]
            )
        total_p = sum(plain_stats[c].median for c in CALLS)
        total_c = sum(citus_stats[c].median for c in CALLS)
        rows.append(
            [
                "a turn (all three)",
                f"{total_p:.2f}",
                f"{total_c:.2f}",
                f"{total_c / total_p:.2f}x",
                "-",
            ]
        )
        print(report)
        print(
            f"data: {args.users} users x {args.turns} stored turns, window {WINDOW};"
            f" +{args.latency_ms:g} ms per round trip (measured {plain_rtt:.2f} / {citus_rtt:.2f});"
            f" {args.iterations} timed turns per user after {args.warmup}"
        )
        print(
            common.format_table(
                [
                    "call",
                    "postgresql median / p95 ms",
                    "citus median / p95 ms",
                    "citus / postgresql",
                    "shard groups",
                ],
                rows,
            )
        )
        if plain_rates:
            print(
                "throughput: turns/s (a turn's three calls) by concurrent clients, each its own"
                f" connection and user, {args.seconds:g} s each, no added latency"
            )
            print(
                common.format_table(
                    ["clients", "postgresql turns/s", "citus turns/s"],
                    [
                        [str(c), f"{plain_rates[c]:.0f}", f"{citus_rates[c]:.0f}"]
                        for c in plain_rates
                    ],
                )
            )
        goal = total_c <= 2 * total_p and all(groups[c] == 1 for c in CALLS)
        print(f"goal (a turn within 2x, one shard group per call): {'met' if goal else 'MISSED'}")
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
