"""The operator's analytics views (memchat_analytics, migrations
supabase/schemas/functions/stats.sql and supabase/schemas/views.sql).

- Across users, the views add up a scripted history exactly: turns, tokens,
  latency, users per day, models, feedback rates, session lengths, recall
  and summary use; `memchat.usecases.analytics` filters them by days and agent.
- Users and sessions appear as keyed hashes (HMAC-SHA256 under the secret in
  memchat.analytics_key), the same as Python's hmac computes; rotating the
  secret changes them and nothing else.
- Only `memchat_analyst` (and the tables' owner) can read them: `anon`,
  `authenticated`, `memchat_user` with a user's claims, `service_role` and
  the login roles are refused on every view.
- `memchat_analyst` sees every user's numbers through the views (they run
  with their owner's rights), and can read no table and write nothing.
  (tests/store/test_analyst_sees_no_content.py: no text a user wrote.)

The history lives in a database of its own on the test server (created and
migrated for this module), so the views hold nothing but it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql

from memchat import devdb, messages, store
from memchat.cli.stats import render
from memchat.store.db import Database
from memchat.usecases import analytics
from tests.store.conftest import refused
from tests.utils.analytics_data import (
    Fresh,
    Recorder,
    answer,
    at,
    fresh_database,
    login_with_own_rights,
    pseudonym,
    turn,
    utc_today,
)
from tests.utils.store_data import acting_as, through_data_api
from tests.utils.users import UserFactory

VIEWS = list(analytics.VIEWS)


@dataclass(frozen=True)
class History:
    fresh: Fresh
    a: store.Caller
    b: store.Caller
    today: dt.date
    day1: dt.date  # yesterday
    day9: dt.date  # nine days ago
    sessions: dict[uuid.UUID, uuid.UUID]  # session id -> its user's id


@pytest.fixture(scope="module")
async def history(fresh: Fresh) -> AsyncIterator[History]:
    """Two users, two agents, two models, three days:

    A, support: 1 turn nine days ago (rated -1); 3 turns yesterday, the
       second after a tool round (rated +1, -1 with a comment, +1); 1 turn
       today (rated +1).
    B, support: 2 turns today (rated 0 and +1).
    B, sales: 6 turns today, the last one an answer stored before the
       analytics metadata existed (no model, usage or latency); the third
       rated -1 with a comment.
    """
    users = UserFactory(fresh.admin)
    a, b = users.create(), users.create()
    today = utc_today(fresh.admin)
    day1, day9 = today - dt.timedelta(days=1), today - dt.timedelta(days=9)
    db = Database(fresh.api_url, max_connections=2)
    rec = Recorder(db, fresh.admin)
    try:
        s_a0, (a0,) = await rec.session(
            a, "support", [turn(at(day9, "10:00"), "gpt-a", 1000, 100, 500)],
            started=at(day9, "09:59"),
        )  # fmt: skip
        s_a1, a1 = await rec.session(
            a, "support",
            [turn(at(day1, "10:00"), "gpt-a", 100, 20, 100),
             turn(at(day1, "10:10"), "gpt-a", 150, 30, 200, recalled=2, after_tool=True),
             turn(at(day1, "10:20"), "gpt-a", 200, 40, 300, summary_used=True)],
            started=at(day1, "09:50"),
        )  # fmt: skip
        s_a2, (a2,) = await rec.session(
            a, "support", [turn(at(today, "00:10"), "gpt-b", 50, 10, 400, recalled=1)],
            started=at(today, "00:09"),
        )  # fmt: skip
        s_b1, b1 = await rec.session(
            b, "support",
            [turn(at(today, "00:20"), "gpt-a", 120, 25, 150),
             turn(at(today, "00:21"), "gpt-a", 80, 15, 250, recalled=3)],
            started=at(today, "00:19"),
        )  # fmt: skip
        s_b2, b2 = await rec.session(
            b, "sales",
            [*(turn(at(today, f"00:3{i}"), "gpt-b", 10, 5, 50) for i in range(5)),
             (at(today, "00:40"), [messages.ai("an old answer")])],
            started=at(today, "00:30"),
        )  # fmt: skip

        await rec.rate(a, a0, -1, at(day9, "11:00"))
        await rec.rate(a, a1[0], 1, at(day1, "12:00"))
        await rec.rate(a, a1[1], -1, at(day1, "12:00"), comment="too long")
        await rec.rate(a, a1[2], 1, at(day1, "12:00"))
        await rec.rate(a, a2, 1, at(today, "01:00"))
        await rec.rate(b, b1[0], 0, at(today, "01:00"))
        await rec.rate(b, b1[1], 1, at(today, "01:00"))
        await rec.rate(b, b2[2], -1, at(today, "01:00"), comment="wrong")
    finally:
        await db.close()
    sessions = {s: a.user_id for s in (s_a0, s_a1, s_a2)} | {s: b.user_id for s in (s_b1, s_b2)}
    yield History(fresh, a, b, today, day1, day9, sessions)


def view_rows(conn: psycopg.Connection, view: str, role: str | None) -> list[dict[str, Any]]:
    """A view's rows as `role` (None: the owner), ordered by its columns
    left to right (for the daily views: day, then model or agent)."""
    relation = sql.Identifier("memchat_analytics", view)
    with conn.transaction(force_rollback=True):
        if role:
            conn.execute(sql.SQL("set local role {}").format(sql.Identifier(role)))
        width = len(
            conn.execute(sql.SQL("select * from {} limit 0").format(relation)).description or ()
        )
        order = sql.SQL(", ").join(sql.Literal(i) for i in range(1, width + 1))
        cur = conn.execute(sql.SQL("select * from {} order by {}").format(relation, order))
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur]


def numbers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with numeric values as int or float (the views' numeric columns)."""
    return [{k: float(v) if isinstance(v, Decimal) else v for k, v in row.items()} for row in rows]


# ------------------------------------------------------------ exact sums


@pytest.mark.parametrize("reader", ["memchat_analyst", "owner"])
def test_the_views_add_up_the_history_across_users(history: History, reader: str) -> None:
    conn, role = history.fresh.admin, None if reader == "owner" else reader
    d0, d1, d9 = history.today, history.day1, history.day9

    turns = view_rows(conn, "turns", role)
    assert len(turns) == 13  # the tool round is not a turn; each final answer is
    # Users and sessions under their keyed hashes, never their ids.
    assert {t["user_pseudonym"] for t in turns} == {
        pseudonym(conn, history.a.user_id),
        pseudonym(conn, history.b.user_id),
    }
    assert {t["session_pseudonym"] for t in turns} == {
        pseudonym(conn, user_id, session_id) for session_id, user_id in history.sessions.items()
    }
    assert {"message_id", "session_id", "user_id"}.isdisjoint(turns[0])
    assert sum(t["prompt_tokens"] for t in turns) == 1000 + 450 + 50 + 200 + 50
    assert sum(t["completion_tokens"] for t in turns) == 100 + 90 + 10 + 40 + 25

    assert view_rows(conn, "daily_active_users", role) == [
        {"day": d9, "users": 1, "turns": 1},
        {"day": d1, "users": 1, "turns": 3},
        {"day": d0, "users": 2, "turns": 9},
    ]
    usage = numbers(view_rows(conn, "daily_usage", role))
    assert usage == [
        {"day": d9, "model": "gpt-a", "turns": 1, "users": 1, "prompt_tokens": 1000,
         "completion_tokens": 100, "avg_latency_ms": 500.0, "p95_latency_ms": 500.0},
        {"day": d1, "model": "gpt-a", "turns": 3, "users": 1, "prompt_tokens": 450,
         "completion_tokens": 90, "avg_latency_ms": 200.0, "p95_latency_ms": 290.0},
        {"day": d0, "model": "gpt-a", "turns": 2, "users": 1, "prompt_tokens": 200,
         "completion_tokens": 40, "avg_latency_ms": 200.0, "p95_latency_ms": 245.0},
        {"day": d0, "model": "gpt-b", "turns": 6, "users": 2, "prompt_tokens": 100,
         "completion_tokens": 35, "avg_latency_ms": 108.3, "p95_latency_ms": 312.5},
        {"day": d0, "model": "unknown", "turns": 1, "users": 1, "prompt_tokens": 0,
         "completion_tokens": 0, "avg_latency_ms": None, "p95_latency_ms": None},
    ]  # fmt: skip
    feedback = numbers(view_rows(conn, "daily_feedback", role))
    assert feedback == [
        {"day": d9, "agent_name": "support", "ratings": 1, "positive": 0, "negative": 1,
         "neutral": 0, "with_comment": 0, "positive_rate": 0.0, "negative_rate": 1.0},
        {"day": d1, "agent_name": "support", "ratings": 3, "positive": 2, "negative": 1,
         "neutral": 0, "with_comment": 1, "positive_rate": 0.667, "negative_rate": 0.333},
        {"day": d0, "agent_name": "sales", "ratings": 1, "positive": 0, "negative": 1,
         "neutral": 0, "with_comment": 1, "positive_rate": 0.0, "negative_rate": 1.0},
        {"day": d0, "agent_name": "support", "ratings": 3, "positive": 2, "negative": 0,
         "neutral": 1, "with_comment": 0, "positive_rate": 0.667, "negative_rate": 0.0},
    ]  # fmt: skip
    lengths = sorted(
        numbers(view_rows(conn, "session_lengths", role)), key=lambda r: r["lower_bound"]
    )
    assert lengths == [
        {"bucket": "1 turn", "lower_bound": 0, "sessions": 2, "avg_turns": 1.0,
         "avg_duration_seconds": 60.0},
        {"bucket": "2-5 turns", "lower_bound": 2, "sessions": 2, "avg_turns": 2.5,
         "avg_duration_seconds": 960.0},
        {"bucket": "6-20 turns", "lower_bound": 6, "sessions": 1, "avg_turns": 6.0,
         "avg_duration_seconds": 600.0},
    ]  # fmt: skip
    memory = numbers(view_rows(conn, "daily_memory_use", role))
    assert memory == [
        {"day": d9, "agent_name": "support", "turns": 1, "turns_with_recall": 0,
         "exchanges_recalled": 0, "turns_with_summary": 0, "recall_rate": 0.0,
         "summary_rate": 0.0},
        {"day": d1, "agent_name": "support", "turns": 3, "turns_with_recall": 1,
         "exchanges_recalled": 2, "turns_with_summary": 1, "recall_rate": 0.333,
         "summary_rate": 0.333},
        {"day": d0, "agent_name": "sales", "turns": 6, "turns_with_recall": 0,
         "exchanges_recalled": 0, "turns_with_summary": 0, "recall_rate": 0.0,
         "summary_rate": 0.0},
        {"day": d0, "agent_name": "support", "turns": 3, "turns_with_recall": 2,
         "exchanges_recalled": 4, "turns_with_summary": 0, "recall_rate": 0.667,
         "summary_rate": 0.0},
    ]  # fmt: skip


def test_the_session_counters_match_the_turns(history: History) -> None:
    """What session_lengths counts (the sessions' counters) agrees with the
    turn-level views while no session was cleared."""
    conn = history.fresh.admin
    counters = {
        pseudonym(conn, user_id, session_id): (turns, prompt, completion)
        for session_id, user_id, turns, prompt, completion in conn.execute(
            "select id, user_id, turn_count, prompt_tokens, completion_tokens"
            "  from public.chat_sessions"
        ).fetchall()
    }
    summed = conn.execute(
        "select session_pseudonym, count(*), sum(prompt_tokens), sum(completion_tokens)"
        "  from memchat_analytics.turns group by 1"
    ).fetchall()
    assert len(counters) == 5
    assert {key: tuple(values) for key, *values in summed} == counters


def test_rotating_the_secret_changes_the_pseudonyms_and_nothing_else(history: History) -> None:
    """The one-line rotation of docs/analytics.md: new random secret, new
    pseudonyms (still the HMAC of the ids under it), the same numbers."""
    conn = history.fresh.admin
    before = {view: view_rows(conn, view, None) for view in VIEWS}
    old = pseudonym(conn, history.a.user_id)
    with conn.transaction(force_rollback=True):
        conn.execute("update memchat.analytics_key set secret = default, rotated_at = default")
        new = pseudonym(conn, history.a.user_id)
        assert new != old
        after = view_rows(conn, "turns", None)
        assert new in {t["user_pseudonym"] for t in after}
        assert old not in {t["user_pseudonym"] for t in after}
        assert {view: view_rows(conn, view, None) for view in VIEWS} == before


# ------------------------------------------------- memchat.usecases.analytics (stats)


def test_the_report_reads_the_window_and_the_agent_as_the_analyst(history: History) -> None:
    d0, d1 = history.today, history.day1
    report = analytics.read(history.fresh.admin, days=7, agent="support")
    assert report.as_analyst and report.read_as == "memchat_analyst"
    assert (report.since, report.until) == (d0 - dt.timedelta(days=6), d0)
    rows = report.rows
    # No agent column: every agent; nine days ago is outside the window.
    assert rows["daily_active_users"] == [
        {"day": d1, "users": 1, "turns": 3},
        {"day": d0, "users": 2, "turns": 9},
    ]
    assert [(r["day"], r["model"], r["turns"]) for r in rows["daily_usage"]] == [
        (d1, "gpt-a", 3),
        (d0, "gpt-a", 2),
        (d0, "gpt-b", 6),
        (d0, "unknown", 1),
    ]
    assert report.totals == {"turns": 12, "prompt_tokens": 750, "completion_tokens": 165}
    # With an agent column: that agent only.
    feedback = [
        (r["day"], r["agent_name"], r["ratings"], r["positive_rate"])
        for r in rows["daily_feedback"]
    ]
    assert feedback == [(d1, "support", 3, 0.667), (d0, "support", 3, 0.667)]
    assert [(r["day"], r["turns"], r["exchanges_recalled"]) for r in rows["daily_memory_use"]] == [
        (d1, 3, 2),
        (d0, 3, 4),
    ]
    # Neither: every stored session.
    assert [(r["bucket"], r["sessions"]) for r in rows["session_lengths"]] == [
        ("1 turn", 2),
        ("2-5 turns", 2),
        ("6-20 turns", 1),
    ]
    assert report.as_dict()["not_filtered_by_agent"] == [
        "daily_active_users",
        "daily_usage",
        "session_lengths",
    ]

    today_only = analytics.read(history.fresh.admin, days=1, agent=None)
    assert today_only.since == today_only.until == d0
    assert [r["agent_name"] for r in today_only.rows["daily_feedback"]] == ["sales", "support"]
    nobody = analytics.read(history.fresh.admin, days=30, agent="nobody")
    assert nobody.rows["daily_feedback"] == nobody.rows["daily_memory_use"] == []
    assert "no ratings in the last 30 days for agent nobody" in render(nobody)


def test_a_login_that_cannot_become_the_analyst_reads_with_its_own_rights(
    history: History, role_password: str | None
) -> None:
    """Set role refused: the report goes on as the login and says so; with
    the analyst's grants of its own, it sees what the analyst sees (the
    views run with their owner's rights: the grant on a view is the whole
    permission)."""
    fresh = history.fresh
    with login_with_own_rights(fresh, role_password) as probe:
        report = analytics.read_report(fresh.url_as(probe, role_password), days=30)
    assert report.read_as == report.login == probe and not report.as_analyst
    assert report.note == (
        f"{probe} cannot set role memchat_analyst: read with {probe}'s own rights"
        f" (grant memchat_analyst to {probe} to read as the operator role)"
    )
    assert report.as_dict()["as_analyst"] is False
    as_analyst = analytics.read(fresh.admin, days=30, agent=None)
    assert as_analyst.as_analyst and as_analyst.rows["daily_active_users"] != []
    assert report.rows == as_analyst.rows

    # A login without those rights gets a sentence, not a traceback.
    with pytest.raises(analytics.AnalyticsError) as refused_login:
        analytics.read_report(fresh.url_as(devdb.CLEANUP_ROLE, role_password))
    assert str(refused_login.value).startswith(
        "memchat_cleanup may not read memchat_analytics (permission denied for schema"
    )


# ----------------------------------------------------------- who may read

# How each role that must not read the views gets there, as the owner's
# connection stands in for PostgREST's authenticator and the API's login.
NOT_ALLOWED = ["anon", "authenticated", "memchat_user", "service_role", *devdb.LOGIN_ROLES]


@contextmanager
def as_role(conn: psycopg.Connection, role: str, claims: dict[str, Any]) -> Iterator[None]:
    if role == "anon":
        with acting_as(conn, None):
            yield
    elif role == "authenticated":
        with through_data_api(conn, claims):
            yield
    elif role == "memchat_user":
        with acting_as(conn, claims):
            yield
    else:
        with conn.transaction():
            conn.execute(sql.SQL("set local role {}").format(sql.Identifier(role)))
            yield


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("role", NOT_ALLOWED)
def test_nobody_else_reads_the_views(history: History, role: str, view: str) -> None:
    conn = history.fresh.admin
    query = sql.SQL("select * from {}").format(sql.Identifier("memchat_analytics", view))
    with as_role(conn, role, history.a.claims):
        assert conn.execute("select current_user").fetchone() == (role,)
        assert refused(conn, query, {})


def test_only_the_analyst_has_the_schema(history: History) -> None:
    rows = history.fresh.admin.execute(
        "select r.rolname from pg_roles r"
        " where has_schema_privilege(r.oid, 'memchat_analytics', 'usage')"
        "   and not r.rolsuper and r.rolname not like 'pg\\_%'"
        "   and r.rolname <> (select nspowner::regrole::text from pg_namespace"
        "                      where nspname = 'memchat_analytics')"
    ).fetchall()
    assert rows == [("memchat_analyst",)]


# ------------------------------------------------------- the analyst role


def test_the_analyst_selects_the_views_and_nothing_else(history: History) -> None:
    """Its only rights on relations are select on the views, which run with
    their owner's (the tables' owner's) rights behind a security barrier."""
    conn = history.fresh.admin
    readable = conn.execute(
        "select format('%I.%I', n.nspname, c.relname) from pg_class c"
        "  join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname not in ('pg_catalog', 'information_schema')"
        "   and (has_table_privilege('memchat_analyst', c.oid,"
        "          'select, insert, update, delete, truncate, references, trigger')"
        "        or has_any_column_privilege('memchat_analyst', c.oid,"
        "          'select, insert, update, references'))"
        " order by 1"
    ).fetchall()
    assert readable == [(f"memchat_analytics.{v}",) for v in sorted([*VIEWS, "turns"])]
    views = conn.execute(
        "select c.relname, c.relkind, c.reloptions, c.relowner = t.relowner"
        "  from pg_class c, pg_class t"
        " where c.relnamespace = 'memchat_analytics'::regnamespace"
        "   and t.oid = 'public.chat_message_history'::regclass"
        " order by 1"
    ).fetchall()
    assert [v[0] for v in views] == sorted([*VIEWS, "turns"])
    for name, kind, options, same_owner in views:
        assert (kind, same_owner) == ("v", True), name
        assert set(options) == {"security_invoker=false", "security_barrier=true"}, name
    schemas = conn.execute(
        "select nspname from pg_namespace"
        " where has_schema_privilege('memchat_analyst', oid, 'usage, create')"
        "   and nspname not in ('pg_catalog', 'information_schema')"
        " order by 1"
    ).fetchall()
    # `public`: PostgreSQL's own default usage for PUBLIC; nothing in it is granted.
    assert [n for (n,) in schemas if n != "public"] == ["memchat_analytics"]


def test_the_analyst_reads_every_view_and_every_users_rows(history: History) -> None:
    conn = history.fresh.admin
    for view in VIEWS:
        assert view_rows(conn, view, "memchat_analyst") == view_rows(conn, view, None), view
    (role_row,) = conn.execute(
        "select rolcanlogin, rolsuper, rolbypassrls, rolinherit from pg_roles"
        " where rolname = 'memchat_analyst'"
    ).fetchall()
    assert role_row == (False, False, False, False)


# Everything but reading the views: no table, no key, no write.
REFUSED_TO_THE_ANALYST = {
    "read sessions": "select * from public.chat_sessions",
    "read messages": "select * from public.chat_message_history",
    "read feedback": "select * from memchat.message_feedback",
    "read the pseudonyms' key": "select * from memchat.analytics_key",
    "read the raw turns": "select * from memchat.analytics_turns",
    "rotate the key": "update memchat.analytics_key set secret = default",
    "add a session": "insert into public.chat_sessions (id, user_id, agent_name)"
    " values (gen_random_uuid(), %(a)s, 'default')",
    "rename sessions": "update public.chat_sessions set title = 'x'",
    "inflate counters": "update public.chat_sessions set turn_count = turn_count + 1",
    "delete sessions": "delete from public.chat_sessions",
    "add a message": "insert into public.chat_message_history (session_id, user_id, message)"
    ' select id, user_id, \'{"type": "human", "data": {}}\' from public.chat_sessions',
    "edit messages": "update public.chat_message_history set message = message",
    "delete messages": "delete from public.chat_message_history",
    "add feedback": "insert into memchat.message_feedback"
    " (message_id, user_id, session_id, agent_name, rating)"
    " select h.id, h.user_id, h.session_id, 'x', 1 from public.chat_message_history h",
    "change ratings": "update memchat.message_feedback set rating = 1",
    "delete feedback": "delete from memchat.message_feedback",
    "truncate messages": "truncate public.chat_message_history cascade",
    "read notes": "select * from public.agent_long_term_memory",
    "read embeddings": "select * from memchat.message_embeddings",
    "read active pointers": "select * from public.user_agent_active_sessions",
    "record a turn": store.turns.RECORD_TURN.replace("%s", "null"),
}


@pytest.mark.parametrize("statement", list(REFUSED_TO_THE_ANALYST))
def test_the_analyst_may_do_nothing_else(history: History, statement: str) -> None:
    conn = history.fresh.admin
    before = [view_rows(conn, view, None) for view in VIEWS]
    with conn.transaction():
        conn.execute("set local role memchat_analyst")
        assert refused(conn, REFUSED_TO_THE_ANALYST[statement], {"a": history.a.user_id})
    assert [view_rows(conn, view, None) for view in VIEWS] == before


# ---------------------------------------------------------------- caveats


async def test_a_cleared_session_leaves_the_turn_views_but_keeps_its_counters(
    admin: psycopg.Connection, admin_url: str, role_password: str | None
) -> None:
    """Clearing deletes the messages (and, by the foreign key, their ratings):
    turn-level views and feedback lose them; the session keeps its counters,
    so session_lengths still counts it."""
    with fresh_database(admin, admin_url, role_password) as fresh:
        user = UserFactory(fresh.admin).create()
        db = Database(fresh.api_url, max_connections=1)
        try:
            rec = Recorder(db, fresh.admin)
            now = dt.datetime.now(dt.UTC)
            reply = answer("x", model="gpt-c", prompt=7, completion=3, latency_ms=10)
            session_id, answers = await rec.session(
                user, "support", [(now, [reply]), (now, [reply])], started=now
            )
            await rec.rate(user, answers[0], 1, now)
            assert len(view_rows(fresh.admin, "turns", None)) == 2
            assert len(view_rows(fresh.admin, "daily_feedback", None)) == 1

            cleared = await store.clear_session(
                db, user, session_id=session_id, agent_name="support", ttl=dt.timedelta(hours=1)
            )
            assert cleared.deleted_messages == 4
        finally:
            await db.close()
        for view in ("turns", "daily_active_users", "daily_usage", "daily_feedback"):
            assert view_rows(fresh.admin, view, None) == [], view
        assert [
            (r["bucket"], r["sessions"], float(r["avg_turns"]))
            for r in view_rows(fresh.admin, "session_lengths", None)
        ] == [("2-5 turns", 1, 2.0)]
        counters = fresh.admin.execute(
            "select status, turn_count, prompt_tokens, completion_tokens"
            " from public.chat_sessions where id = %s",
            (session_id,),
        ).fetchone()
        assert counters == ("cleared", 2, 14, 6)
