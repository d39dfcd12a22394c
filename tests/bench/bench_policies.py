"""Benchmark: what the form of the row-level-security policies costs on plain
PostgreSQL.

memchat's policies compare `user_id` with `(select auth.uid())`, Supabase's
recommended form: the subquery becomes an InitPlan, evaluated once per
statement. Citus refuses subqueries in the policies of a distributed table
("cannot create policy"), while `user_id = auth.uid()` (a stable SQL
function, inlined) is accepted there; on plain PostgreSQL it is an index
condition as well, evaluated once per index scan, but once per row where a
policy is checked row by row. This script times a request's statements under
each form, as the API runs them (`memchat_user` with a caller's claims, one
transaction per statement), on one database whose policies on
`public.chat_sessions` and `public.chat_message_history` are replaced by
each form in turn:

- window: the session's last 20 messages (load_context's read);
- sessions: the caller's latest 20 sessions (GET /sessions);
- history: every message of the caller, counted (an export's scan);
- insert: one message stored in the caller's session (the insert policy's
  check, with its EXISTS on the session).

    python tests/bench/bench_policies.py                  # 100 users x 2,000 messages
    python tests/bench/bench_policies.py --users 20 --messages 500 --iterations 100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

import psycopg
from psycopg import sql

from tests.bench import _common as common

# The caller's id, as each form reads it.
FORMS = {
    "(select auth.uid())": "(select auth.uid())",
    "auth.uid()": "auth.uid()",
}
_POLICIES = sql.SQL("""
drop policy if exists chat_sessions_select on public.chat_sessions;
create policy chat_sessions_select on public.chat_sessions
  for select to authenticated using (user_id = {uid});
drop policy if exists messages_select on public.chat_message_history;
create policy messages_select on public.chat_message_history
  for select to authenticated using (user_id = {uid});
drop policy if exists messages_insert on public.chat_message_history;
create policy messages_insert on public.chat_message_history
  for insert to memchat_user with check (
    user_id = {uid}
    and exists (select 1 from public.chat_sessions s
                 where s.id = session_id and s.user_id = {uid}));
""")
_FILL_SESSIONS = """
insert into public.chat_sessions (id, user_id, agent_name)
select gen_random_uuid(), u.id, 'default' from auth.users u, generate_series(1, %(sessions)s)
"""
_FILL_MESSAGES = """
insert into public.chat_message_history (session_id, user_id, message)
select s.id, s.user_id,
       jsonb_build_object('type', case when i %% 2 = 0 then 'human' else 'ai' end,
                          'data', jsonb_build_object('content', 'message number ' || i))
  from public.chat_sessions s, generate_series(1, %(per_session)s) i
"""
STATEMENTS = {
    "window": (
        "select id, message from public.chat_message_history"
        " where session_id = %(session)s order by id desc limit 20"
    ),
    "sessions": "select id from public.chat_sessions order by created_at desc, id limit 20",
    "history": "select count(*) from public.chat_message_history",
    "insert": (
        "insert into public.chat_message_history (session_id, user_id, message)"
        ' values (%(session)s, %(user)s, \'{"type": "human", "data": {"content": "hi"}}\')'
    ),
}


def timed(conn: psycopg.Connection[Any], claims: dict[str, Any], query: str, params: Any) -> float:
    from tests.utils.store_data import become

    with conn.transaction():
        become(conn, claims)
        with common.Timer() as timer:
            conn.execute(query, params)
    return timer.ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--messages", type=int, default=2_000, help="per user")
    parser.add_argument("--sessions", type=int, default=10, help="per user")
    parser.add_argument("--iterations", type=int, default=300)
    args = parser.parse_args()

    from tests.utils.users import claims_for

    with common.database() as target:
        admin = common.admin_connection(target.url)
        load_at_start = common.load_average()
        callers = [common.create_user(admin) for _ in range(args.users)]
        admin.execute(_FILL_SESSIONS, {"sessions": args.sessions})
        admin.execute(_FILL_MESSAGES, {"per_session": max(args.messages // args.sessions, 1)})
        common.vacuum_analyze(admin, "public.chat_sessions", "public.chat_message_history")
        caller = callers[len(callers) // 2]
        (session,) = admin.execute(
            "select id from public.chat_sessions where user_id = %s limit 1", (caller.user_id,)
        ).fetchone() or (None,)
        claims = claims_for(caller.user_id)
        params = {"session": session, "user": caller.user_id}
        conn = psycopg.connect(target.url, prepare_threshold=None)
        medians: dict[str, dict[str, float]] = {}
        rows = []
        for form, uid in FORMS.items():
            admin.execute(_POLICIES.format(uid=sql.SQL(uid)))
            medians[form] = {}
            for name, query in STATEMENTS.items():
                for _ in range(10):  # warm the caches
                    timed(conn, claims, query, params)
                stats = common.summarize(
                    [timed(conn, claims, query, params) for _ in range(args.iterations)]
                )
                medians[form][name] = stats.median
                first = medians[next(iter(FORMS))][name]
                rows.append(
                    [
                        form,
                        name,
                        f"{stats.median:.3f}",
                        f"{stats.p95:.3f}",
                        f"{stats.median / first:.2f}x",
                    ]
                )
        conn.close()
        print(common.machine_report(admin, target, load_at_start=load_at_start))
        print(
            f"{args.users:,} users x {args.messages:,} messages in {args.sessions} sessions;"
            f" {args.iterations} timings of each statement per form (a transaction each)"
        )
        print(
            common.format_table(
                ["policy's caller", "statement", "median ms", "p95 ms", "against the first"],
                rows,
            )
        )


if __name__ == "__main__":
    main()
