"""memchat through a real transaction-mode pooler (pgbouncer), as on Supabase.

With one or two server connections behind many clients, every transaction
of every user may land on the same server connection: the per-request role
and claims must never leak from one to the next, and nothing may rely on a
server-side prepared statement or on session state.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from memchat import store
from memchat.errors import DatabasePermissionDenied
from memchat.store.db import Database
from memchat.usecases.cleanup import Cleanup
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat
from tests.utils.fake_openai import FakeOpenAI, tool_call
from tests.utils.pgbouncer import Pooler
from tests.utils.store_data import exchange, record, turn
from tests.utils.users import UserFactory

WHO_AM_I = (
    "select pg_backend_pid(), current_user, auth.uid(),"
    " current_setting('request.jwt.claims', true)::jsonb ->> 'sub',"
    " current_setting('request.jwt.claim.sub', true),"
    " (select coalesce(array_agg(distinct s.user_id), '{}') from public.chat_sessions s),"
    " (select coalesce(array_agg(distinct h.user_id), '{}') from public.chat_message_history h)"
)


async def who_am_i(db: Database, caller: store.Caller) -> tuple[Any, ...]:
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(WHO_AM_I)
    row = await cur.fetchone()
    assert row is not None
    return tuple(row)


async def test_interleaved_requests_of_two_users_over_one_server_connection(
    single_db: Database, users: UserFactory
) -> None:
    alice, bob = users.create(), users.create()
    sessions = {}
    for caller, name in ((alice, "alice"), (bob, "bob")):
        info = await record(single_db, caller, exchange(f"{name} q", f"{name} a"), notes=name)
        sessions[caller.user_id] = info.id
    seen_pids: set[int] = set()

    async def one_round(caller: store.Caller, name: str, i: int) -> None:
        own = sessions[caller.user_id]
        ctx = await store.load_context(
            single_db, caller, session_id=None, agent_name="default", window=50
        )
        assert ctx.session is not None and ctx.session.id == own
        assert {m["data"]["content"].split()[0] for m in ctx.messages} == {name}
        assert ctx.notes is not None and ctx.notes.notes.startswith(name)
        pid, role, uid, sub, legacy_sub, session_owners, message_owners = await who_am_i(
            single_db, caller
        )
        seen_pids.add(pid)
        assert (role, uid, sub, legacy_sub) == (
            "memchat_user",
            caller.user_id,
            str(caller.user_id),
            str(caller.user_id),
        )
        assert session_owners == message_owners == [caller.user_id]
        # Every message names its user: whichever rounds of the same user ran
        # before this one, what it loads is that user's and no one else's.
        await store.record_turn(
            single_db, caller, turn(own, exchange(f"{name} q{i}", f"{name} ok"))
        )
        listed = await store.list_sessions(single_db, caller, agent_name=None, limit=10)
        assert [s.id for s in listed] == [own]

    await asyncio.gather(
        *[one_round(alice, "alice", i) if i % 2 else one_round(bob, "bob", i) for i in range(40)]
    )
    assert len(seen_pids) == 1  # all of it on the one server connection


async def test_a_statement_without_the_switch_is_refused_through_the_pooler(
    single_db: Database, users: UserFactory
) -> None:
    """A user's request just ran on the server connection; the next client's
    statement without the switch must not inherit its role or claims."""
    alice = users.create()
    await record(single_db, alice, exchange("q", "a"))
    with pytest.raises(DatabasePermissionDenied):
        async with single_db.pipeline(None) as conn:
            await conn.execute("select count(*) from public.chat_sessions")


@pytest.fixture
async def pooled_api(pooler: Pooler, database_url: str, fake_openai: FakeOpenAI) -> Any:
    client = ApiClient(make_settings(pooler.url(database_url), fake_openai.url))
    yield client
    await client.aclose()


async def a_users_whole_flow(api: ApiClient, name: str, model: FakeOpenAI) -> dict[str, Any]:
    """Every endpoint a user touches, in order, as that user."""
    user_id, auth = api.new_user()
    first = await chat(api, auth, f"{name}: hello", client_message_id=f"{name}-1")
    sid = first["session_id"]
    again = await chat(api, auth, f"{name}: hello", client_message_id=f"{name}-1", session_id=sid)
    assert again["answer"] == first["answer"]
    for i in range(3):
        await chat(api, auth, f"{name}: turn {i}", session_id=sid)
    listed = (await api.get("/sessions", headers=auth)).json()["sessions"]
    assert [s["id"] for s in listed] == [sid]
    active = await api.get("/sessions/active", headers=auth)
    assert active.status_code == 200 and active.json()["id"] == sid
    put = await api.put("/memory", json={"notes": f"{name} likes tea"}, headers=auth)
    assert put.status_code == 200, put.text
    memory = (await api.get("/memory", headers=auth)).json()
    assert memory["notes"] == f"{name} likes tea"
    export = await api.get(f"/chat/export/{sid}", headers=auth)
    assert export.status_code == 200, export.text
    contents = [m["content"] for m in export.json()["messages"] if m["role"] == "user"]
    assert contents and all(c.startswith(f"{name}:") for c in contents)
    cleared = await api.post("/chat/clear-session", json={"session_id": sid}, headers=auth)
    assert cleared.status_code == 200, cleared.text
    everything = await api.get("/export?format=ndjson", headers=auth)
    assert everything.status_code == 200, everything.text
    assert (
        name in everything.text and ("bob" if name == "alice" else "alice") not in everything.text
    )
    gone = await api.delete("/memory", headers=auth)
    assert gone.status_code == 200 and gone.json()["deleted"] == 1, gone.text
    erased = await api.delete("/me", headers=auth)
    assert erased.status_code == 200, erased.text
    return {"user_id": user_id, "session_id": sid}


async def test_the_whole_api_flow_of_two_users_at_once_through_the_pooler(
    pooled_api: ApiClient, model: FakeOpenAI, pooler: Pooler, admin: psycopg.Connection
) -> None:
    flows = await asyncio.gather(
        *[a_users_whole_flow(pooled_api, name, model) for name in ("alice", "bob") * 3]
    )
    assert len({f["user_id"] for f in flows}) == 6
    log = pooler.log().lower()
    assert "prepared statement" not in log and "error" not in log.replace("errors=0", "")


async def test_memory_tool_turns_through_the_pooler(
    pooled_api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = pooled_api.new_user()
    model.script(tool_call("append", content="- likes tea"), {"content": "noted"})
    body = await chat(pooled_api, auth, "remember I like tea")
    assert body["memory"]["long_term_notes_updated"] is True
    notes = (await pooled_api.get("/memory", headers=auth)).json()
    assert notes["notes"] == "- likes tea" and notes["version"] == 1


def test_the_cleanup_through_the_pooler(
    pooler: Pooler, cleanup_url: str, admin: psycopg.Connection, users: UserFactory
) -> None:
    owner = users.create()
    doomed = uuid.uuid4()
    admin.execute(
        "insert into public.chat_sessions (id, user_id, expires_at)"
        " values (%s, %s, now() - interval '1 hour')",
        (doomed, owner.user_id),
    )
    result = Cleanup(pooler.url(cleanup_url), batch_size=1, pause_factor=1.0).run()
    assert result.finished and result.deleted_sessions >= 1
    assert (
        admin.execute("select 1 from public.chat_sessions where id = %s", (doomed,)).fetchone()
        is None
    )
