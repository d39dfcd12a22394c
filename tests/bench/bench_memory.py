"""Benchmark: memchat's per-turn memory work vs langchain-postgres.

Run on demand (pytest does not collect `bench_*.py`):

    python tests/bench/bench_memory.py [--iterations 200] [--warmup 20]

One turn's memory work, timed end to end on the client:

- memchat:   `store.load_context` (window 10) then `store.record_turn` (a
  human + ai pair): one `memchat.db.Database(url, max_connections=1)`, one
  event loop, each call one pipelined round trip running as `authenticated`
  under row-level security.
- langchain: `PostgresChatMessageHistory.get_messages()` then
  `add_messages([HumanMessage, AIMessage])` with the sync API on one psycopg
  connection, on its own table (`create_tables`) in the same database.
  get_messages reads the whole session: that is the point of the comparison.

Sessions are pre-filled (generate_series, superuser connection) with the
same LangChain-shaped messages on both sides. Sizes and sides are
interleaved; after every timed iteration the two rows just added are deleted
(outside the timed region) so sessions keep their size. See
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
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
from memchat.db import Database
from tests.bench import _common as common

AGENT = "default"
WINDOW = 10
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
    """Samples of one side at one size: total and the two halves, in ms."""

    total: list[float] = field(default_factory=list)
    read: list[float] = field(default_factory=list)
    write: list[float] = field(default_factory=list)

    def add(self, t0: int, t1: int, t2: int) -> None:
        self.total.append((t2 - t0) / 1e6)
        self.read.append((t1 - t0) / 1e6)
        self.write.append((t2 - t1) / 1e6)


@dataclass
class Session:
    size: int
    caller: store.Caller
    memchat_id: uuid.UUID
    memchat_last_id: int  # highest prefilled chat_message_history.id
    langchain_id: uuid.UUID
    langchain_last_id: int
    history: PostgresChatMessageHistory
    memchat: Side = field(default_factory=Side)
    langchain: Side = field(default_factory=Side)


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
            " values (%s, %s, %s, 'benchmark', %s, now() + interval '30 days')",
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
    db: Database, s: Session, human: dict[str, Any], ai: dict[str, Any]
) -> tuple[int, int, int]:
    t0 = perf_counter_ns()
    ctx = await store.load_context(
        db, s.caller, session_id=s.memchat_id, agent_name=AGENT, window=WINDOW
    )
    t1 = perf_counter_ns()
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
    # Cheap sanity checks, after the clock stopped.
    assert ctx.session is not None and ctx.session.message_count >= s.size
    assert len(ctx.messages) == min(WINDOW, s.size)
    return t0, t1, t2


def langchain_turn(s: Session, human: HumanMessage, ai: AIMessage) -> tuple[int, int, int]:
    t0 = perf_counter_ns()
    history = s.history.get_messages()
    t1 = perf_counter_ns()
    s.history.add_messages([human, ai])
    t2 = perf_counter_ns()
    assert len(history) >= s.size
    return t0, t1, t2


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


async def run(args: argparse.Namespace) -> int:
    load_at_start = common.load_average()
    with common.database() as target:
        admin = common.admin_connection(target.url)
        # LangChain's documented setup: a plain psycopg connection (its
        # defaults: transactions, prepared statements after 5 executions).
        lc_conn = psycopg.connect(target.url)
        PostgresChatMessageHistory.create_tables(lc_conn, LANGCHAIN_TABLE)
        db = Database(target.url, max_connections=1)
        sessions: list[Session] = []
        try:
            for size in args.sizes:
                caller = common.create_user(admin)
                mid, mlast = fill_memchat(admin, caller, size)
                lid, llast = fill_langchain(admin, size)
                history = PostgresChatMessageHistory(
                    LANGCHAIN_TABLE, str(lid), sync_connection=lc_conn
                )
                sessions.append(Session(size, caller, mid, mlast, lid, llast, history))
            common.vacuum_analyze(admin, "public.chat_message_history", LANGCHAIN_TABLE)
            common.vacuum_analyze(admin, "public.chat_sessions", "auth.users")

            text = FILLER[:60]
            mc_human, mc_ai = messages.human(f"question: {text}"), messages.ai(f"answer: {text}")
            lc_human, lc_ai = HumanMessage(f"question: {text}"), AIMessage(f"answer: {text}")

            for i in range(args.warmup + args.iterations):
                timed = i >= args.warmup
                for k, s in enumerate(sessions):
                    # Alternate which side goes first, per iteration and size.
                    sides = (
                        ("memchat", "langchain") if (i + k) % 2 == 0 else ("langchain", "memchat")
                    )
                    for side in sides:
                        if side == "memchat":
                            marks = await memchat_turn(db, s, mc_human, mc_ai)
                        else:
                            marks = langchain_turn(s, lc_human, lc_ai)
                        if timed:
                            getattr(s, side).add(*marks)
                        if not args.no_cleanup:
                            reset(admin, s, side)

            print("# memchat per-turn memory work vs langchain-postgres")
            print()
            print(common.machine_report(admin, target, load_at_start=load_at_start))
            print(
                f"iterations: {args.iterations} per size per side"
                f" (after {args.warmup} warm-up), window {WINDOW}"
            )
            print()
            rows = []
            for s in sessions:
                m, lc = common.summarize(s.memchat.total), common.summarize(s.langchain.total)
                rows.append(
                    [
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
            for s in sessions:
                breakdown.append(
                    [
                        f"{s.size:,}",
                        fmt(common.summarize(s.memchat.read).median),
                        fmt(common.summarize(s.memchat.write).median),
                        fmt(common.summarize(s.langchain.read).median),
                        fmt(common.summarize(s.langchain.write).median),
                    ]
                )
            print(
                common.format_table(
                    [
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

            first, last = sessions[0], sessions[-1]
            ratio_small = (
                common.summarize(first.memchat.total).median
                / common.summarize(first.langchain.total).median
            )
            flat = (
                common.summarize(last.memchat.total).median
                / common.summarize(first.memchat.total).median
            )
            verdict = "met" if ratio_small <= 0.5 else "MISSED"
            print(f"target ratio <= 0.50 at {first.size:,} messages: {ratio_small:.2f} ({verdict})")
            print(f"memchat flatness, median at {last.size:,} / at {first.size:,}: {flat:.2f}x")
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
        finally:
            await db.close()
            lc_conn.rollback()
            # Leave a DATABASE_URL database as found (users cascade to their rows).
            PostgresChatMessageHistory.drop_table(lc_conn, LANGCHAIN_TABLE)
            lc_conn.close()
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
        type=lambda v: [int(x) for x in v.split(",")],
        default=list(DEFAULT_SIZES),
        help="comma-separated pre-filled session sizes (10,1000,10000)",
    )
    parser.add_argument(
        "--no-cleanup",
        action="store_true",
        help="let sessions grow by 2 messages per turn instead of deleting them",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
