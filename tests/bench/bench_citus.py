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
row-level security): `store.load_context` (window 10) and
`store.record_turn` (a human + ai pair). Timed on the client, median and p95
ms per call, and Citus's against plain PostgreSQL's.

On Citus it also counts each call's shard groups: the call once more with
`citus.log_remote_commands` and `citus.log_local_commands` (a delegated
function's statements run locally on its worker), the shards the commands
name, grouped by their hash range (a user's rows of every co-located table
share one). Every request must touch one.

Recall is not measured: on Citus its statements cannot be planned yet
(docs/deploy.md, "Citus").
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from functools import partial
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
from tests.utils.citus_cluster import citus_cluster  # noqa: E402
from tests.utils.store_data import (  # noqa: E402
    become,
    exchange,
    load_context_args,
    record_turn_args,
    turn,
)

WINDOW = 10
CALLS = ("load_context", "record_turn")
_SHARD_ID = re.compile(r"_(\d{6,})\b")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--turns", type=int, default=50, help="stored turns per user")
    parser.add_argument("--iterations", type=int, default=100, help="timed turns per user")
    parser.add_argument("--warmup", type=int, default=10, help="untimed turns per user first")
    parser.add_argument("--latency-ms", type=float, default=1.0)
    return parser.parse_args()


async def fill(db: Database, admin: psycopg.Connection[Any], users: int, turns: int) -> list[Any]:
    """`users` users, each with `turns` turns in one session: (caller, session id)."""
    filled = []
    for _ in range(users):
        caller = common.create_user(admin)
        session = uuid.uuid4()
        for t in range(turns):
            await store.record_turn(
                db, caller, turn(session, exchange(f"question {t} of mine", f"answer {t}"))
            )
        filled.append((caller, session))
    return filled


def calls(db: Database, caller: Any, session: uuid.UUID, i: int) -> dict[str, Any]:
    async def load() -> Any:
        return await store.load_context(
            db, caller, session_id=session, agent_name="default", window=WINDOW
        )

    async def record() -> Any:
        return await store.record_turn(
            db, caller, turn(session, exchange(f"timed question {i}", f"timed answer {i}"))
        )

    return {"load_context": load, "record_turn": record}


async def timed(url: str, filled: list[Any], args: argparse.Namespace) -> dict[str, common.Stats]:
    db = Database(url, max_connections=1)
    samples: dict[str, list[float]] = {name: [] for name in CALLS}
    try:
        for i in range(args.warmup + args.iterations):
            for caller, session in filled:
                for name, call in calls(db, caller, session, i).items():
                    with common.Timer() as timer:
                        await call()
                    if i >= args.warmup:
                        samples[name].append(timer.ms)
    finally:
        await db.close()
    return {name: common.summarize(values) for name, values in samples.items()}


def _keep(commands: list[str], diagnostic: psycopg.errors.Diagnostic) -> None:
    commands.append(diagnostic.message_primary or "")


def shard_groups(coordinator_url: str, caller: Any, session: uuid.UUID) -> dict[str, int]:
    """Each call's shard groups on Citus: its statements once more, with the
    commands Citus sends to the workers reported (citus.log_remote_commands)."""
    from memchat.store.turns import LOAD_CONTEXT, RECORD_TURN

    counted = exchange("counted question", "counted answer")
    statements: dict[str, tuple[str, tuple[Any, ...]]] = {
        "load_context": (LOAD_CONTEXT, load_context_args(caller.user_id, session, WINDOW)),
        "record_turn": (RECORD_TURN, record_turn_args(caller.user_id, session, counted)),
    }
    api = role_conninfo(coordinator_url, API_ROLE)
    found = {}
    with psycopg.connect(coordinator_url, autocommit=True) as admin:
        ranges = dict(
            admin.execute(
                "select shardid, shardminvalue from pg_dist_shard where shardminvalue is not null"
            ).fetchall()
        )
    for name, (query, params) in statements.items():
        commands: list[str] = []
        with psycopg.connect(api, autocommit=True, prepare_threshold=None) as conn:
            conn.add_notice_handler(partial(_keep, commands))
            with conn.transaction(force_rollback=True):
                become(conn, caller.claims)
                # The commands to the workers, and a delegated function's
                # own on its worker's shards (local there), as notices.
                conn.execute("set local citus.log_remote_commands = on")
                conn.execute("set local citus.log_local_commands = on")
                conn.execute(query, params)
        touched = {
            ranges[int(m)] for c in commands for m in _SHARD_ID.findall(c) if int(m) in ranges
        }
        found[name] = len(touched)
    return found


async def run_engine(
    name: str, url: str, args: argparse.Namespace, stack: ExitStack
) -> tuple[dict[str, common.Stats], list[Any], float]:
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
    return await timed(proxy.url, filled, args), filled, rtt


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
            plain_stats, _, plain_rtt = run(run_engine("postgresql", plain.url, args, stack))
            citus_stats, filled, citus_rtt = run(
                run_engine("citus", cluster.coordinator_url, args, stack)
            )
            groups = shard_groups(cluster.coordinator_url, *filled[0])
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
            ["a turn (both)", f"{total_p:.2f}", f"{total_c:.2f}", f"{total_c / total_p:.2f}x", "-"]
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
        goal = total_c <= 2 * total_p and all(groups[c] == 1 for c in CALLS)
        print(f"goal (a turn within 2x, one shard group per call): {'met' if goal else 'MISSED'}")
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
