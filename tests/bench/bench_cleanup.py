"""Benchmark: the scheduled cleanup against live chat turns.

Fills 20,000 expired sessions x 50 messages (1,000,000 expired messages)
next to live sessions with messages of their own, interleaved in the table
the way real traffic writes them, with what real traffic stores beside
them: an embedding of every user message (recall) and a rating of one
answer in twenty (feedback), which go with their messages. Then, for each cleanup SQL variant and
batch size:

* idle: the p50/p99 of chat turns at the store level
  (`store.load_context` + `store.record_turn` on live sessions), alone,
  timed half before the cleanup and half after it (and its vacuum);
* cleanup: `Cleanup.run` deletes every expired session while another
  thread runs the same turns; expired messages deleted per second and the
  turns' p50/p99 compared with idle; the time it paused against the time
  its batches took (`pause/batch`: the pause factor it settled on). The
  adaptive pause (memchat.usecases.cleanup) sees the turns' writes, what
  its batches do to its latency probe's round trips, and its batches' speed.

Targets: >= 200,000 messages/s, turn p99 during cleanup < 2x idle.

    python tests/bench/bench_cleanup.py                    # full size, ~5 min
    python tests/bench/bench_cleanup.py --expired-sessions 2000 --runs current:1000

`--runs` lists SQL-variant:batch-size[:option...] items, each on a fresh
fill. The variant is the SQL `store.expire_sessions_batch` runs: `current`
is the store's statement as it is; the others are candidates, patched in for
that run only (see VARIANTS). Options: `fixed` pauses exactly
`--pause-factor` batch durations (the pause before it adapted; the default is
the adaptive pause), `alone` runs the cleanup with no turns next to it (its
speed on an idle database). The machine's load average is printed per run:
other work on the machine skews the turn latencies most.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from memchat import messages, store
from memchat.store.db import Database
from memchat.usecases.cleanup import Cleanup
from tests.bench import _common as common
from tests.utils.users import claims_for

# ------------------------------------------------------------ SQL variants

# Messages deleted through the (session_id, id desc) index and sessions
# through the primary key, with the locked ids as one array: no hash join
# over the whole table per batch.
INDEXED = """
with doomed as (
    select s.id from public.chat_sessions s
     where s.expires_at <= now()
     order by s.expires_at
     limit %(batch)s
     for update skip locked
), ids as (
    select coalesce(array_agg(d.id), '{}') as ids from doomed d
), gone_messages as (
    delete from public.chat_message_history h
     where h.session_id = any((select i.ids from ids i)::uuid[]) returning 1
), gone_sessions as (
    delete from public.chat_sessions s
     where s.id = any((select i.ids from ids i)::uuid[]) returning 1
)
select (select count(*) from gone_sessions), (select count(*) from gone_messages)
"""

# "current" is memchat.store's statement (sessions by primary key, messages
# by the FK cascade, counted first); "indexed" deletes messages explicitly.
VARIANTS = {"current": None, "indexed": INDEXED}


@contextmanager
def patched_sql(variant: str) -> Iterator[None]:
    original = store.cleanup._EXPIRE_BATCH
    replacement = VARIANTS[variant]
    if replacement is not None:
        store.cleanup._EXPIRE_BATCH = replacement
    try:
        yield
    finally:
        store.cleanup._EXPIRE_BATCH = original


@contextmanager
def timed_batches(into: list[float]) -> Iterator[None]:
    """Record each `expire_sessions_batch` call's wall time (ms)."""
    original = store.expire_sessions_batch

    def timed(conn: psycopg.Connection[Any], batch: int) -> tuple[int, int]:
        began = time.perf_counter()
        try:
            return original(conn, batch)
        finally:
            took = time.perf_counter() - began
            into.append(took * 1000)

    store.expire_sessions_batch = timed  # type: ignore[assignment]
    try:
        yield
    finally:
        store.expire_sessions_batch = original  # type: ignore[assignment]


# -------------------------------------------------------------------- data

CONTENT = "x" * 120  # a short chat message; the stored row is ~350 bytes


@dataclass(frozen=True)
class Shape:
    expired_sessions: int
    live_sessions: int
    messages_per_session: int
    sessions_per_user: int


def reset(admin: psycopg.Connection[Any]) -> None:
    admin.execute(
        "truncate public.chat_message_history, public.user_agent_active_sessions,"
        " public.agent_long_term_memory, public.chat_sessions, auth.users cascade"
    )


def fill(admin: psycopg.Connection[Any], shape: Shape) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Expired and live sessions with interleaved messages; returns live (session, user)."""
    total = shape.expired_sessions + shape.live_sessions
    users = -(-total // shape.sessions_per_user)
    human = messages.human(CONTENT)
    ai = messages.ai(CONTENT)
    with admin.transaction():
        admin.execute(
            "create temp table bench_users on commit drop as"
            " select g as n, gen_random_uuid() as id from generate_series(1, %s) g",
            (users,),
        )
        admin.execute(
            "insert into auth.users (id, aud, role, email)"
            " select id, 'authenticated', 'authenticated', id || '@bench.test' from bench_users"
        )
        # Session k: expired for k <= E (oldest first), live after.
        admin.execute(
            "create temp table bench_sessions on commit drop as"
            " select k, gen_random_uuid() as id, u.id as user_id, k > %(e)s as live"
            " from generate_series(1, %(total)s) k"
            " join bench_users u on u.n = 1 + (k - 1) / %(per_user)s",
            {"e": shape.expired_sessions, "total": total, "per_user": shape.sessions_per_user},
        )
        admin.execute(
            "insert into public.chat_sessions (id, user_id, agent_name, title, message_count,"
            " created_at, last_active_at, expires_at)"
            " select id, user_id, 'agent' || (k %% 3), 'bench', %(m)s,"
            "  now() - interval '30 days',"
            "  case when live then now() else now() - interval '8 days' end,"
            "  case when live then now() + interval '7 days'"
            "       else now() - interval '1 day' + k * interval '1 second' end"
            " from bench_sessions",
            {"m": shape.messages_per_session},
        )
        # Messages arrive interleaved across sessions, as real traffic writes them.
        admin.execute(
            "insert into public.chat_message_history (session_id, user_id, message, created_at)"
            " select s.id, s.user_id, case when m %% 2 = 1 then %(human)s else %(ai)s end,"
            "  now() - interval '8 days'"
            " from generate_series(1, %(m)s) m cross join bench_sessions s order by m, s.k",
            {"m": shape.messages_per_session, "human": Jsonb(human), "ai": Jsonb(ai)},
        )
        # What real traffic stores beside its messages: an embedding of every
        # user message (recall) and a rating of one answer in twenty.
        admin.execute(
            "insert into memchat.message_embeddings"
            " (message_id, user_id, session_id, agent_name, created_at, embedding)"
            " select h.id, h.user_id, h.session_id, c.agent_name, h.created_at,"
            "  array_fill(0.25::real, array[memchat.embedding_dimensions()])::extensions.vector"
            " from public.chat_message_history h join public.chat_sessions c on c.id = h.session_id"
            " where h.message->>'type' = 'human'"
        )
        admin.execute(
            "insert into memchat.message_feedback"
            " (message_id, user_id, session_id, agent_name, rating)"
            " select h.id, h.user_id, h.session_id, c.agent_name, 1"
            " from public.chat_message_history h join public.chat_sessions c on c.id = h.session_id"
            " where h.message->>'type' = 'ai' and h.id % 20 = 0"
        )
        # One active pointer and notes per user and agent of their first session.
        admin.execute(
            "insert into public.user_agent_active_sessions (user_id, agent_name,"
            " active_session_id)"
            " select distinct on (s.user_id, c.agent_name) s.user_id, c.agent_name, s.id"
            " from bench_sessions s join public.chat_sessions c on c.id = s.id"
            " order by s.user_id, c.agent_name, s.k desc"
        )
        admin.execute(
            "insert into public.agent_long_term_memory (user_id, agent_name, notes)"
            " select distinct on (s.user_id) s.user_id, 'agent0', '# Name\nBench'"
            " from bench_sessions s order by s.user_id"
        )
        live = admin.execute(
            "select id, user_id from bench_sessions where live order by k"
        ).fetchall()
    return [(row[0], row[1]) for row in live]


def settle(admin: psycopg.Connection[Any]) -> None:
    common.vacuum_analyze(
        admin,
        "public.chat_message_history",
        "public.chat_sessions",
        "memchat.message_embeddings",
        "memchat.message_feedback",
        "public.user_agent_active_sessions",
        "public.agent_long_term_memory",
        "auth.users",
    )
    admin.execute("checkpoint")


SETTINGS = ("shared_buffers", "synchronous_commit", "wal_compression", "max_wal_size")


def server_settings(admin: psycopg.Connection[Any]) -> str:
    values = [admin.execute("select current_setting(%s)", (n,)).fetchone() for n in SETTINGS]
    return ", ".join(f"{n}={v[0] if v else '?'}" for n, v in zip(SETTINGS, values, strict=True))


def wal_lsn(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("select pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def expired_counts(admin: psycopg.Connection[Any]) -> tuple[int, int]:
    return store.count_expired(admin)


# ------------------------------------------------------------------- turns


async def one_turn(db: Database, session_id: uuid.UUID, user_id: uuid.UUID) -> float:
    caller = store.Caller(user_id=user_id, claims=claims_for(user_id))
    began = time.perf_counter()
    ctx = await store.load_context(
        db, caller, session_id=session_id, agent_name="agent0", window=10
    )
    assert ctx.session is not None and ctx.session.expires_at > datetime.now(UTC), (
        "a live session must stay live"
    )
    await store.record_turn(
        db,
        caller,
        store.Turn(
            session_id=session_id,
            agent_name=ctx.session.agent_name,
            messages=[messages.human("hello again"), messages.ai(CONTENT)],
            title=None,
            ttl=timedelta(hours=168),
        ),
    )
    return (time.perf_counter() - began) * 1000


async def run_turns(
    url: str,
    live: list[tuple[uuid.UUID, uuid.UUID]],
    *,
    count: int | None,
    stop: Callable[[], bool] = lambda: False,
    started: threading.Event | None = None,
) -> list[float]:
    """Turns one after another (one client) until `count` or `stop()`."""
    rng = random.Random(5)
    db = Database(url, max_connections=1)
    samples: list[float] = []
    try:
        for _ in range(50):  # warm the connection and caches
            await one_turn(db, *rng.choice(live))
        if started is not None:
            started.set()
        while not stop() and (count is None or len(samples) < count):
            samples.append(await one_turn(db, *rng.choice(live)))
    finally:
        await db.close()
    return samples


# -------------------------------------------------------------------- runs


PACES = ("adaptive", "fixed")


@dataclass(frozen=True)
class Run:
    variant: str
    batch: int
    pace: str = "adaptive"  # or "fixed"
    alone: bool = False  # no turns next to the cleanup

    @classmethod
    def parse(cls, text: str) -> Run:
        variant, batch, *options = text.split(":")
        unknown = set(options) - {*PACES, "alone"}
        if unknown or not batch.isdigit():
            raise ValueError(f"bad run {text!r}: variant:batch[:fixed][:alone]")
        return cls(
            variant, int(batch), "fixed" if "fixed" in options else "adaptive", "alone" in options
        )


@dataclass
class Row:
    variant: str
    batch: int
    sessions: int
    messages: int
    batches: int
    seconds: float
    batch_p50: float
    batch_max: float
    wal_mb: float
    vacuum_s: float
    load: float
    idle: list[float]
    during: list[float]
    pace: str
    paused_s: float
    batches_s: float

    def cells(self) -> list[str]:
        idle_p99 = common.percentile(self.idle, 99)
        during_p99 = common.percentile(self.during, 99)
        return [
            self.variant,
            str(self.batch),
            self.pace,
            f"{self.paused_s / self.batches_s:.2f}" if self.batches_s else "-",
            f"{self.messages:,}",
            str(self.batches),
            f"{self.seconds:.2f}",
            f"{self.messages / self.seconds:,.0f}",
            f"{self.batch_p50:.0f} / {self.batch_max:.0f}",
            f"{statistics.median(self.idle):.2f} / {idle_p99:.2f}",
            f"{statistics.median(self.during):.2f} / {during_p99:.2f}" if self.during else "-",
            f"{during_p99 / idle_p99:.2f}x" if self.during else "-",
            str(len(self.during)),
            f"{self.wal_mb:,.0f}",
            f"{self.vacuum_s:.1f}",
            f"{self.load:.1f}",
        ]


HEADERS = [
    "sql",
    "batch",
    "pause",
    "pause/batch",
    "expired msgs",
    "batches",
    "cleanup s",
    "msgs/s",
    "batch p50/max ms",
    "idle turn p50/p99 ms",
    "turn p50/p99 during",
    "p99 ratio",
    "turns during",
    "WAL MB",
    "vacuum s",
    "load 1m",
]


def one_run(
    url: str,
    admin: psycopg.Connection[Any],
    shape: Shape,
    run: Run,
    turns: int,
    pause_factor: float = 1.0,
) -> Row:
    reset(admin)
    began = time.perf_counter()
    live = fill(admin, shape)
    settle(admin)
    print(f"  filled and settled in {time.perf_counter() - began:.1f} s", flush=True)
    expected_sessions, expected_messages = expired_counts(admin)
    time.sleep(2)  # let the checkpoint's writes drain before timing anything
    # Idle turns are timed just before and just after the cleanup (pooled), so
    # that other load on the machine weighs on both sides of the comparison.
    idle = asyncio.run(run_turns(url, live, count=turns // 2))

    done = threading.Event()
    started = threading.Event()
    during: list[float] = []

    def background() -> None:
        during.extend(
            asyncio.run(run_turns(url, live, count=None, stop=done.is_set, started=started))
        )

    thread = threading.Thread(target=background, name="turns")
    if run.alone:
        started.set()
    else:
        thread.start()
    started.wait()
    batch_ms: list[float] = []
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        time.sleep(seconds)

    load = os.getloadavg()[0]
    wal_before = wal_lsn(admin)
    try:
        with patched_sql(run.variant), timed_batches(batch_ms):
            result = Cleanup(
                url,
                batch_size=run.batch,
                pause_factor=pause_factor,
                adaptive=run.pace == "adaptive",
                sleep=sleep,
            ).run()
    finally:
        done.set()
        if thread.is_alive():
            thread.join()
    wal_mb = (wal_lsn(admin) - wal_before) / 2**20
    assert result.finished, result
    assert result.deleted_sessions == expected_sessions, (result, expected_sessions)
    assert result.deleted_messages == expected_messages, (result, expected_messages)
    left = admin.execute(
        "select count(*) from public.chat_sessions where expires_at > now()"
    ).fetchone()
    assert left is not None and left[0] == shape.live_sessions, left
    # The deferred cost of row deletes: vacuum reclaims the dead rows and index entries.
    with common.Timer() as vacuum:
        admin.execute("vacuum public.chat_message_history")
    idle += asyncio.run(run_turns(url, live, count=turns - turns // 2))
    pace = "none" if pause_factor == 0 else f"{run.pace} {pause_factor:g}"
    return Row(
        variant=run.variant,
        batch=run.batch,
        sessions=result.deleted_sessions,
        messages=result.deleted_messages,
        batches=result.batches,
        seconds=result.duration_ms / 1000,
        batch_p50=statistics.median(batch_ms),
        batch_max=max(batch_ms),
        wal_mb=wal_mb,
        vacuum_s=vacuum.ms / 1000,
        load=load,
        idle=idle,
        during=during,
        pace=pace + (", no turns" if run.alone else ""),
        paused_s=sum(pauses),
        batches_s=sum(batch_ms) / 1000,
    )


def cpu_control(url: str, admin: psycopg.Connection[Any], turns: int, seconds: float) -> list[str]:
    """The same turns next to one backend that only burns CPU (no I/O, no locks).

    Tells apart what the cleanup costs turns through locks and I/O from what
    any busy backend costs them on this machine.
    """
    live = [
        (r[0], r[1])
        for r in admin.execute(
            "select id, user_id from public.chat_sessions where expires_at > now() limit 2000"
        ).fetchall()
    ]
    idle = asyncio.run(run_turns(url, live, count=turns))
    done = threading.Event()
    started = threading.Event()
    during: list[float] = []

    def background() -> None:
        during.extend(
            asyncio.run(run_turns(url, live, count=None, stop=done.is_set, started=started))
        )

    thread = threading.Thread(target=background, name="turns")
    thread.start()
    started.wait()
    try:
        with psycopg.connect(url, autocommit=True) as burner:
            burner.execute(sql.SQL("set statement_timeout = {}").format(int(seconds * 1000)))
            with suppress(psycopg.errors.QueryCanceled):
                burner.execute("select count(*) from generate_series(1, 10000000000)")
    finally:
        done.set()
        thread.join()
    idle_p99 = common.percentile(idle, 99)
    during_p99 = common.percentile(during, 99)
    return [
        f"one backend burning CPU for {seconds:.0f} s",
        f"{statistics.median(idle):.2f} / {idle_p99:.2f}",
        f"{statistics.median(during):.2f} / {during_p99:.2f}",
        f"{during_p99 / idle_p99:.2f}x",
        str(len(during)),
        f"{os.getloadavg()[0]:.1f}",
    ]


CONTROL_HEADERS = [
    "control",
    "idle turn p50/p99 ms",
    "turn p50/p99 during",
    "p99 ratio",
    "turns during",
    "load 1m",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expired-sessions", type=int, default=20_000)
    parser.add_argument("--live-sessions", type=int, default=2_000)
    parser.add_argument("--messages-per-session", type=int, default=50)
    parser.add_argument("--sessions-per-user", type=int, default=10)
    parser.add_argument(
        "--runs",
        default="current:1000:fixed,current:1000,current:1000:alone",
        help="comma-separated SQL-variant:batch-size[:fixed][:alone] items,"
        " one fill and cleanup each",
    )
    parser.add_argument("--turns", type=int, default=400, help="idle turns per run")
    parser.add_argument(
        "--pause-factor",
        type=float,
        default=1.0,
        help="the cleanup's pause factor: where the adaptive pause starts, or the fixed"
        " pause in batch durations with `:fixed` (1: the default; 0: no pause)",
    )
    parser.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="ALTER SYSTEM on the benchmark server, restarted (embedded server only)",
    )
    parser.add_argument(
        "--no-control", action="store_true", help="skip the CPU-only control measurement"
    )
    args = parser.parse_args()
    shape = Shape(
        args.expired_sessions,
        args.live_sessions,
        args.messages_per_session,
        args.sessions_per_user,
    )
    try:
        runs = [Run.parse(r) for r in args.runs.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    unknown = {r.variant for r in runs} - VARIANTS.keys()
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {sorted(VARIANTS)}")
    rows: list[Row] = []
    load_at_start = common.load_average()
    settings = dict(setting.partition("=")[::2] for setting in args.server_setting)
    with common.database(settings=settings) as target:
        admin = common.admin_connection(target.url)
        for run in runs:
            print(
                f"run: sql={run.variant} batch={run.batch} pace={run.pace}"
                f"{' alone' if run.alone else ''}",
                flush=True,
            )
            rows.append(one_run(target.url, admin, shape, run, args.turns, args.pause_factor))
            print(common.format_table(HEADERS, [rows[-1].cells()]), flush=True)
        control = None
        if not args.no_control:
            print("control: one CPU-bound backend instead of the cleanup", flush=True)
            control = cpu_control(target.url, admin, args.turns, 3.0)
        print()
        print(common.machine_report(admin, target, load_at_start=load_at_start))
        print(f"settings:   {server_settings(admin)}")
        print(
            f"data:       {shape.expired_sessions:,} expired sessions x"
            f" {shape.messages_per_session} messages"
            f" + {shape.live_sessions:,} live sessions x {shape.messages_per_session},"
            f" {shape.sessions_per_user} sessions per user, messages interleaved"
        )
        print("turn:       store.load_context + store.record_turn (2 messages), one client")
        print()
        print(common.format_table(HEADERS, [r.cells() for r in rows]))
        if control:
            print()
            print(common.format_table(CONTROL_HEADERS, [control]))
        admin.close()


if __name__ == "__main__":
    main()
