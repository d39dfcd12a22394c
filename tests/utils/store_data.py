"""Arranging and inspecting store data in tests.

Turns are written through the store (the code under test); rows are read
back with the superuser connection, which bypasses row-level security, so
checks see what is really stored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from memchat import messages, store
from memchat.store.db import Database, claims_statements

TTL = timedelta(hours=1)

# The four user-owned tables, each with an order that makes snapshots stable.
USER_TABLES = {
    "chat_sessions": "id",
    "user_agent_active_sessions": "agent_name",
    "chat_message_history": "id",
    "agent_long_term_memory": "agent_name",
}


def exchange(question: str, answer: str) -> list[dict[str, Any]]:
    """A plain human + ai pair."""
    return [messages.human(question), messages.ai(answer)]


def tool_exchange(question: str, answer: str, call_id: str = "c1") -> list[dict[str, Any]]:
    """human, ai asking for a tool, the tool result, the final ai answer."""
    return [
        messages.human(question),
        messages.ai(
            "",
            tool_calls=[{"id": call_id, "name": "manage_long_term_memory", "args": {}}],
        ),
        messages.tool("saved", tool_call_id=call_id, name="manage_long_term_memory"),
        messages.ai(answer),
    ]


def turn(
    session_id: uuid.UUID,
    msgs: list[dict[str, Any]],
    *,
    agent_name: str = "default",
    title: str | None = None,
    client_message_id: str | None = None,
    notes: str | None = None,
    notes_version: int = 0,
) -> store.Turn:
    return store.Turn(
        session_id=session_id,
        agent_name=agent_name,
        messages=msgs,
        title=title,
        ttl=TTL,
        client_message_id=client_message_id,
        notes=notes,
        notes_version=notes_version,
    )


def record_turn_args(
    user_id: uuid.UUID | None, session_id: uuid.UUID, msgs: list[dict[str, Any]]
) -> tuple[Any, ...]:
    """memchat.record_turn's arguments (store.turns.RECORD_TURN) for a turn
    of `msgs` in an existing session: no title, notes, embedding or key."""
    return (
        user_id,
        session_id,
        "default",
        None,
        Jsonb(msgs),
        TTL,
        None,
        None,
        0,
        False,
        None,
        None,
        None,
    )


def load_context_args(
    user_id: uuid.UUID | None, session_id: uuid.UUID, window: int = 10
) -> tuple[Any, ...]:
    """memchat.load_context's arguments (store.turns.LOAD_CONTEXT): the
    session's window and notes, no key, no throttle, no summary."""
    return (user_id, session_id, "default", window, True, None, None, 0, 1, 0, 0)


async def record(
    db: Database,
    caller: store.Caller,
    msgs: list[dict[str, Any]],
    *,
    session_id: uuid.UUID | None = None,
    **options: Any,
) -> store.SessionInfo:
    """Record one turn (in a new session unless `session_id` is given)."""
    return await store.record_turn(db, caller, turn(session_id or uuid.uuid4(), msgs, **options))


def stored_messages(admin: psycopg.Connection, session_id: uuid.UUID) -> list[dict[str, Any]]:
    """A session's stored messages, in order."""
    rows = admin.execute(
        "select message from public.chat_message_history where session_id = %s order by id",
        (session_id,),
    ).fetchall()
    return [r[0] for r in rows]


def message_id_of(admin: psycopg.Connection, user_id: uuid.UUID, text: str) -> int:
    """The id of the user's stored message with this content."""
    row = admin.execute(
        "select id from public.chat_message_history"
        " where user_id = %s and message->'data'->>'content' = %s",
        (user_id, text),
    ).fetchone()
    assert row is not None, text
    return int(row[0])


def contents(admin: psycopg.Connection, session_id: uuid.UUID) -> list[tuple[str, str]]:
    """(type, content) of a session's stored messages, in order."""
    return [(m["type"], m["data"]["content"]) for m in stored_messages(admin, session_id)]


def session_row(admin: psycopg.Connection, session_id: uuid.UUID) -> dict[str, Any] | None:
    row = admin.execute(
        "select to_jsonb(s) from public.chat_sessions s where s.id = %s", (session_id,)
    ).fetchone()
    return row[0] if row else None


def snapshot(admin: psycopg.Connection, user_id: uuid.UUID) -> dict[str, list[dict[str, Any]]]:
    """Every row a user owns, per table, as JSON."""
    result = {}
    for table, order in USER_TABLES.items():
        query = sql.SQL(
            "select to_jsonb(t) from public.{table} t where t.user_id = %s order by t.{order}"
        ).format(table=sql.Identifier(table), order=sql.Identifier(order))
        result[table] = [r[0] for r in admin.execute(query, (user_id,)).fetchall()]
    return result


def become(conn: psycopg.Connection, claims: Mapping[str, Any]) -> None:
    """Makes `conn`'s open transaction a user request's, as the API does
    (memchat.store.db.claims_statements). On Citus, whatever the login (the
    owner's too), the claims go to the workers as the API's login sends them
    (`memchat db distribute` gives it citus.propagate_set_commands)."""
    set_local_on_citus(conn, "citus.propagate_set_commands", "local")
    for query, params in claims_statements(claims):
        conn.execute(query, params)


def set_local_on_citus(conn: psycopg.Connection, name: str, value: str) -> None:
    """Citus's setting `name` for the open transaction; elsewhere the
    setting does not exist, and nothing is set."""
    conn.execute(
        "select set_config(%(name)s, %(value)s, true)"
        " where current_setting(%(name)s, true) is not null",
        {"name": name, "value": value},
    )


@contextmanager
def acting_as(
    conn: psycopg.Connection, claims: Mapping[str, Any] | None
) -> Iterator[psycopg.Connection]:
    """A transaction on `conn` that runs as the API runs a request.

    With claims: `memchat_user` with those claims (`become`).
    With None: `anon` with no claims (needs a connection that may become
    anon: the owner's, standing in for PostgREST's `authenticator`). The
    transaction commits at the end, so anything a statement managed to
    change really stays changed.
    """
    with conn.transaction():
        if claims is None:
            conn.execute("select set_config('role', 'anon', true)")
        else:
            become(conn, claims)
        yield conn


@contextmanager
def through_data_api(
    conn: psycopg.Connection, claims: Mapping[str, Any]
) -> Iterator[psycopg.Connection]:
    """A transaction as Supabase's Data API (PostgREST) runs a web app's
    request: role `authenticated` with the user's claims. `conn` must be
    allowed to become `authenticated` (the owner's connection here)."""
    with conn.transaction():
        conn.execute(
            "select set_config('role', 'authenticated', true),"
            " set_config('request.jwt.claims', %s, true)",
            (json.dumps(claims),),
        )
        yield conn


def key_partition(admin: psycopg.Connection, user_id: uuid.UUID) -> tuple[str, float, int]:
    """The user's partition of memchat.message_embeddings: its name, the rows
    its statistics count (-1: never analysed) and the rows it holds."""
    row = admin.execute(
        "select c.oid::regclass::text, c.reltuples from pg_class c"
        " where c.oid = memchat.key_partition_of('message_embeddings', %s)",
        (user_id,),
    ).fetchone()
    assert row is not None
    name, counted = str(row[0]), float(row[1])
    (present,) = admin.execute(
        sql.SQL("select count(*) from {}").format(sql.Identifier(*name.split(".")))
    ).fetchone() or (None,)
    return name, counted, int(present)
