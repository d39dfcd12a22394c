"""Interoperability with the real langchain_postgres.PostgresChatMessageHistory.

LangChain apps must read what memchat writes, and memchat must read what
LangChain writes into a memchat session (LangChain leaves user_id out; the
trigger fills it in).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_postgres import PostgresChatMessageHistory

from memchat import store
from tests.utils.store_data import exchange, record, tool_exchange

TABLE = "chat_message_history"


@pytest.fixture
def lc_conn(admin_url: str) -> Iterator[psycopg.Connection]:
    """A plain (non-autocommit) connection, as a LangChain app would pass in
    (the owner's here: a LangChain back end acting for users switches roles)."""
    with psycopg.connect(admin_url) as conn:
        yield conn


def history(conn: psycopg.Connection, session_id: uuid.UUID) -> PostgresChatMessageHistory:
    return PostgresChatMessageHistory(TABLE, str(session_id), sync_connection=conn)


async def test_langchain_reads_a_turn_memchat_recorded(db, users, lc_conn):
    alice = users.create()
    info = await record(db, alice, tool_exchange("remember: I like tea", "Noted, tea.", "c1"))

    got = history(lc_conn, info.id).get_messages()

    assert [type(m) for m in got] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert [m.content for m in got] == ["remember: I like tea", "", "saved", "Noted, tea."]
    assert got[1].tool_calls == [
        {"name": "manage_long_term_memory", "args": {}, "id": "c1", "type": "tool_call"}
    ]
    assert got[2].tool_call_id == "c1"
    assert got[2].name == "manage_long_term_memory"
    assert got[3].tool_calls == []


async def test_memchat_reads_messages_langchain_added(db, admin, users, lc_conn):
    alice = users.create()
    info = await record(db, alice, exchange("hello", "hi"))

    history(lc_conn, info.id).add_messages(
        [HumanMessage(content="from langchain"), AIMessage(content="answered by langchain")]
    )

    owners = admin.execute(
        "select user_id from public.chat_message_history where session_id = %s order by id",
        (info.id,),
    ).fetchall()
    assert owners == [(alice.user_id,)] * 4
    ctx = await store.load_context(db, alice, session_id=info.id, agent_name="default", window=10)
    assert [(m["type"], m["data"]["content"]) for m in ctx.messages] == [
        ("human", "hello"),
        ("ai", "hi"),
        ("human", "from langchain"),
        ("ai", "answered by langchain"),
    ]


def act_as_for_the_whole_connection(conn: psycopg.Connection, caller: store.Caller) -> None:
    """What a LangChain back end acting for one user does: the API's per-request
    role (the Data API's `authenticated` may not write messages) and the
    user's claims, for the whole connection."""
    conn.execute(
        "select set_config('role', 'memchat_user', false),"
        " set_config('request.jwt.claims', %s, false)",
        (json.dumps(caller.claims),),
    )
    conn.commit()


async def test_langchain_under_rls_writes_only_into_the_users_own_sessions(
    db, admin, users, lc_conn
):
    alice, bob = users.create(), users.create()
    own = await record(db, alice, exchange("hello", "hi"))
    foreign = await record(db, bob, exchange("bob here", "hi bob"))
    act_as_for_the_whole_connection(lc_conn, alice)

    history(lc_conn, own.id).add_messages([HumanMessage(content="as alice")])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        history(lc_conn, foreign.id).add_messages([HumanMessage(content="into bob's")])
    lc_conn.rollback()

    assert history(lc_conn, foreign.id).get_messages() == []
    assert [m.content for m in history(lc_conn, own.id).get_messages()] == [
        "hello",
        "hi",
        "as alice",
    ]
    bob_rows = admin.execute(
        "select count(*) from public.chat_message_history where session_id = %s",
        (foreign.id,),
    ).fetchone()
    assert bob_rows == (2,)
