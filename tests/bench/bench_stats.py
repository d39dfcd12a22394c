"""Benchmark: a user's stats (issue 13) - memchat.chat_stats and session_stats -
and the operator's analytics views (memchat_analytics, `memchat stats`).

Run on demand (pytest does not collect `bench_*.py`):

    python tests/bench/bench_stats.py [--sizes 1000,10000,100000]
        [--iterations 500] [--warmup 30] [--other-users 1000] [--feedback-every 20]
        [--analytics-iterations 20] [--no-http] [--explain]

Data (generate_series on a superuser connection): one user per size in
--sizes, each with 100 sessions (every 5th of agent "support", the rest
"default") over which that many messages are spread Zipf-like (session k
gets ~1/k of them: the largest holds about a fifth), alternately a question
and an answer; each answer carries LangChain's `usage_metadata` (input and
output tokens), and every session's counters (`message_count`, `turn_count`,
`prompt_tokens`, `completion_tokens`) are filled from its messages with the
migration's own back-fill query, so they are what record_turn would have
kept. One answer in 20 of each user has feedback (--feedback-every; 70%
+1, 20% -1, 10% 0; a third with a comment). Around them, --other-users
users with 10 sessions of 10 messages each (and their feedback); all
sessions are inserted in a shuffled order, so a user's session rows lie
among everyone else's, as they would after months of traffic. All
sessions live (not expired or cleared).

Timed, each call on one `memchat.store.db.Database(url, max_connections=1)` as
the API makes it: `db.pipeline(caller.claims)`, i.e. one transaction as
`memchat_user` with the user's claims (row-level security) and the user
check, in one round trip, then the JSON read:

- `select memchat.chat_stats(uid, null)` (all agents) and `(uid, 'default')`;
- `select memchat.session_stats(uid, id)` on the user's largest session;
- for reference, the same pipeline with `select 1` instead (the floor: the
  claims, the user check, the round trip).

With the app's GET /chat/stats route present (unless --no-http), the same
through the whole ASGI app in-process (httpx ASGITransport, as
bench_chat.py: middleware, token check, validation, response model; one
database connection, as in Lambda): `GET /chat/stats`,
`GET /chat/stats?agent_name=default` and `GET /chat/stats/{largest}`.

Users, calls and paths are interleaved: every call once per iteration, in
a new random order each time. After the timed runs each answer is checked
against the data (messages, turns, tokens, feedback counts). Then EXPLAIN
(ANALYZE, BUFFERS) of each function's statement, run as memchat_user with
the caller's claims as a generic plan (PREPARE with plan_cache_mode
force_generic_plan: a SQL function's statement is planned without its
argument's value): which relations it reads, how many rows and buffers,
to show it never reads messages.

Then the operator's analytics over all of that data (every user's): the
report `memchat stats` reads (`memchat.usecases.analytics.read`, one read-only
transaction as memchat_analyst, every view), for the last 7 days and for
all time, --analytics-iterations times each (0: skipped), its all-time
totals checked against the messages; and EXPLAIN (ANALYZE, BUFFERS) of
`select * from` each view as memchat_analyst: what it reads, and what
`turns` pays for its pseudonyms (two HMAC-SHA256 per row). The views scan
every stored answer by design (docs/analytics.md, "Cost"): no target, the
numbers are for the record.

Target: <= 20 ms median and p95 at 100,000 messages, and a cost
that does not grow with messages. The database is the embedded PostgreSQL
(pgserver, temporary directory) unless DATABASE_URL names a disposable one
(see `_common.database`). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from time import perf_counter_ns
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg

from memchat import devtokens, messages, store
from memchat.config import load_settings
from memchat.store.db import Database, connect_kwargs
from memchat.usecases import analytics
from tests.bench import _common as common
from tests.utils.store_data import become

SESSIONS = 100
AGENTS = ("default", "support")  # every 5th session is "support"
FEEDBACK_EVERY = 20  # one answer in 20 is rated (--feedback-every)
OTHER_SESSIONS = 10  # per other user
OTHER_MESSAGES = 10  # per session of another user
DEFAULT_SIZES = (1_000, 10_000, 100_000)
TARGET_MS = 20.0
FILLER = "lorem ipsum dolor sit amet " * 5  # ~150 characters a message

# The calls, as the API's store makes them.
CHAT_STATS = "select memchat.chat_stats(%s, %s)"
SESSION_STATS = "select memchat.session_stats(%s, %s)"
FLOOR = "select 1"

# Stored messages in LangChain's message_to_dict shape, built by the
# database from memchat's own templates: odd positions the user's, even the
# answers, with the usage a real answer carries (the prompt grows with the
# window, up to 20 turns).
_FILL_MESSAGES = """
insert into public.chat_message_history (session_id, user_id, message, created_at)
select s.id, s.user_id,
       case when mod(i, 2) = 1
            then jsonb_set(%(human)s::jsonb, '{data,content}',
                           to_jsonb(format('question %%s: %%s', i, %(filler)s::text)))
            else jsonb_set(
                   jsonb_set(%(ai)s::jsonb, '{data,content}',
                             to_jsonb(format('answer %%s: %%s', i, %(filler)s::text))),
                   '{data,usage_metadata}',
                   jsonb_build_object('input_tokens', u.prompt, 'output_tokens', u.completion,
                                      'total_tokens', u.prompt + u.completion))
       end,
       s.created_at + (s.last_active_at - s.created_at) * (i::float8 / s.n)
  from bench_sessions s
 cross join lateral generate_series(1, s.n) as i
 cross join lateral (select 300 + 40 * least(i / 2, 20) as prompt,
                            30 + mod(i * 37, 200) as completion) as u
 order by s.ord, i
"""

# The migration's back-fill of the counters, for these sessions.
_FILL_COUNTERS = """
update public.chat_sessions s
   set turn_count = c.turns, prompt_tokens = c.prompt, completion_tokens = c.completion
  from (select h.session_id,
               count(*) filter (where h.message->>'type' = 'human') as turns,
               coalesce(sum((h.message->'data'->'usage_metadata'->>'input_tokens')::bigint), 0)
                 as prompt,
               coalesce(sum((h.message->'data'->'usage_metadata'->>'output_tokens')::bigint), 0)
                 as completion
          from public.chat_message_history h
         where h.session_id in (select b.id from bench_sessions b)
         group by h.session_id) c
 where c.session_id = s.id
"""

# Every 20th answer of each user: +1 (7 in 10), -1 (2 in 10), 0; a third commented.
_FILL_FEEDBACK = """
insert into memchat.message_feedback
    (message_id, user_id, session_id, agent_name, rating, comment, created_at, updated_at)
select a.id, a.user_id, a.session_id, a.agent_name,
       case when mod(a.rn / %(every)s, 10) < 7 then 1
            when mod(a.rn / %(every)s, 10) < 9 then -1 else 0 end,
       case when mod(a.rn / %(every)s, 3) = 0 then 'feedback ' || a.rn end,
       a.created_at + interval '1 minute', a.created_at + interval '1 minute'
  from (select h.id, h.user_id, h.session_id, b.agent_name, h.created_at,
               row_number() over (partition by h.user_id order by h.id) as rn
          from public.chat_message_history h
          join bench_sessions b on b.id = h.session_id
         where h.message->>'type' = 'ai') a
 where mod(a.rn, %(every)s) = 0
 order by a.id
"""


@dataclass
class Owner:
    """A measured user: one per size."""

    size: int
    caller: store.Caller
    largest_id: uuid.UUID
    largest_size: int
    expected: dict[str, Any] = field(default_factory=dict)  # checks, from the admin


@dataclass(frozen=True)
class Case:
    """One timed call: a path (direct / http), a label, and how to make it."""

    path: str
    label: str
    owner: Owner | None  # None: the floor, the same for everyone
    run: Callable[[], Any]


@dataclass
class Filled:
    owners: list[Owner]
    seconds: float
    rows: dict[str, int]


def session_sizes(total: int, sessions: int, rng: random.Random) -> list[int]:
    """`total` messages over `sessions`, session k ~ 1/k, each an even count >= 2."""
    weights = [1 / (k + 1) for k in range(sessions)]
    scale = total / sum(weights)
    sizes = [max(2, 2 * round(w * scale / 2)) for w in weights]
    sizes[0] += total - sum(sizes)  # the largest absorbs the rounding
    assert sizes[0] >= 2 and sum(sizes) == total, sizes
    rng.shuffle(sizes)
    return sizes


def templates() -> dict[str, str]:
    return {
        "human": json.dumps(messages.human("")),
        "ai": json.dumps(messages.ai("", model="gpt-4o-mini")),
        "filler": FILLER,
    }


def fill(
    admin: psycopg.Connection[Any],
    sizes: Sequence[int],
    other_users: int,
    rng: random.Random,
    created: list[uuid.UUID],
    feedback_every: int = FEEDBACK_EVERY,
) -> Filled:
    """Users, sessions, messages, counters and feedback (see the module doc)."""
    started = time.perf_counter()
    callers = [common.create_user(admin) for _ in sizes]
    created += [c.user_id for c in callers]
    others = [uuid.uuid4() for _ in range(other_users)]
    if others:
        common.insert_users(admin, others)
        created += others

    now = datetime.now(UTC)
    rows: list[tuple[uuid.UUID, uuid.UUID, str, int, datetime, datetime]] = []
    owners = []
    for size, caller in zip(sizes, callers, strict=True):
        counts = session_sizes(size, SESSIONS, rng)
        ids = [uuid.uuid4() for _ in counts]
        for k, (sid, n) in enumerate(zip(ids, counts, strict=True)):
            # One session a day over the last 100 days, a turn every 30 s.
            begun = now - timedelta(days=SESSIONS - k, seconds=rng.uniform(0, 3600))
            ended = min(begun + timedelta(seconds=30 * n // 2), now)
            agent = AGENTS[1] if k % 5 == 4 else AGENTS[0]
            rows.append((sid, caller.user_id, agent, n, begun, ended))
        largest = max(range(SESSIONS), key=lambda k: counts[k])
        owners.append(Owner(size, caller, ids[largest], counts[largest]))
    for user_id in others:
        for _ in range(OTHER_SESSIONS):
            begun = now - timedelta(days=rng.uniform(1, SESSIONS))
            ended = begun + timedelta(seconds=30 * OTHER_MESSAGES // 2)
            rows.append((uuid.uuid4(), user_id, AGENTS[0], OTHER_MESSAGES, begun, ended))
    rng.shuffle(rows)

    with admin.transaction():
        admin.execute(
            "create temporary table bench_sessions (ord integer, id uuid, user_id uuid,"
            " agent_name text, n integer, created_at timestamptz, last_active_at timestamptz)"
            " on commit drop"
        )
        with (
            admin.cursor() as cur,
            cur.copy("copy bench_sessions from stdin (format binary)") as copy,
        ):
            copy.set_types(["int4", "uuid", "uuid", "text", "int4", "timestamptz", "timestamptz"])
            for ord_, row in enumerate(rows):
                copy.write_row((ord_, *row))
        admin.execute(
            "insert into public.chat_sessions (id, user_id, agent_name, title, message_count,"
            " created_at, last_active_at, expires_at)"
            " select id, user_id, agent_name, 'benchmark', n, created_at, last_active_at,"
            " now() + interval '1 day' from bench_sessions order by ord"
        )
        admin.execute(_FILL_MESSAGES, templates())
        admin.execute(_FILL_COUNTERS)
        admin.execute(
            "insert into public.user_agent_active_sessions"
            " (user_id, agent_name, active_session_id, last_active_at)"
            " select distinct on (user_id, agent_name) user_id, agent_name, id, last_active_at"
            " from bench_sessions order by user_id, agent_name, last_active_at desc"
        )
        admin.execute(_FILL_FEEDBACK, {"every": feedback_every})
    common.vacuum_analyze(
        admin,
        "public.chat_sessions",
        "public.chat_message_history",
        "memchat.message_feedback",
        "public.user_agent_active_sessions",
        "auth.users",
    )
    for owner in owners:
        owner.expected = expected_stats(admin, owner)
    counts = {}
    for table in (
        "public.chat_sessions",
        "public.chat_message_history",
        "memchat.message_feedback",
    ):
        row = admin.execute(f"select count(*) from {table}").fetchone()
        assert row is not None
        counts[table] = int(row[0])
    return Filled(owners, time.perf_counter() - started, counts)


def expected_stats(admin: psycopg.Connection[Any], owner: Owner) -> dict[str, Any]:
    """What the stats must say, counted from the rows (messages included)."""
    uid = owner.caller.user_id
    row = admin.execute(
        "select count(*), sum(message_count), sum(turn_count), sum(prompt_tokens),"
        " sum(completion_tokens), count(*) filter (where agent_name = 'default'),"
        " sum(message_count) filter (where agent_name = 'default')"
        " from public.chat_sessions where user_id = %s",
        (uid,),
    ).fetchone()
    usage = admin.execute(
        "select count(*), count(*) filter (where message->>'type' = 'human'),"
        " sum((message->'data'->'usage_metadata'->>'input_tokens')::bigint),"
        " sum((message->'data'->'usage_metadata'->>'output_tokens')::bigint)"
        " from public.chat_message_history where user_id = %s",
        (uid,),
    ).fetchone()
    feedback = admin.execute(
        "select count(*) filter (where rating = 1), count(*) filter (where rating = -1),"
        " count(*) filter (where rating = 0), count(*) filter (where comment is not null)"
        " from memchat.message_feedback where user_id = %s",
        (uid,),
    ).fetchone()
    assert row is not None and usage is not None and feedback is not None
    sessions, msgs, turns, prompt, completion, default_sessions, default_msgs = map(int, row)
    # The counters say what the messages say.
    assert (msgs, turns, prompt, completion) == tuple(map(int, usage)), (row, usage)
    assert msgs == owner.size and sessions == SESSIONS
    return {
        "sessions": sessions,
        "messages": msgs,
        "turns": turns,
        "tokens": {"prompt": prompt, "completion": completion},
        "feedback": dict(
            zip(
                ("positive", "negative", "neutral", "with_comment"), map(int, feedback), strict=True
            )
        ),
        "default": (default_sessions, default_msgs),
    }


def check_chat_stats(owner: Owner, agent: str | None, got: dict[str, Any]) -> None:
    e = owner.expected
    if agent is None:
        assert got["sessions"]["total"] == e["sessions"], got
        assert got["messages"] == e["messages"], got
        assert got["turns"] == e["turns"], got
        assert got["tokens"] == e["tokens"], got
        assert got["feedback"] == e["feedback"], got
    else:
        assert (got["sessions"]["total"], got["messages"]) == e["default"], got


def check_session_stats(owner: Owner, got: dict[str, Any]) -> None:
    assert got["session_id"] == str(owner.largest_id), got
    assert got["messages"] == owner.largest_size and got["turns"] == owner.largest_size // 2, got


# ------------------------------------------------------------------ timing


async def pipelined(db: Database, caller: store.Caller, query: str, arg: Any) -> Any:
    """One call as the API's store makes it: one transaction, one round trip."""
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        if query == FLOOR:
            await cur.execute(query)
        else:
            await cur.execute(query, (caller.user_id, arg))
    row = await cur.fetchone()
    assert row is not None
    return row[0]


def serves_stats(app: Any) -> bool:
    """Whether the app serves GET /chat/stats and GET /chat/stats/{session_id}
    (read from its OpenAPI document: routers may be included lazily)."""
    paths = app.openapi().get("paths", {})
    return all("get" in paths.get(p, {}) for p in ("/chat/stats", "/chat/stats/{session_id}"))


def direct_cases(db: Database, owners: list[Owner]) -> list[Case]:
    first = owners[0].caller
    cases = [
        Case("direct", "claims + select 1 (floor)", None, lambda: pipelined(db, first, FLOOR, None))
    ]
    for o in owners:
        c = o.caller
        cases += [
            Case("direct", "chat_stats(null)", o, lambda c=c: pipelined(db, c, CHAT_STATS, None)),
            Case(
                "direct",
                "chat_stats('default')",
                o,
                lambda c=c: pipelined(db, c, CHAT_STATS, AGENTS[0]),
            ),
            Case(
                "direct",
                "session_stats(largest)",
                o,
                lambda c=c, o=o: pipelined(db, c, SESSION_STATS, o.largest_id),
            ),
        ]
    return cases


def http_cases(client: Any, owners: list[Owner]) -> list[Case]:
    async def get(path: str, token: str) -> Any:
        response = await client.get(path, headers={"Authorization": f"Bearer {token}"})
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text}")
        return response.json()

    cases = []
    for o in owners:
        token = devtokens.mint(common.JWT_SECRET, o.caller.user_id)
        cases += [
            Case("http", "GET /chat/stats", o, lambda t=token: get("/chat/stats", t)),
            Case(
                "http",
                "GET /chat/stats?agent_name=default",
                o,
                lambda t=token: get("/chat/stats?agent_name=default", t),
            ),
            Case(
                "http",
                "GET /chat/stats/{largest}",
                o,
                lambda t=token, o=o: get(f"/chat/stats/{o.largest_id}", t),
            ),
        ]
    return cases


async def time_cases(
    cases: list[Case], iterations: int, warmup: int, rng: random.Random
) -> tuple[dict[int, list[float]], dict[int, Any]]:
    """Every case once per iteration, in a new random order each time (so no
    case always follows the same other one)."""
    samples: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    last: dict[int, Any] = {}
    order = list(range(len(cases)))
    for i in range(warmup + iterations):
        rng.shuffle(order)
        for j in order:
            t0 = perf_counter_ns()
            last[j] = await cases[j].run()
            elapsed = (perf_counter_ns() - t0) / 1e6
            if i >= warmup:
                samples[j].append(elapsed)
    return samples, last


def check_answers(cases: list[Case], last: dict[int, Any]) -> None:
    for j, case in enumerate(cases):
        got, owner = last[j], case.owner
        if owner is None:
            assert got == 1
        elif "session_stats" in case.label or "{largest}" in case.label:
            check_session_stats(owner, got)
        else:
            check_chat_stats(owner, AGENTS[0] if "default" in case.label else None, got)


# ------------------------------------------------------------------- plans


@dataclass
class Plan:
    label: str
    size: int
    scans: list[str]  # "Index Scan chat_sessions (chat_sessions_user_recent_idx): 100 rows"
    relations: dict[str, tuple[int, int]]  # relation -> (rows, buffers)
    buffers: int
    execution_ms: float
    text: str


def _walk(node: dict[str, Any], out: list[dict[str, Any]]) -> None:
    out.append(node)
    for child in node.get("Plans", []):
        _walk(child, out)


def statement_of(body: str) -> str:
    """The statement a PL/pgSQL body `declare ... begin return (...); end`
    returns, each variable declared `v_x type := expr;` replaced by its
    expression."""
    returned = re.search(r"\breturn\s*\((.*)\);\s*end\s*$", body, re.DOTALL)
    if returned is None:
        raise SystemExit("explain: the function's body returns no statement")
    statement = returned.group(1)
    for name, expr in re.findall(r"^\s*(v_\w+)\s+[^:;]+:=\s*([^;]+);", body, re.MULTILINE):
        statement = re.sub(rf"\b{name}\b", f"({expr})", statement)
    return statement


def explain(url: str, owner: Owner, function: str, arg: Any, label: str) -> Plan:
    """EXPLAIN (ANALYZE, BUFFERS) of the function's statement as memchat_user
    with the owner's claims, as a generic plan (the SQL function plans its
    statement without its argument's value)."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        # The caller's id first (p_user_id), then the argument.
        row = conn.execute(
            "select prosrc, proargnames[1], proargnames[2], format_type(proargtypes[1], null)"
            " from pg_proc where oid = %s::regprocedure",
            (function,),
        ).fetchone()
        assert row is not None
        body, callername, argname, argtype = row
        body = statement_of(body)
        body = re.sub(rf"\b{re.escape(callername)}\b", "$1", body)
        body = re.sub(rf"\b{re.escape(argname)}\b", "$2", body)
        become(conn, owner.caller.claims)
        conn.execute("set local plan_cache_mode = force_generic_plan")
        conn.execute(f"prepare bench_stats (uuid, {argtype}) as {body}")
        # Client-side binding: a utility statement's parameters get no types.
        cur = psycopg.ClientCursor(conn)
        execute = f"execute bench_stats (%s::uuid, %s::{argtype})"
        args = (owner.caller.user_id, arg)
        cur.execute(execute, args)  # once, so the plan and the buffers are warm
        (doc,) = cur.execute(
            "explain (analyze, buffers, format json) " + execute, args
        ).fetchone() or (None,)
        text = "\n".join(
            r[0] for r in cur.execute("explain (analyze, buffers) " + execute, args).fetchall()
        )
    top = doc[0]
    nodes: list[dict[str, Any]] = []
    _walk(top["Plan"], nodes)
    scans, relations = [], {}
    for n in nodes:
        if "Relation Name" not in n:
            continue
        rows = int(n["Actual Rows"] * n["Actual Loops"])
        buffers = int(n["Shared Hit Blocks"] + n["Shared Read Blocks"])
        index = f" ({n['Index Name']})" if "Index Name" in n else ""
        scans.append(f"{n['Node Type']} {n['Relation Name']}{index}: {rows:,} rows")
        r0, b0 = relations.get(n["Relation Name"], (0, 0))
        relations[n["Relation Name"]] = (r0 + rows, b0 + buffers)
    plan = top["Plan"]
    return Plan(
        label=label,
        size=owner.size,
        scans=scans,
        relations=relations,
        buffers=int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]),
        execution_ms=float(top["Execution Time"]),
        text=text,
    )


def plans_for(url: str, owners: list[Owner]) -> list[Plan]:
    plans = []
    for o in owners:
        plans.append(explain(url, o, "memchat.chat_stats(uuid, text)", None, "chat_stats(null)"))
        plans.append(
            explain(url, o, "memchat.chat_stats(uuid, text)", AGENTS[0], "chat_stats('default')")
        )
        plans.append(
            explain(
                url, o, "memchat.session_stats(uuid, uuid)", o.largest_id, "session_stats(largest)"
            )
        )
    return plans


# --------------------------------------------------------------- analytics


@dataclass
class ViewPlan:
    view: str
    rows: int  # the view's rows
    relations: dict[str, tuple[int, int]]  # relation -> (rows, buffers)
    buffers: int
    execution_ms: float
    text: str


@dataclass
class Analytics:
    samples: dict[str, list[float]]  # "last 7 days" / "all time" -> ms per report
    plans: list[ViewPlan]
    totals_ok: bool
    totals: dict[str, int]
    expected: dict[str, int]


def time_analytics(url: str, admin: psycopg.Connection[Any], iterations: int) -> Analytics:
    """`memchat stats`' read, as memchat_analyst, timed; then each view's plan."""
    windows = {"last 7 days": 7, "all time": analytics.MAX_DAYS}
    samples: dict[str, list[float]] = {label: [] for label in windows}
    last: dict[str, analytics.Report] = {}
    with psycopg.connect(url, **connect_kwargs()) as conn:
        for i in range(iterations + 1):  # the first round warms the cache
            for label, days in windows.items():
                t0 = perf_counter_ns()
                last[label] = analytics.read(conn, days=days, agent=None)
                if i:
                    samples[label].append((perf_counter_ns() - t0) / 1e6)
        plans = [view_plan(conn, view) for view in ("turns", *analytics.VIEWS)]
    report = last["all time"]
    assert report.as_analyst, report.note
    row = admin.execute(
        "select count(*),"
        " coalesce(sum((message->'data'->'usage_metadata'->>'input_tokens')::bigint), 0),"
        " coalesce(sum((message->'data'->'usage_metadata'->>'output_tokens')::bigint), 0)"
        " from public.chat_message_history where message->>'type' = 'ai'"
    ).fetchone()
    assert row is not None
    expected = dict(
        zip(("turns", "prompt_tokens", "completion_tokens"), map(int, row), strict=True)
    )
    return Analytics(samples, plans, report.totals == expected, report.totals, expected)


def view_plan(conn: psycopg.Connection[Any], view: str) -> ViewPlan:
    """EXPLAIN (ANALYZE, BUFFERS) of the whole view, as memchat_analyst."""
    from psycopg import sql

    query = sql.SQL("select * from {}").format(sql.Identifier(analytics.SCHEMA, view))
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("set local role {}").format(sql.Identifier(analytics.ANALYST_ROLE)))
        conn.execute(query)  # once, so the buffers are warm
        row = conn.execute(
            sql.SQL("explain (analyze, buffers, format json) {}").format(query)
        ).fetchone()
        assert row is not None
        text = "\n".join(
            r[0] for r in conn.execute(sql.SQL("explain (analyze, buffers) {}").format(query))
        )
    top = row[0][0]
    nodes: list[dict[str, Any]] = []
    _walk(top["Plan"], nodes)
    relations: dict[str, tuple[int, int]] = {}
    for n in nodes:
        if "Relation Name" in n:
            r0, b0 = relations.get(n["Relation Name"], (0, 0))
            relations[n["Relation Name"]] = (
                r0 + int(n["Actual Rows"] * n["Actual Loops"]),
                b0 + int(n["Shared Hit Blocks"] + n["Shared Read Blocks"]),
            )
    plan = top["Plan"]
    return ViewPlan(
        view=view,
        rows=int(plan["Actual Rows"]),
        relations=relations,
        buffers=int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]),
        execution_ms=float(top["Execution Time"]),
        text=text,
    )


def analytics_report(result: Analytics, iterations: int, explain: bool) -> None:
    print()
    print(
        "Operator analytics: `memchat stats`' read (analytics.read: one read-only transaction"
        f" as memchat_analyst, every view), {iterations} times per window after one warm-up,"
        " over every user's data:"
    )
    print()
    rows = []
    for label, samples in result.samples.items():
        st = common.summarize(samples)
        rows.append([label, fmt(st.median), fmt(st.p95), fmt(st.minimum)])
    print(common.format_table(["window", "median ms", "p95 ms", "min ms"], rows))
    print()
    print("Views (EXPLAIN ANALYZE BUFFERS of `select * from` the view, as memchat_analyst):")
    print()
    print(
        common.format_table(
            ["view", "rows", "relations read: rows / buffers", "buffers", "server ms"],
            [
                [
                    p.view,
                    f"{p.rows:,}",
                    "; ".join(
                        f"{name} {r:,} / {b:,}" for name, (r, b) in sorted(p.relations.items())
                    ),
                    f"{p.buffers:,}",
                    fmt(p.execution_ms),
                ]
                for p in result.plans
            ],
        )
    )
    print()
    if explain:
        for p in result.plans:
            print(f"{p.view}:")
            print("\n".join("    " + line for line in p.text.splitlines()))
            print()
    verdict = "match" if result.totals_ok else "DO NOT match"
    print(
        f"analytics totals (all time) {verdict} the messages: report {result.totals},"
        f" messages {result.expected}"
    )


# ------------------------------------------------------------------ report


def fmt(value: float) -> str:
    return f"{value:.3f}"


def report(
    admin: psycopg.Connection[Any],
    target: common.Target,
    args: argparse.Namespace,
    filled: Filled,
    cases: list[Case],
    samples: dict[int, list[float]],
    plans: list[Plan],
    http_note: str,
    load_at_start: str,
) -> None:
    owners = filled.owners
    print("# memchat stats: memchat.chat_stats / session_stats, as the API calls them")
    print()
    print(common.machine_report(admin, target, load_at_start=load_at_start))
    print(
        f"data:       {len(owners)} measured users x {SESSIONS} sessions"
        f" (messages {', '.join(f'{o.size:,}' for o in owners)});"
        f" {args.other_users:,} other users x {OTHER_SESSIONS} sessions x {OTHER_MESSAGES}"
        f" messages; 1 answer in {args.feedback_every:,} rated; filled in {filled.seconds:.1f} s"
    )
    print("tables:     " + ", ".join(f"{name} {n:,} rows" for name, n in filled.rows.items()))
    print(
        f"iterations: {args.iterations} per call (after {args.warmup} warm-up), all calls"
        " once per iteration in random order; one connection (Unix socket), one round trip"
        " per direct call"
    )
    print(f"http:       {http_note}")
    print()
    rows = []
    for j, case in enumerate(cases):
        st = common.summarize(samples[j])
        o = case.owner
        if o is None:
            size = "-"
        elif "largest" in case.label:
            size = f"{o.size:,} ({o.largest_size:,} in it)"
        else:
            size = f"{o.size:,}"
        rows.append([case.path, case.label, size, fmt(st.median), fmt(st.p95), fmt(st.minimum)])
    print(common.format_table(["path", "call", "messages", "median ms", "p95 ms", "min ms"], rows))
    print()
    print("Plans (EXPLAIN ANALYZE BUFFERS, generic plan, as memchat_user with the user's claims):")
    print()
    print(
        common.format_table(
            ["call", "messages", "relations read: rows / buffers", "buffers", "server ms"],
            [
                [
                    p.label,
                    f"{p.size:,}",
                    "; ".join(
                        f"{name} {r:,} / {b:,}" for name, (r, b) in sorted(p.relations.items())
                    ),
                    f"{p.buffers:,}",
                    fmt(p.execution_ms),
                ]
                for p in plans
            ],
        )
    )
    print()
    if args.explain:
        for p in plans:
            print(f"{p.label}, {p.size:,} messages:")
            print("\n".join("    " + line for line in p.text.splitlines()))
            print()

    largest, smallest = owners[-1], owners[0]
    timed_ok = True
    for path in ("direct", "http"):
        for label in (
            ["chat_stats(null)", "chat_stats('default')", "session_stats(largest)"]
            if path == "direct"
            else [
                "GET /chat/stats",
                "GET /chat/stats?agent_name=default",
                "GET /chat/stats/{largest}",
            ]
        ):
            by_owner = {
                case.owner.size: common.summarize(samples[j])
                for j, case in enumerate(cases)
                if case.path == path and case.label == label and case.owner is not None
            }
            if not by_owner:
                continue
            big, small = by_owner[largest.size], by_owner[smallest.size]
            ok = big.median <= TARGET_MS and big.p95 <= TARGET_MS
            timed_ok = timed_ok and ok
            line = (
                f"{path} {label}: at {largest.size:,} messages median {fmt(big.median)} ms,"
                f" p95 {fmt(big.p95)} ms (<= {TARGET_MS:g} ms: {'met' if ok else 'NOT met'})"
            )
            if largest is not smallest:
                line += (
                    f"; median at {largest.size:,} / at {smallest.size:,}:"
                    f" {big.median / small.median:.2f}x"
                )
            print(line)

    # What the plans read: never messages; the user's sessions, the same
    # number at every size; their feedback, which grows with rated answers.
    reads_messages = [p for p in plans if "chat_message_history" in p.relations]
    stats_plans = [p for p in plans if p.label == "chat_stats(null)"]
    session_rows = {p.relations.get("chat_sessions", (0, 0))[0] for p in stats_plans}
    feedback_rows = [p.relations.get("message_feedback", (0, 0))[0] for p in stats_plans]
    flat = not reads_messages and session_rows == {SESSIONS}
    if reads_messages:
        print(
            "reads no messages: NOT met ("
            + ", ".join(f"{p.label} at {p.size:,}" for p in reads_messages)
            + " reads chat_message_history)"
        )
    else:
        print(
            "reads no messages: met (no plan reads chat_message_history); chat_stats(null)"
            f" reads {'/'.join(f'{n:,}' for n in sorted(session_rows))} session rows at every"
            f" size and the user's feedback rows ({', '.join(f'{n:,}' for n in feedback_rows)})"
        )
    verdict = "met" if timed_ok and flat else "NOT met"
    print(
        f"target (<= {TARGET_MS:g} ms median and p95 at {largest.size:,} messages,"
        f" cost independent of messages): {verdict}"
    )


# --------------------------------------------------------------------- run


async def run(args: argparse.Namespace) -> int:
    load_at_start = common.load_average()
    rng = random.Random(args.seed)
    created: list[uuid.UUID] = []
    with common.database() as target:
        admin = common.admin_connection(target.url)
        db = Database(target.url, max_connections=1)
        client = None
        try:
            filled = fill(admin, args.sizes, args.other_users, rng, created, args.feedback_every)
            cases = direct_cases(db, filled.owners)
            http_note = "skipped (--no-http)"
            if not args.no_http:
                from tests.utils.api import ApiClient

                settings = load_settings(
                    database_url=target.url,
                    supabase_jwt_secret=common.JWT_SECRET,
                    openai_api_key="unused",
                    db_max_connections=1,
                    # The bench times the statement, not the read throttle.
                    read_rate_per_minute=100_000,
                    read_rate_burst=100_000,
                )
                client = ApiClient(settings)
                if serves_stats(client.app):
                    cases += http_cases(client, filled.owners)
                    http_note = (
                        "create_app in-process (httpx ASGITransport), one database connection"
                    )
                else:
                    http_note = "not run: create_app serves no GET /chat/stats"
            samples, last = await time_cases(cases, args.iterations, args.warmup, rng)
            check_answers(cases, last)
            plans = plans_for(target.url, filled.owners)
            report(admin, target, args, filled, cases, samples, plans, http_note, load_at_start)
            if args.analytics_iterations:
                result = time_analytics(target.url, admin, args.analytics_iterations)
                analytics_report(result, args.analytics_iterations, args.explain)
        finally:
            if client is not None:
                await client.aclose()
            await db.close()
            # Leave a DATABASE_URL database as found (users cascade to their rows).
            admin.execute("delete from auth.users where id = any(%s)", (created,))
            admin.close()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=common.comma_list(int),
        default=list(DEFAULT_SIZES),
        help="comma-separated messages per measured user (1000,10000,100000)",
    )
    parser.add_argument("--iterations", type=int, default=500, help="timed calls each (500)")
    parser.add_argument("--warmup", type=int, default=30, help="untimed rounds first (30)")
    parser.add_argument(
        "--other-users",
        type=int,
        default=1000,
        help=f"other users, {OTHER_SESSIONS} sessions of {OTHER_MESSAGES} messages each (1000)",
    )
    parser.add_argument(
        "--feedback-every",
        type=int,
        default=FEEDBACK_EVERY,
        help=f"rate one answer in this many ({FEEDBACK_EVERY}); e.g. 2000 to hold the"
        " feedback (nearly) constant while messages grow",
    )
    parser.add_argument(
        "--analytics-iterations",
        type=int,
        default=20,
        help="timed reads of the operator's analytics per window (20; 0: skip them)",
    )
    parser.add_argument("--seed", type=int, default=13, help="random seed (13)")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP variant")
    parser.add_argument("--explain", action="store_true", help="print the full plans")
    args = parser.parse_args(argv)
    if not args.sizes or any(n < 2 * SESSIONS or n % 2 for n in args.sizes):
        parser.error(f"--sizes: even numbers >= {2 * SESSIONS} (question + answer pairs)")
    if args.feedback_every < 1:
        parser.error("--feedback-every must be >= 1")
    if args.analytics_iterations < 0:
        parser.error("--analytics-iterations must be >= 0")
    args.sizes = sorted(args.sizes)
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
