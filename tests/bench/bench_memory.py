"""Benchmark: memchat's per-turn memory work vs langchain-postgres.

Run on demand (pytest does not collect `bench_*.py`):

    python tests/bench/bench_memory.py [--iterations 200] [--warmup 20]
        [--sizes 10,1000,10000] [--latency-ms 0,1,2] [--throttle] [--recall]

One turn's memory work, timed end to end on the client:

- memchat:   `store.load_context` (window 10) then `store.record_turn` (a
  human + ai pair): one `memchat.store.db.Database(url, max_connections=1)`, one
  event loop, each call one pipelined round trip running as `memchat_user`
  under row-level security. With `--throttle`, load_context also takes a
  token from the user's bucket (a write; the API does this on every turn),
  with a bucket that never runs dry.
- langchain: `PostgresChatMessageHistory.get_messages()` then
  `add_messages([HumanMessage, AIMessage])` with the sync API on one psycopg
  connection, on its own table (`create_tables`) in the same database.
  get_messages reads the whole session: that is the point of the comparison.

Sessions are pre-filled (generate_series, superuser connection) with the
same LangChain-shaped messages on both sides. Sizes and sides are
interleaved; after every timed iteration the two rows just added are deleted
(outside the timed region) so sessions keep their size.

Both sides connect straight to the database ("direct"; pgserver's Unix
socket, where a round trip is nearly free) and, with `--latency-ms`, also
through one `common.LatencyProxy` per value, a TCP proxy on 127.0.0.1
adding that much time to every round trip (half each way), like the
Lambda -> pooler -> Postgres hops memchat runs over. Routes are interleaved
with sizes and sides; the proxy counts the round trips of every turn. See
docs/benchmarks.md.

With `--recall`, the two sides are memchat's turn with recall off (the
above) and on: `load_context`, then `store.recall` (k=3, window 10, min
score 0.3) with the turn's embedding, then `record_turn` storing that
embedding with the user message (three round trips). Every human message of
the pre-filled sessions has an embedding (clustered vectors from
`bench_recall.Vectors`, numpy), and each turn's query is a new message on the
user's topics, so recall finds real hits. LangChain is not run in this mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from time import perf_counter_ns
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg
from langchain_core.messages import AIMessage, HumanMessage
from langchain_postgres import PostgresChatMessageHistory
from psycopg import sql

from memchat import messages, store
from memchat.config import DUPLICATE_SCORE
from memchat.store.db import Database
from memchat.throttle import OFF, Rate
from tests.bench import _common as common
from tests.bench import bench_recall

AGENT = "default"
WINDOW = 10
# A bucket that never runs dry: the benchmark measures the write, not refusals.
THROTTLE = Rate(per_minute=1e9, burst=1_000_000)
TTL = timedelta(days=7)
LANGCHAIN_TABLE = "bench_langchain_message_history"
DEFAULT_SIZES = (10, 1_000, 10_000)
# ~150 characters per message, the same on both sides.
FILLER = "lorem ipsum dolor sit amet " * 5

# One stored message in LangChain's message_to_dict shape, built by the
# database from memchat's own templates: odd positions human, even ai.
_MESSAGE_EXPR = """jsonb_set(
    case when mod(i, 2) = 1 then %(human)s::jsonb else %(ai)s::jsonb end,
    array['data', 'content'], to_jsonb(format('message %%s: %%s', i, %(filler)s::text)))"""


@dataclass
class Side:
    """Samples of one side at one size on one route: total and the two halves, in ms."""

    total: list[float] = field(default_factory=list)
    read: list[float] = field(default_factory=list)
    write: list[float] = field(default_factory=list)
    # Round trips of each timed turn (read half, write half), through a proxy.
    trips: list[tuple[int, int]] = field(default_factory=list)

    def add(self, marks: Marks, counted: bool) -> None:
        (t0, t1, t2), (c0, c1, c2) = marks
        self.total.append((t2 - t0) / 1e6)
        self.read.append((t1 - t0) / 1e6)
        self.write.append((t2 - t1) / 1e6)
        if counted:
            self.trips.append((c1 - c0, c2 - c1))


# (t0, t1, t2) perf_counter_ns and (c0, c1, c2) round-trip counter readings
# at the start, between the two calls and at the end of a turn.
Marks = tuple[tuple[int, int, int], tuple[int, int, int]]


@dataclass
class Session:
    """A pre-filled session on each side (shared by all routes)."""

    size: int
    caller: store.Caller
    memchat_id: uuid.UUID
    memchat_last_id: int  # highest prefilled chat_message_history.id
    langchain_id: uuid.UUID
    langchain_last_id: int


@dataclass
class Route:
    """How both sides reach the database: directly, or through a LatencyProxy."""

    label: str
    proxy: common.LatencyProxy | None
    db: Database
    lc_conn: psycopg.Connection[Any]
    histories: list[PostgresChatMessageHistory]  # one per session
    memchat: list[Side]  # one per session
    langchain: list[Side]
    rtt: list[common.Stats] = field(default_factory=list)  # select 1, before and after
    recall: list[RecallSide] = field(default_factory=list)  # --recall: one per session

    def count(self) -> int:
        return self.proxy.round_trips if self.proxy else 0


def templates() -> dict[str, str]:
    return {
        "human": json.dumps(messages.human("")),
        "ai": json.dumps(messages.ai("")),
        "filler": FILLER,
    }


def fill_memchat(
    admin: psycopg.Connection[Any], caller: store.Caller, size: int
) -> tuple[uuid.UUID, int]:
    """A session of `size` messages owned by `caller`, consistent with its count."""
    sid = uuid.uuid4()
    with admin.transaction():
        admin.execute(
            "insert into public.chat_sessions"
            " (id, user_id, agent_name, title, message_count, expires_at)"
            " values (%s, %s, %s, 'benchmark', %s, now() + interval '1 day')",
            (sid, caller.user_id, AGENT, size),
        )
        admin.execute(
            "insert into public.user_agent_active_sessions (user_id, agent_name, active_session_id)"
            " values (%s, %s, %s)",
            (caller.user_id, AGENT, sid),
        )
        admin.execute(
            "insert into public.chat_message_history (session_id, user_id, message)"
            f" select %(sid)s, %(uid)s, {_MESSAGE_EXPR}"
            " from generate_series(1, %(n)s) as i order by i",
            {"sid": sid, "uid": caller.user_id, "n": size, **templates()},
        )
        row = admin.execute(
            "select max(id), count(*) from public.chat_message_history where session_id = %s",
            (sid,),
        ).fetchone()
    assert row is not None and row[1] == size
    return sid, int(row[0])


def fill_langchain(admin: psycopg.Connection[Any], size: int) -> tuple[uuid.UUID, int]:
    sid = uuid.uuid4()
    table = sql.Identifier(LANGCHAIN_TABLE)
    with admin.transaction():
        admin.execute(
            sql.SQL(
                "insert into {} (session_id, message)"
                f" select %(sid)s, {_MESSAGE_EXPR}"
                " from generate_series(1, %(n)s) as i order by i"
            ).format(table),
            {"sid": sid, "n": size, **templates()},
        )
        row = admin.execute(
            sql.SQL("select max(id), count(*) from {} where session_id = %s").format(table),
            (sid,),
        ).fetchone()
    assert row is not None and row[1] == size
    return sid, int(row[0])


def reset(admin: psycopg.Connection[Any], s: Session, side: str) -> None:
    """Delete the rows the timed iteration added (not timed)."""
    if side == "memchat":
        with admin.pipeline(), admin.transaction():
            admin.execute(
                "delete from public.chat_message_history where session_id = %s and id > %s",
                (s.memchat_id, s.memchat_last_id),
            )
            admin.execute(
                "update public.chat_sessions set message_count = %s where id = %s",
                (s.size, s.memchat_id),
            )
    else:
        admin.execute(
            sql.SQL("delete from {} where session_id = %s and id > %s").format(
                sql.Identifier(LANGCHAIN_TABLE)
            ),
            (s.langchain_id, s.langchain_last_id),
        )


async def memchat_turn(
    db: Database,
    s: Session,
    human: dict[str, Any],
    ai: dict[str, Any],
    count: Callable[[], int],
    throttle: Rate = OFF,
) -> Marks:
    c0 = count()
    t0 = perf_counter_ns()
    ctx = await store.load_context(
        db, s.caller, session_id=s.memchat_id, agent_name=AGENT, window=WINDOW, throttle=throttle
    )
    t1 = perf_counter_ns()
    c1 = count()
    await store.record_turn(
        db,
        s.caller,
        store.Turn(
            session_id=s.memchat_id,
            agent_name=AGENT,
            messages=[human, ai],
            title=None if ctx.session else "benchmark",
            ttl=TTL,
        ),
    )
    t2 = perf_counter_ns()
    c2 = count()
    # Cheap sanity checks, after the clock stopped.
    assert ctx.session is not None and ctx.session.message_count >= s.size
    assert len(ctx.messages) == min(WINDOW, s.size)
    return (t0, t1, t2), (c0, c1, c2)


@dataclass
class RecallSide:
    """Samples of memchat's turn with recall on: the total and its three calls, in ms."""

    total: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    recall: list[float] = field(default_factory=list)
    record: list[float] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)
    # Round trips of each timed turn (load, recall, record), through a proxy.
    trips: list[tuple[int, int, int]] = field(default_factory=list)


RECALL_K = 3
RECALL_MIN_SCORE = 0.3  # MEMORY_RECALL_MIN_SCORE's default


async def memchat_recall_turn(
    db: Database,
    s: Session,
    human: dict[str, Any],
    ai: dict[str, Any],
    query: list[float],
    count: Callable[[], int],
    samples: RecallSide | None,
    throttle: Rate = OFF,
) -> None:
    """load_context, recall with the turn's embedding, record_turn storing it."""
    c0 = count()
    t0 = perf_counter_ns()
    ctx = await store.load_context(
        db, s.caller, session_id=s.memchat_id, agent_name=AGENT, window=WINDOW, throttle=throttle
    )
    t1 = perf_counter_ns()
    c1 = count()
    # The embeddings stored by bench_recall.copy_embeddings are of its model.
    embedding = store.Embedding(bench_recall.MODEL, query)
    hits = await store.recall(
        db,
        s.caller,
        store.RecallQuery(
            session_id=s.memchat_id,
            agent_name=AGENT,
            window=WINDOW,
            embedding=embedding,
            k=RECALL_K,
            min_score=RECALL_MIN_SCORE,
            duplicate_score=DUPLICATE_SCORE,
        ),
    )
    t2 = perf_counter_ns()
    c2 = count()
    await store.record_turn(
        db,
        s.caller,
        store.Turn(
            session_id=s.memchat_id,
            agent_name=AGENT,
            messages=[human, ai],
            title=None if ctx.session else "benchmark",
            ttl=TTL,
            embedding=embedding,
        ),
    )
    t3 = perf_counter_ns()
    c3 = count()
    assert ctx.session is not None and len(ctx.messages) == min(WINDOW, s.size)
    if samples is not None:
        samples.total.append((t3 - t0) / 1e6)
        samples.load.append((t1 - t0) / 1e6)
        samples.recall.append((t2 - t1) / 1e6)
        samples.record.append((t3 - t2) / 1e6)
        samples.hits.append(len(hits))
        samples.trips.append((c1 - c0, c2 - c1, c3 - c2))


def embed_sessions(admin: psycopg.Connection[Any], sessions: list[Session], seed: int) -> Any:
    """An embedding for every human message of the memchat sessions (binary
    COPY); returns each session's queries (new messages on its user's topics)."""
    import numpy as np

    vectors = bench_recall.Vectors(seed)
    queries = []
    for s in sessions:
        rows = admin.execute(
            "select id, created_at from public.chat_message_history"
            " where session_id = %s and message->>'type' = 'human' order by id",
            (s.memchat_id,),
        ).fetchall()
        topics = vectors.user_topics()
        n = len(rows)
        bench_recall.copy_embeddings(
            admin,
            np.array([r[0] for r in rows], dtype=np.int64),
            [s.caller.user_id] * n,
            [s.memchat_id] * n,
            [r[1] for r in rows],
            vectors.messages(topics, n),
        )
        queries.append([[float(x) for x in q] for q in vectors.around(topics, 50)])
    common.vacuum_analyze(admin, "memchat.message_embeddings")
    return queries


def langchain_turn(
    history: PostgresChatMessageHistory,
    s: Session,
    human: HumanMessage,
    ai: AIMessage,
    count: Callable[[], int],
) -> Marks:
    c0 = count()
    t0 = perf_counter_ns()
    messages_read = history.get_messages()
    t1 = perf_counter_ns()
    c1 = count()
    history.add_messages([human, ai])
    t2 = perf_counter_ns()
    c2 = count()
    assert len(messages_read) >= s.size
    return (t0, t1, t2), (c0, c1, c2)


def final_sizes(admin: psycopg.Connection[Any], s: Session) -> tuple[int, int, int]:
    """(memchat rows, memchat message_count, langchain rows) of a session."""
    row = admin.execute(
        sql.SQL(
            "select (select count(*) from public.chat_message_history where session_id = %(m)s),"
            " (select message_count from public.chat_sessions where id = %(m)s),"
            " (select count(*) from {} where session_id = %(l)s)"
        ).format(sql.Identifier(LANGCHAIN_TABLE)),
        {"m": s.memchat_id, "l": s.langchain_id},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def fmt(value: float) -> str:
    return f"{value:.3f}"


def trips_cell(turns: list[tuple[int, int]]) -> str:
    """`2 (1+1)`: median round trips per turn (read half + write half)."""
    if not turns:
        return "-"
    read = statistics.median_low([r for r, _ in turns])
    write = statistics.median_low([w for _, w in turns])
    totals = [r + w for r, w in turns]
    low, high = min(totals), max(totals)
    spread = "" if low == high else f", {low}-{high} over {len(turns)} turns"
    return f"{read + write} ({read}+{write}{spread})"


def open_route(
    label: str,
    url: str,
    proxy: common.LatencyProxy | None,
    sessions: list[Session],
) -> Route:
    # LangChain's documented setup: a plain psycopg connection (its
    # defaults: transactions, prepared statements after 5 executions).
    lc_conn = psycopg.connect(url)
    histories = [
        PostgresChatMessageHistory(LANGCHAIN_TABLE, str(s.langchain_id), sync_connection=lc_conn)
        for s in sessions
    ]
    return Route(
        label=label,
        proxy=proxy,
        db=Database(url, max_connections=1),
        lc_conn=lc_conn,
        histories=histories,
        memchat=[Side() for _ in sessions],
        langchain=[Side() for _ in sessions],
    )


def round_trip_time(route: Route, url: str) -> None:
    route.rtt.append(common.round_trip_ms(url, 200))


def report(
    admin: psycopg.Connection[Any],
    target: common.Target,
    args: argparse.Namespace,
    routes: list[Route],
    sessions: list[Session],
    load_at_start: str,
) -> None:
    print("# memchat per-turn memory work vs langchain-postgres")
    print()
    print(common.machine_report(admin, target, load_at_start=load_at_start))
    print(
        f"iterations: {args.iterations} per size per side per route"
        f" (after {args.warmup} warm-up), window {WINDOW}"
    )
    print()
    if len(routes) > 1 or routes[0].proxy:
        print("Routes (select 1 round trip, median ms, measured before / after the run):")
        print()
        print(
            common.format_table(
                ["route", "select 1 ms", "path"],
                [
                    [
                        r.label,
                        " / ".join(fmt(st.median) for st in r.rtt),
                        r.proxy.description if r.proxy else target.description,
                    ]
                    for r in routes
                ],
            )
        )
        print()
    rows = []
    for r in routes:
        for k, s in enumerate(sessions):
            m, lc = common.summarize(r.memchat[k].total), common.summarize(r.langchain[k].total)
            rows.append(
                [
                    r.label,
                    f"{s.size:,}",
                    fmt(m.median),
                    fmt(m.p95),
                    fmt(lc.median),
                    fmt(lc.p95),
                    f"{m.median / lc.median:.2f}",
                ]
            )
    print(
        common.format_table(
            [
                "route",
                "size",
                "memchat median ms",
                "memchat p95 ms",
                "langchain median ms",
                "langchain p95 ms",
                "ratio (memchat/langchain median)",
            ],
            rows,
        )
    )
    print()
    print("Breakdown (median ms):")
    print()
    breakdown = []
    for r in routes:
        for k, s in enumerate(sessions):
            breakdown.append(
                [
                    r.label,
                    f"{s.size:,}",
                    fmt(common.summarize(r.memchat[k].read).median),
                    fmt(common.summarize(r.memchat[k].write).median),
                    fmt(common.summarize(r.langchain[k].read).median),
                    fmt(common.summarize(r.langchain[k].write).median),
                ]
            )
    print(
        common.format_table(
            [
                "route",
                "size",
                "load_context",
                "record_turn",
                "get_messages",
                "add_messages",
            ],
            breakdown,
        )
    )
    print()
    proxied = [r for r in routes if r.proxy]
    if proxied:
        print("Round trips per turn, counted by the proxy (median, read half + write half):")
        print()
        print(
            common.format_table(
                ["route", "size", "memchat", "langchain"],
                [
                    [
                        r.label,
                        f"{s.size:,}",
                        trips_cell(r.memchat[k].trips),
                        trips_cell(r.langchain[k].trips),
                    ]
                    for r in proxied
                    for k, s in enumerate(sessions)
                ],
            )
        )
        print()

    first, last = 0, len(sessions) - 1
    for r in routes:
        m_first = common.summarize(r.memchat[first].total).median
        ratio_small = m_first / common.summarize(r.langchain[first].total).median
        flat = common.summarize(r.memchat[last].total).median / m_first
        verdict = "met" if ratio_small <= 0.5 else "MISSED"
        line = (
            f"{r.label}: target ratio <= 0.50 at {sessions[first].size:,} messages:"
            f" {ratio_small:.2f} ({verdict})"
        )
        if last != first:
            line += (
                f"; memchat flatness, median at {sessions[last].size:,}"
                f" / at {sessions[first].size:,}: {flat:.2f}x"
            )
        print(line)
    grown = []
    for s in sessions:
        rows_m, count_m, rows_l = final_sizes(admin, s)
        if (rows_m, count_m, rows_l) != (s.size, s.size, s.size):
            grown.append(
                f"{s.size:,}: memchat {rows_m:,} rows (message_count {count_m:,}),"
                f" langchain {rows_l:,} rows"
            )
    if grown:
        print("sessions grew during the run: " + "; ".join(grown))
    else:
        print("session sizes unchanged after the run (added rows deleted untimed)")


def recall_trips_cell(turns: list[tuple[int, int, int]]) -> str:
    """`3 (1+1+1)`: median round trips per turn (load + recall + record)."""
    if not turns:
        return "-"
    parts = [statistics.median_low([t[n] for t in turns]) for n in range(3)]
    totals = [sum(t) for t in turns]
    low, high = min(totals), max(totals)
    spread = "" if low == high else f", {low}-{high} over {len(turns)} turns"
    return f"{sum(parts)} ({'+'.join(str(p) for p in parts)}{spread})"


def report_recall(
    admin: psycopg.Connection[Any],
    target: common.Target,
    args: argparse.Namespace,
    routes: list[Route],
    sessions: list[Session],
    load_at_start: str,
) -> None:
    print("# memchat per-turn memory work, recall off vs on")
    print()
    print(common.machine_report(admin, target, load_at_start=load_at_start))
    print(
        f"iterations: {args.iterations} per size per side per route"
        f" (after {args.warmup} warm-up), window {WINDOW}; recall k={RECALL_K},"
        f" min score {RECALL_MIN_SCORE}; throttle {'on' if args.throttle else 'off'}"
    )
    print()
    print("Routes (select 1 round trip, median ms, measured before / after the run):")
    print()
    print(
        common.format_table(
            ["route", "select 1 ms", "path"],
            [
                [
                    r.label,
                    " / ".join(fmt(st.median) for st in r.rtt),
                    r.proxy.description if r.proxy else target.description,
                ]
                for r in routes
            ],
        )
    )
    print()
    rows, breakdown, trips = [], [], []
    for r in routes:
        for k, s in enumerate(sessions):
            off, on = r.memchat[k], r.recall[k]
            off_total, on_total = common.summarize(off.total), common.summarize(on.total)
            embedded = (s.size + 1) // 2
            rows.append(
                [
                    r.label,
                    f"{s.size:,} ({embedded:,})",
                    fmt(off_total.median),
                    fmt(off_total.p95),
                    fmt(on_total.median),
                    fmt(on_total.p95),
                    fmt(on_total.median - off_total.median),
                    f"{statistics.fmean(on.hits):.2f}" if on.hits else "-",
                ]
            )
            breakdown.append(
                [
                    r.label,
                    f"{s.size:,}",
                    fmt(common.summarize(off.read).median),
                    fmt(common.summarize(off.write).median),
                    fmt(common.summarize(on.load).median),
                    fmt(common.summarize(on.recall).median),
                    fmt(common.summarize(on.record).median),
                ]
            )
            if r.proxy:
                trips.append(
                    [r.label, f"{s.size:,}", trips_cell(off.trips), recall_trips_cell(on.trips)]
                )
    print(
        common.format_table(
            [
                "route",
                "size (embedded)",
                "off median ms",
                "off p95 ms",
                "on median ms",
                "on p95 ms",
                "added median ms",
                "hits per turn",
            ],
            rows,
        )
    )
    print()
    print("Breakdown (median ms):")
    print()
    print(
        common.format_table(
            [
                "route",
                "size",
                "off: load_context",
                "off: record_turn",
                "on: load_context",
                "on: recall",
                "on: record_turn (+ embedding)",
            ],
            breakdown,
        )
    )
    print()
    if trips:
        print("Round trips per turn, counted by the proxy (median):")
        print()
        print(common.format_table(["route", "size", "recall off", "recall on"], trips))
        print()
    grown = [s for s in sessions if final_sizes(admin, s)[:2] != (s.size, s.size)]
    if grown:
        print("sessions grew during the run: " + ", ".join(f"{s.size:,}" for s in grown))
    else:
        print("session sizes unchanged after the run (added rows deleted untimed)")


async def run(args: argparse.Namespace) -> int:
    load_at_start = common.load_average()
    with common.database() as target, ExitStack() as stack:
        admin = common.admin_connection(target.url)
        PostgresChatMessageHistory.create_tables(admin, LANGCHAIN_TABLE)
        sessions: list[Session] = []
        routes: list[Route] = []
        try:
            for size in args.sizes:
                caller = common.create_user(admin)
                mid, mlast = fill_memchat(admin, caller, size)
                lid, llast = fill_langchain(admin, size)
                sessions.append(Session(size, caller, mid, mlast, lid, llast))
            common.vacuum_analyze(admin, "public.chat_message_history", LANGCHAIN_TABLE)
            common.vacuum_analyze(admin, "public.chat_sessions", "auth.users")
            queries = embed_sessions(admin, sessions, seed=1) if args.recall else []

            urls = [target.url]
            routes.append(open_route("direct", target.url, None, sessions))
            for ms in args.latency_ms:
                proxy = stack.enter_context(common.LatencyProxy(target.url, ms))
                urls.append(proxy.url)
                routes.append(open_route(f"+{ms:g} ms", proxy.url, proxy, sessions))
            for r, url in zip(routes, urls, strict=True):
                round_trip_time(r, url)
                r.recall = [RecallSide() for _ in sessions]

            text = FILLER[:60]
            mc_human, mc_ai = messages.human(f"question: {text}"), messages.ai(f"answer: {text}")
            lc_human, lc_ai = HumanMessage(f"question: {text}"), AIMessage(f"answer: {text}")

            for i in range(args.warmup + args.iterations):
                timed = i >= args.warmup
                # Routes, sizes and sides interleaved, so load from other
                # processes spreads over all of them.
                for j, r in enumerate(routes):
                    for k, s in enumerate(sessions):
                        # Alternate which side goes first.
                        other = "recall" if args.recall else "langchain"
                        sides = ("memchat", other) if (i + j + k) % 2 == 0 else (other, "memchat")
                        for side in sides:
                            if side == "recall":
                                await memchat_recall_turn(
                                    db=r.db,
                                    s=s,
                                    human=mc_human,
                                    ai=mc_ai,
                                    query=queries[k][i % len(queries[k])],
                                    count=r.count,
                                    samples=r.recall[k] if timed else None,
                                    throttle=THROTTLE if args.throttle else OFF,
                                )
                                if not args.no_cleanup:
                                    reset(admin, s, "memchat")
                                continue
                            if side == "memchat":
                                marks = await memchat_turn(
                                    db=r.db,
                                    s=s,
                                    human=mc_human,
                                    ai=mc_ai,
                                    count=r.count,
                                    throttle=THROTTLE if args.throttle else OFF,
                                )
                                samples = r.memchat[k]
                            else:
                                marks = langchain_turn(r.histories[k], s, lc_human, lc_ai, r.count)
                                samples = r.langchain[k]
                            if timed:
                                samples.add(marks, counted=r.proxy is not None)
                            if not args.no_cleanup:
                                reset(admin, s, side)

            for r, url in zip(routes, urls, strict=True):
                round_trip_time(r, url)
            if args.recall:
                report_recall(admin, target, args, routes, sessions, load_at_start)
            else:
                report(admin, target, args, routes, sessions, load_at_start)
        finally:
            for r in routes:
                await r.db.close()
                r.lc_conn.close()
            # Leave a DATABASE_URL database as found (users cascade to their rows).
            PostgresChatMessageHistory.drop_table(admin, LANGCHAIN_TABLE)
            admin.execute(
                "delete from auth.users where id = any(%s)",
                ([s.caller.user_id for s in sessions],),
            )
            admin.close()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--iterations", type=int, default=200, help="timed turns per size per side (200)"
    )
    parser.add_argument("--warmup", type=int, default=20, help="untimed turns first (20)")
    parser.add_argument(
        "--sizes",
        type=common.comma_list(int),
        default=list(DEFAULT_SIZES),
        help="comma-separated pre-filled session sizes (10,1000,10000)",
    )
    parser.add_argument(
        "--latency-ms",
        type=common.comma_list(float),
        action="extend",
        default=[],
        metavar="MS[,MS...]",
        help="also run both sides through a local TCP proxy adding MS of round-trip time"
        " (MS/2 each way), once per value; repeatable, e.g. 0,1,2",
    )
    parser.add_argument(
        "--throttle",
        action="store_true",
        help="memchat turns take a throttle token too, as the API's do (a write per load)",
    )
    parser.add_argument(
        "--recall",
        action="store_true",
        help="compare memchat's turn with recall off and on (load_context + recall +"
        " record_turn with the embedding) instead of memchat with langchain",
    )
    parser.add_argument(
        "--no-cleanup",
        action="store_true",
        help="let sessions grow by 2 messages per turn instead of deleting them",
    )
    args = parser.parse_args(argv)
    if any(ms < 0 for ms in args.latency_ms):
        parser.error("--latency-ms values must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
