"""The operator's analytics role reads no content (security review, finding 3).

Two users write distinctive text everywhere a user's words end up: their
messages, the model's answers, a tool call's arguments and result, session
titles, idempotency keys, long-term notes, a session summary and feedback
comments. Then every relation `memchat_analyst` may select from (table,
view, materialized view or foreign table, in every schema but pg_catalog
and information_schema; the whole table or any column of it; through any
role it may become) is read in full as that role: none of that text, and
none of the users' or sessions' ids or e-mail addresses, may appear, and
the key behind the pseudonyms is not readable. The migration
supabase/schemas/views.sql is what makes it so: before it, the analyst
selected the messages, sessions and feedback tables themselves.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from memchat import messages, store
from memchat.model.embeddings import local_embedding
from memchat.store.db import Database
from tests.store.conftest import refused
from tests.utils.analytics_data import Fresh, answer, pseudonym
from tests.utils.store_data import TTL, record
from tests.utils.users import UserFactory

ANALYST = "memchat_analyst"
# Each marker is unique to this module, so a hit can only be a leak.
TAG = uuid.uuid4().hex[:10]


def marker(where: str, who: str) -> str:
    return f"zq{TAG}-{where}-{who}"


@dataclass(frozen=True)
class Written:
    markers: list[str]  # every piece of text the users wrote (or had written for them)
    secrets: list[str]  # ids and addresses that identify them
    sessions: dict[uuid.UUID, uuid.UUID]  # user id -> their session's id


async def write_everything(fresh: Fresh, who: str, caller: store.Caller, db: Database) -> Written:
    """One user's session with text in every place a user's words are kept."""
    m = {
        w: marker(w, who)
        for w in (
            "question",
            "answer",
            "tool-args",
            "tool-result",
            "title",
            "client-id",
            "notes",
            "summary",
            "comment",
            "later-question",
        )
    }
    session_id = uuid.uuid4()
    dimensions = store.embedding_dimensions(fresh.admin)
    call = f"call-{who}"
    first = await store.record_turn(
        db,
        caller,
        store.Turn(
            session_id=session_id,
            agent_name="support",
            messages=[
                messages.human(f"please remember {m['question']}"),
                messages.ai(
                    "",
                    tool_calls=[
                        {
                            "id": call,
                            "name": "manage_long_term_memory",
                            "args": {"notes": m["tool-args"]},
                        }
                    ],
                    model="gpt-a",
                ),
                messages.tool(m["tool-result"], tool_call_id=call, name="manage_long_term_memory"),
                answer(m["answer"], model="gpt-a", prompt=11, completion=7, latency_ms=42),
            ],
            title=m["title"],
            ttl=TTL,
            client_message_id=m["client-id"],
            notes=m["notes"],
            embedding=store.Embedding("local", local_embedding(m["question"], dimensions)),
            summary_due_after=1,
        ),
    )
    second = await record(
        db,
        caller,
        [
            messages.human(m["later-question"]),
            answer("fine", model="gpt-b", prompt=5, completion=3, latency_ms=9, recalled=1),
        ],
        session_id=session_id,
        agent_name="support",
    )
    # Where the summary worker keeps its summary (its model writes it from
    # the user's messages), set by the owner: the worker's own path is not
    # what this test is about.
    fresh.admin.execute(
        "update public.chat_sessions set summary = %s where id = %s and user_id = %s",
        (m["summary"], session_id, caller.user_id),
    )
    assert await store.set_feedback(db, caller, first.message_ids[-1], -1, m["comment"])
    assert await store.set_feedback(db, caller, second.message_ids[-1], 1, None)

    stored = fresh.admin.execute(
        "select s.title, s.summary, n.notes from public.chat_sessions s"
        " join public.agent_long_term_memory n on n.user_id = s.user_id"
        " where s.id = %s and s.user_id = %s",
        (session_id, caller.user_id),
    ).fetchone()
    assert stored == (m["title"], m["summary"], m["notes"])  # all really stored
    email = caller.claims["email"]
    ids = [str(caller.user_id), caller.user_id.hex, str(session_id), session_id.hex, email]
    return Written(list(m.values()), ids, {caller.user_id: session_id})


@pytest.fixture(scope="module")
async def written(fresh: Fresh) -> AsyncIterator[Written]:
    users = UserFactory(fresh.admin)
    db = Database(fresh.api_url, max_connections=1)
    try:
        found = [
            await write_everything(fresh, who, users.create(f"{marker('email', who)}@x.test"), db)
            for who in ("a", "b")
        ]
    finally:
        await db.close()
    a, b = found
    yield Written(a.markers + b.markers, a.secrets + b.secrets, a.sessions | b.sessions)


def readable_relations(conn: psycopg.Connection) -> list[tuple[str, str, str, list[str] | None]]:
    """(role, schema, name, columns) of every relation a role the analyst may
    become (itself included, and PUBLIC's grants with it) may select from;
    columns None: the whole table, else the columns it may select."""
    return [
        (role, schema, name, None if whole else columns)
        for role, schema, name, whole, columns in conn.execute(
            """
            select r.rolname, n.nspname, c.relname,
                   has_table_privilege(r.oid, c.oid, 'SELECT'),
                   array(select a.attname::text from pg_attribute a
                          where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped
                            and has_column_privilege(r.oid, c.oid, a.attnum, 'SELECT')
                          order by a.attnum)
              from pg_roles r
              cross join pg_class c
              join pg_namespace n on n.oid = c.relnamespace
             where pg_has_role(%s, r.oid, 'MEMBER')
               and c.relkind in ('r', 'p', 'v', 'm', 'f')
               and n.nspname not in ('pg_catalog', 'information_schema')
               -- Without usage on its schema a relation cannot be named at all.
               and has_schema_privilege(r.oid, n.oid, 'USAGE')
               and (has_table_privilege(r.oid, c.oid, 'SELECT')
                    or has_any_column_privilege(r.oid, c.oid, 'SELECT'))
             order by 1, 2, 3
            """,
            (ANALYST,),
        ).fetchall()
    ]


def rows_as(
    conn: psycopg.Connection, role: str, schema: str, name: str, columns: list[str] | None
) -> list[str]:
    """Every row of the relation `role` can read, each as its text form."""
    relation = sql.Identifier(schema, name)
    if columns is None:
        query = sql.SQL("select t::text from {} t").format(relation)
    else:
        query = sql.SQL("select row({})::text from {}").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)), relation
        )
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("set local role {}").format(sql.Identifier(role)))
        return [text for (text,) in conn.execute(query).fetchall()]


def test_nothing_a_user_wrote_is_readable_by_the_analyst(fresh: Fresh, written: Written) -> None:
    """Attacks: the analyst reading any table or view it has (or can get) a
    select right on, whole or per column, for messages, answers, tool calls,
    titles, idempotency keys, notes, summaries, comments, ids or e-mails."""
    conn = fresh.admin
    relations = readable_relations(conn)
    names = {f"{schema}.{name}" for _, schema, name, _ in relations}
    # Not vacuous: the analytics views are among them and hold the users' turns.
    assert {"memchat_analytics.turns", "memchat_analytics.daily_feedback"} <= names
    looked_for = [*written.markers, *written.secrets]
    # bytea columns print as hex: look for the markers' bytes too.
    looked_for += [m.encode().hex() for m in written.markers]
    leaks = []
    read = 0
    for role, schema, name, columns in relations:
        for text in rows_as(conn, role, schema, name, columns):
            read += 1
            lowered = text.lower()
            leaks += [(f"{schema}.{name}", s) for s in looked_for if s.lower() in lowered]
    assert leaks == []
    assert read >= 4  # the two users' turns at least


def test_the_analyst_reads_the_users_numbers_under_pseudonyms(
    fresh: Fresh, written: Written
) -> None:
    """Attack: telling who is who from the turns. The analyst gets a keyed
    hash per user and per session (HMAC-SHA256 under the owner's secret),
    which without the secret it can neither reverse nor recompute."""
    conn = fresh.admin
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("set local role {}").format(sql.Identifier(ANALYST)))
        rows = conn.execute(
            "select user_pseudonym, session_pseudonym, prompt_tokens, completion_tokens, model"
            " from memchat_analytics.turns order by 1, 2, 3"
        ).fetchall()
    expected = sorted(
        (pseudonym(conn, user_id), pseudonym(conn, user_id, session_id), *numbers)
        for user_id, session_id in written.sessions.items()
        for numbers in [(5, 3, "gpt-b"), (11, 7, "gpt-a")]
    )
    assert rows == expected
    assert len({r[0] for r in rows}) == len({r[1] for r in rows}) == 2


@pytest.mark.parametrize(
    "statement",
    [
        "select * from memchat.analytics_key",
        "select secret from memchat.analytics_key",
        "select * from memchat.analytics_turns",
        "select * from public.chat_message_history",
        "select title, summary from public.chat_sessions",
        "select comment from memchat.message_feedback",
        "select notes from public.agent_long_term_memory",
        "select memchat.analytics_key_pad('\\x00'::bytea, 54)",
        "update memchat.analytics_key set secret = default",
    ],
)
def test_the_analyst_cannot_reach_the_key_or_the_tables(
    fresh: Fresh, written: Written, statement: str
) -> None:
    """Attack: reading the pseudonyms' key (to recompute a known user's
    pseudonym), the owner's turn view with raw ids, or the tables directly."""
    conn = fresh.admin
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("set local role {}").format(sql.Identifier(ANALYST)))
        assert refused(conn, statement, {})


def test_the_analyst_has_no_usage_on_the_memchat_schema(fresh: Fresh) -> None:
    """Attack: calling whatever function in `memchat` PUBLIC may execute."""
    (usage,) = fresh.admin.execute(
        "select has_schema_privilege(%s, 'memchat', 'usage')", (ANALYST,)
    ).fetchone() or (None,)
    assert usage is False
