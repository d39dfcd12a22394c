"""load_context: the window, expiry, the active pointer, replays, and scale.

The scale check runs the window query exactly as the store issues it over a
10,000-message session and reads the executed plan: the window must read N
index entries, not the session.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.types.json import Jsonb

from memchat import messages, store
from tests.utils.store_data import (
    become,
    contents,
    exchange,
    load_context_args,
    record,
    session_row,
    stored_messages,
    tool_exchange,
    turn,
)
from tests.utils.users import UserFactory


async def load(db, caller, session_id=None, window=10, **options) -> store.Context:
    return await store.load_context(
        db, caller, session_id=session_id, agent_name="default", window=window, **options
    )


def texts(ctx: store.Context) -> list[str]:
    return [m["data"]["content"] for m in ctx.messages]


# ------------------------------------------------------------- the window


@pytest.mark.parametrize("window", [1, 10, 50])
async def test_window_is_the_last_n_messages_oldest_first(db, users, window):
    alice = users.create()
    history = [messages.human(f"m{i}") if i % 2 else messages.ai(f"m{i}") for i in range(1, 61)]
    info = await record(db, alice, history)

    ctx = await load(db, alice, info.id, window=window)

    assert texts(ctx) == [f"m{i}" for i in range(61 - window, 61)]
    assert ctx.messages == history[-window:]
    assert ctx.session is not None and ctx.session.message_count == 60


async def test_window_skips_tool_messages_and_tool_calls(db, admin, users):
    alice = users.create()
    info = await record(db, alice, tool_exchange("q1", "a1", call_id="c1"))
    await record(db, alice, tool_exchange("q2", "a2", call_id="c2"), session_id=info.id)

    everything = await load(db, alice, info.id, window=50)
    last_two = await load(db, alice, info.id, window=2)

    assert len(stored_messages(admin, info.id)) == 8
    assert [(m["type"], m["data"]["content"]) for m in everything.messages] == [
        ("human", "q1"),
        ("ai", "a1"),
        ("human", "q2"),
        ("ai", "a2"),
    ]
    # Tool traffic does not take window slots either.
    assert texts(last_two) == ["q2", "a2"]


# ---------------------------------------------------------------- expiry


async def test_expired_session_starts_empty_and_the_next_turn_resets_it(db, admin, users):
    alice = users.create()
    info = await record(db, alice, exchange("old question", "old answer"))
    await record(db, alice, exchange("older question", "older answer"), session_id=info.id)
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute' where id = %s",
        (info.id,),
    )

    ctx = await load(db, alice, info.id)
    assert ctx.session is not None and ctx.session.id == info.id
    assert ctx.session.expires_at < datetime.now(UTC)
    assert ctx.messages == []

    renewed = await store.record_turn(db, alice, turn(info.id, exchange("new", "fresh")))

    assert contents(admin, info.id) == [("human", "new"), ("ai", "fresh")]
    assert renewed.message_count == 2
    assert session_row(admin, info.id)["message_count"] == 2
    after = await load(db, alice, info.id)
    assert after.session is not None and after.session.expires_at > datetime.now(UTC)
    assert texts(after) == ["new", "fresh"]


# -------------------------------------------------- the active pointer


async def test_active_session_is_followed_without_a_session_id(db, users):
    alice = users.create()
    info = await record(db, alice, exchange("hello", "hi"))

    ctx = await load(db, alice)

    assert ctx.session is not None and ctx.session.id == info.id
    assert texts(ctx) == ["hello", "hi"]


@pytest.mark.parametrize(
    "kill",
    [
        pytest.param(
            "update public.chat_sessions set status = 'cleared' where id = %s", id="cleared"
        ),
        pytest.param(
            "update public.chat_sessions set expires_at = now() - interval '1 minute'"
            " where id = %s",
            id="expired",
        ),
    ],
)
async def test_active_pointer_to_a_dead_session_is_ignored(db, admin, users, kill):
    alice = users.create()
    info = await record(db, alice, exchange("hello", "hi"))
    admin.execute(kill, (info.id,))

    ctx = await load(db, alice)

    assert ctx.session is None
    assert ctx.messages == []


async def test_active_pointer_is_per_agent(db, users):
    alice = users.create()
    await record(db, alice, exchange("hello", "hi"), agent_name="other")

    ctx = await load(db, alice)

    assert ctx.session is None


# ----------------------------------------------------------------- replay


async def test_retry_with_the_same_client_message_id_replays_the_final_answer(db, users):
    alice = users.create()
    sent = tool_exchange("remember tea", "noted: tea")
    info = await record(db, alice, sent, client_message_id="cm-1")
    await record(db, alice, exchange("later", "later answer"), session_id=info.id)

    by_id = await load(db, alice, info.id, client_message_id="cm-1", message="remember tea")
    by_pointer = await load(db, alice, client_message_id="cm-1", message="remember tea")
    other_id = await load(db, alice, info.id, client_message_id="cm-2", message="new")
    no_id = await load(db, alice, info.id)

    # The ids are those the turn stored: its user message and final answer.
    replay = store.Replay(sent[-1], info.message_ids[-1], info.message_ids[0])
    assert len(info.message_ids) == len(sent)
    assert by_id.replay == replay
    assert by_pointer.replay == replay
    assert other_id.replay is None
    assert no_id.replay is None


async def test_client_message_id_is_scoped_to_its_session(db, users):
    alice = users.create()
    first = await record(db, alice, exchange("q", "a"), client_message_id="cm-1")
    second = await record(db, alice, exchange("q", "b"))

    again = await load(db, alice, first.id, client_message_id="cm-1", message="q")
    elsewhere = await load(db, alice, second.id, client_message_id="cm-1", message="q")
    assert again.replay is not None
    assert elsewhere.replay is None


# ------------------------------------------------------------------ scale

BIG_SESSION = 10_000


@pytest.fixture(scope="module")
def big_session(
    admin: psycopg.Connection, users: UserFactory
) -> Iterator[tuple[store.Caller, uuid.UUID]]:
    """A session of 10,000 plain messages m1..m10000, plus other users' sessions."""
    alice = users.create()
    sid = uuid.uuid4()
    with admin.transaction():
        admin.execute(
            "insert into public.chat_sessions (id, user_id, message_count) values (%s, %s, %s)",
            (sid, alice.user_id, BIG_SESSION),
        )
        admin.execute(
            "insert into public.chat_message_history (session_id, user_id, message)"
            " select %(sid)s, %(user)s, jsonb_build_object("
            "   'type', case when g %% 2 = 1 then 'human' else 'ai' end,"
            "   'data', %(data)s::jsonb || jsonb_build_object("
            "     'content', 'm' || g, 'type', case when g %% 2 = 1 then 'human' else 'ai' end))"
            "   from generate_series(1, %(n)s) g",
            {
                "sid": sid,
                "user": alice.user_id,
                "n": BIG_SESSION,
                "data": Jsonb(messages.human("")["data"]),
            },
        )
    # Autovacuum keeps statistics current in production; analyze now so the
    # plan does not depend on whether it has run yet.
    admin.execute("analyze public.chat_message_history")
    yield alice, sid


# What the current transaction read from chat_message_history, from the
# per-transaction statistics (they count reads inside SQL functions too).
_XACT_READS = """
select coalesce(seq_scan, 0), coalesce(seq_tup_read, 0),
       coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0)
  from pg_stat_xact_user_tables
 where schemaname = 'public' and relname = 'chat_message_history'
"""


@pytest.mark.slow
@pytest.mark.plain_only  # counts the reads this server made; on Citus a worker makes them
@pytest.mark.parametrize("window", [10, 50])
async def test_window_reads_n_rows_of_a_huge_session(db, database_url, big_session, window):
    alice, sid = big_session
    ctx = await load(db, alice, sid, window=window)
    assert texts(ctx) == [f"m{i}" for i in range(BIG_SESSION - window + 1, BIG_SESSION + 1)]

    # Run the same call again and count what it read from the message table.
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        become(conn, alice.claims)
        ((result,),) = conn.execute(
            store.turns.LOAD_CONTEXT,
            load_context_args(alice.user_id, sid, window),
        ).fetchall()
        conn.execute("reset role")
        seq_scans, seq_rows, _, rows_fetched = conn.execute(_XACT_READS).fetchone()
    assert len(result["messages"]) == window
    assert (seq_scans, seq_rows) == (0, 0)
    assert rows_fetched == window
