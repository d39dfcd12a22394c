"""A history for the operator's analytics, in a database of its own.

The analytics views (memchat_analytics) add up every user's rows, so tests
that check their exact totals run on a fresh database (`fresh_database`,
created and migrated on the test server, dropped afterwards) and write a
scripted history into it (`Recorder`, with answers as the chat turn stores
them).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memchat import devdb, messages, store
from memchat.store.db import Database
from memchat.store.migrations import BOOTSTRAP_SQL, migrate
from tests.utils.store_data import record


@dataclass(frozen=True)
class Fresh:
    """A database of its own on the test server, migrated."""

    admin_url: str  # the owner's (superuser's)
    api_url: str  # memchat_api's, as the API logs in
    admin: psycopg.Connection

    def url_as(self, role: str, password: str | None) -> str:
        return devdb.role_conninfo(self.admin_url, role, password)


def with_dbname(conninfo: str, dbname: str) -> str:
    params = conninfo_to_dict(conninfo)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@contextmanager
def empty_database(admin: psycopg.Connection, admin_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database on the test server (its owner's URL), dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    try:
        yield with_dbname(admin_url, name)
    finally:
        admin.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))


@contextmanager
def fresh_database(
    admin: psycopg.Connection, admin_url: str, role_password: str | None
) -> Iterator[Fresh]:
    """A new database on the test server with the migrations applied (the
    roles are the server's, shared with the main test database); dropped
    afterwards."""
    with (
        empty_database(admin, admin_url, "memchat_analytics") as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        # What Supabase provides (auth.users, auth.uid()), also when the
        # test server is a Supabase one: the new database has none of it.
        conn.execute(BOOTSTRAP_SQL.read_text())
        migrate(url)
        yield Fresh(url, devdb.role_conninfo(url, devdb.API_ROLE, role_password), conn)


# ------------------------------------------------------------- a history


def answer(
    text: str,
    *,
    model: str | None,
    prompt: int,
    completion: int,
    latency_ms: float,
    recalled: int = 0,
    summary_used: bool = False,
) -> dict[str, Any]:
    """A final answer as the chat turn stores it (LangChain's shape, with the
    response_metadata the analytics read)."""
    message = messages.ai(
        text, model=model, usage={"prompt_tokens": prompt, "completion_tokens": completion}
    )
    messages.annotate_answer(
        message, latency_ms=latency_ms, recalled=recalled, summary_used=summary_used
    )
    return message


def tool_round(call_id: str) -> list[dict[str, Any]]:
    """The assistant asking for the memory tool, and the tool's result: not a turn."""
    return [
        messages.ai(
            "",
            tool_calls=[{"id": call_id, "name": "manage_long_term_memory", "args": {}}],
            model="gpt-a",
        ),
        messages.tool("saved", tool_call_id=call_id, name="manage_long_term_memory"),
    ]


def turn(
    when: dt.datetime,
    model: str,
    prompt: int,
    completion: int,
    latency_ms: float,
    *,
    recalled: int = 0,
    summary_used: bool = False,
    after_tool: bool = False,
) -> tuple[dt.datetime, list[dict[str, Any]]]:
    """One turn for Recorder.session: when it was answered, and what the
    model stored after the user's message (a tool round first, if asked)."""
    reply = answer(
        "an answer",
        model=model,
        prompt=prompt,
        completion=completion,
        latency_ms=latency_ms,
        recalled=recalled,
        summary_used=summary_used,
    )
    return when, [*(tool_round(f"call-{uuid.uuid4().hex[:8]}") if after_tool else []), reply]


def at(day: dt.date, hh_mm: str) -> dt.datetime:
    hours, minutes = (int(x) for x in hh_mm.split(":"))
    return dt.datetime.combine(day, dt.time(hours, minutes), tzinfo=dt.UTC)


def utc_today(conn: psycopg.Connection) -> dt.date:
    row = conn.execute("select (now() at time zone 'UTC')::date").fetchone()
    assert row is not None
    today: dt.date = row[0]
    return today


class Recorder:
    """Records turns through the store and dates them as the script says."""

    def __init__(self, db: Database, admin: psycopg.Connection) -> None:
        self.db = db
        self.admin = admin

    async def session(
        self,
        caller: store.Caller,
        agent: str,
        turns: list[tuple[dt.datetime, list[dict[str, Any]]]],
        *,
        started: dt.datetime,
    ) -> tuple[uuid.UUID, list[int]]:
        """A session of `turns` (each: when its answer came, the messages
        after the user's); returns its id and its answers' message ids."""
        session_id = uuid.uuid4()
        answers = []
        for when, reply in turns:
            info = await record(
                self.db,
                caller,
                [messages.human("a question"), *reply],
                session_id=session_id,
                agent_name=agent,
            )
            self.admin.execute(
                "update public.chat_message_history set created_at = %s where id = any(%s)",
                (when, list(info.message_ids)),
            )
            answers.append(info.message_ids[-1])
        self.admin.execute(
            "update public.chat_sessions set created_at = %s, last_active_at = %s where id = %s",
            (started, turns[-1][0], session_id),
        )
        return session_id, answers

    async def rate(
        self,
        caller: store.Caller,
        message_id: int,
        rating: int,
        when: dt.datetime,
        comment: str | None = None,
    ) -> None:
        """The user's rating, as the API stores it (memchat_user, their claims)."""
        assert await store.set_feedback(self.db, caller, message_id, rating, comment)
        self.admin.execute(
            "update memchat.message_feedback set created_at = %s, updated_at = %s"
            " where message_id = %s",
            (when, when, message_id),
        )


def analytics_secret(admin: psycopg.Connection) -> bytes:
    """The pseudonyms' HMAC key (memchat.analytics_key), as the owner reads it."""
    row = admin.execute("select secret from memchat.analytics_key").fetchone()
    assert row is not None
    return bytes(row[0])


def pseudonym(
    admin: psycopg.Connection, user_id: uuid.UUID, session_id: uuid.UUID | None = None
) -> str:
    """What memchat_analytics.turns shows for a user (or one of their
    sessions): HMAC-SHA256 of the id's bytes (the user's, then the
    session's) under the current secret, in hex; computed here with Python's
    hmac, independently of the migration's SQL."""
    message = user_id.bytes + (session_id.bytes if session_id else b"")
    return hmac.new(analytics_secret(admin), message, hashlib.sha256).hexdigest()


@contextmanager
def login_with_own_rights(fresh: Fresh, password: str | None) -> Iterator[str]:
    """A new login holding the analyst's grants itself (usage on the schema,
    select on the views), but not the role: it may not `set role
    memchat_analyst`, and reads the views with its own rights, which are
    the same. Dropped afterwards."""
    probe = f"analytics_probe_{uuid.uuid4().hex[:8]}"
    role = sql.Identifier(probe)
    created = sql.SQL("create role {} login").format(role)
    if password:
        created += sql.SQL(" password {}").format(sql.Literal(password))
    fresh.admin.execute(created)
    try:
        fresh.admin.execute(sql.SQL("grant usage on schema memchat_analytics to {}").format(role))
        fresh.admin.execute(
            sql.SQL("grant select on all tables in schema memchat_analytics to {}").format(role)
        )
        yield probe
    finally:
        fresh.admin.execute(sql.SQL("drop owned by {}").format(role))
        fresh.admin.execute(sql.SQL("drop role {}").format(role))
