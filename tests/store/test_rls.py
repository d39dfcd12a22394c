"""Row-level security: user B can neither see nor change user A's rows.

Proved at the SQL level, statement by statement, exactly as the API runs a
request (logged in as `memchat_api`, switched to `memchat_user` with B's
claims in one transaction), for every table; then for `anon`; then through
the store's own entry points. What the Data API (`authenticated`) may do is
in test_privileges.py.
"""

from __future__ import annotations

import psycopg
import pytest

from memchat import store
from memchat.errors import SessionNotFound
from tests.store.conftest import World, affected, on, refused
from tests.utils.store_data import (
    TTL,
    USER_TABLES,
    acting_as,
    become,
    exchange,
    record,
    snapshot,
    turn,
)
from tests.utils.users import UserFactory

TABLES = list(USER_TABLES)

# Per table: a harmless change (with constants only, so that without a WHERE
# clause only the UPDATE policy, not the SELECT one, filters the rows), and
# an insert of a row owned by A.
CHANGES = {
    "chat_sessions": "set title = 'changed'",
    "user_agent_active_sessions": "set last_active_at = now() - interval '1 day'",
    "chat_message_history": "set message = %(message)s",
    "agent_long_term_memory": "set notes = 'changed'",
}
OF_A = " where user_id = %(a)s"
TAKEOVER = "update public.{table} set user_id = %(b)s where user_id = %(a)s"
DELETE = "delete from public.{table} where user_id = %(a)s"
INSERTS_AS_A = {
    "chat_sessions": "insert into public.chat_sessions (id, user_id, agent_name)"
    " values (gen_random_uuid(), %(a)s, 'default')",
    "user_agent_active_sessions": "insert into public.user_agent_active_sessions"
    " (user_id, agent_name, active_session_id) values (%(a)s, 'other', %(a_session)s)",
    "chat_message_history": "insert into public.chat_message_history"
    " (session_id, user_id, message) values (%(a_session)s, %(a)s, %(message)s)",
    "agent_long_term_memory": "insert into public.agent_long_term_memory"
    " (user_id, agent_name, notes) values (%(a)s, 'other', 'planted')",
}


# ------------------------------------------------------------ user B, SQL


@pytest.mark.parametrize("table", TABLES)
def test_b_sees_no_row_of_anyone_else(
    conn: psycopg.Connection, world: World, unchanged: None, table: str
) -> None:
    with acting_as(conn, world.b.claims):
        (of_a,) = conn.execute(
            on("select count(*) from public.{table} where user_id = %(a)s", table), world.params
        ).fetchone()
        (not_own,) = conn.execute(
            on("select count(*) from public.{table} where user_id <> %(b)s", table), world.params
        ).fetchone()
    assert (of_a, not_own) == (0, 0)


@pytest.mark.parametrize("table", TABLES)
def test_b_cannot_update_rows_of_a(
    conn: psycopg.Connection, world: World, unchanged: None, table: str
) -> None:
    update = f"update public.{{table}} {CHANGES[table]}"
    with acting_as(conn, world.b.claims):
        assert affected(conn, on(update + OF_A, table), world.params) in (0, "refused")
        assert affected(conn, on(TAKEOVER, table), world.params) in (0, "refused")


@pytest.mark.parametrize("table", TABLES)
def test_b_writes_without_where_reach_only_b_rows(
    conn: psycopg.Connection, world: World, admin: psycopg.Connection, table: str
) -> None:
    """Only the UPDATE and DELETE policies filter these; rolled back either way."""
    (own,) = admin.execute(
        on("select count(*) from public.{table} where user_id = %s", table), (world.b.user_id,)
    ).fetchone()
    update = f"update public.{{table}} {CHANGES[table]}"
    with conn.transaction(force_rollback=True):
        become(conn, world.b.claims)
        assert affected(conn, on(update, table), world.params) in (own, "refused")
        assert affected(conn, on("delete from public.{table}", table), world.params) == own


@pytest.mark.parametrize("table", TABLES)
def test_b_cannot_delete_rows_of_a(
    conn: psycopg.Connection, world: World, unchanged: None, table: str
) -> None:
    with acting_as(conn, world.b.claims):
        deleted = affected(conn, on(DELETE, table), world.params)
    assert deleted == 0


@pytest.mark.parametrize("table", TABLES)
def test_b_cannot_insert_rows_owned_by_a(
    conn: psycopg.Connection, world: World, unchanged: None, table: str
) -> None:
    with acting_as(conn, world.b.claims):
        assert refused(conn, INSERTS_AS_A[table], world.params)


@pytest.mark.parametrize(
    "query",
    [
        pytest.param(
            "insert into public.chat_message_history (session_id, user_id, message)"
            " values (%(a_session)s, %(b)s, %(message)s)",
            id="user_id=B",
        ),
        pytest.param(
            "insert into public.chat_message_history (session_id, message)"
            " values (%(a_session)s, %(message)s)",
            id="user_id-omitted",
        ),
        pytest.param(
            "insert into public.chat_message_history (session_id, user_id, message)"
            " values (%(b_session)s, %(a)s, %(message)s)",
            id="B-session-user_id=A",
        ),
    ],
)
def test_b_cannot_add_messages_to_a_session(
    conn: psycopg.Connection, world: World, unchanged: None, query: str
) -> None:
    with acting_as(conn, world.b.claims):
        assert refused(conn, query, world.params)


@pytest.mark.parametrize(
    "query",
    [
        pytest.param(
            "insert into public.user_agent_active_sessions"
            " (user_id, agent_name, active_session_id) values (%(b)s, 'other', %(a_session)s)",
            id="insert",
        ),
        pytest.param(
            "update public.user_agent_active_sessions set active_session_id = %(a_session)s"
            " where user_id = %(b)s and agent_name = 'default'",
            id="update",
        ),
        pytest.param(
            "insert into public.user_agent_active_sessions as p"
            " (user_id, agent_name, active_session_id) values (%(b)s, 'default', %(a_session)s)"
            " on conflict (user_id, agent_name)"
            " do update set active_session_id = excluded.active_session_id",
            id="upsert",
        ),
    ],
)
def test_b_cannot_point_its_active_session_at_a_session(
    conn: psycopg.Connection, world: World, admin: psycopg.Connection, unchanged: None, query: str
) -> None:
    with acting_as(conn, world.b.claims):
        assert refused(conn, query, world.params)
    pointers = admin.execute(
        "select active_session_id from public.user_agent_active_sessions where user_id = %s",
        (world.b.user_id,),
    ).fetchall()
    assert pointers == [(world.b_session,)]


def test_b_cannot_take_over_a_session_id_by_upsert(
    conn: psycopg.Connection, world: World, unchanged: None
) -> None:
    """What record_turn issues: an upsert on the session's key (id, user_id).
    B naming A as the owner is refused; B's own session with A's id is
    another row, and A's stays as it was."""
    upsert = (
        "insert into public.chat_sessions as s (id, user_id) values (%(a_session)s, {owner})"
        " on conflict (id, user_id) do update set title = 'mine', message_count = 0"
    )
    with acting_as(conn, world.b.claims):
        assert refused(conn, upsert.format(owner="%(a)s"), world.params)
        assert affected(conn, upsert.format(owner="%(b)s"), world.params) == 1


@pytest.mark.parametrize("table", TABLES)
def test_authenticated_without_claims_sees_nothing(
    conn: psycopg.Connection, world: World, table: str
) -> None:
    with conn.transaction():
        conn.execute("select set_config('role', 'authenticated', true)")
        (count,) = conn.execute(on("select count(*) from public.{table}", table)).fetchone()
    assert count == 0


# ----------------------------------------------------------------- anon


@pytest.mark.parametrize("table", TABLES)
def test_anon_can_neither_read_nor_write(
    gateway: psycopg.Connection, world: World, unchanged: None, table: str
) -> None:
    conn = gateway
    with acting_as(conn, None):
        try:
            with conn.transaction():
                rows = conn.execute(on("select * from public.{table}", table)).fetchall()
        except psycopg.errors.InsufficientPrivilege:
            rows = []
        assert rows == []
        assert refused(conn, INSERTS_AS_A[table], world.params)
        update = f"update public.{{table}} {CHANGES[table]}" + OF_A
        assert affected(conn, on(update, table), world.params) in (0, "refused")
        assert affected(conn, on(DELETE, table), world.params) in (0, "refused")


# ---------------------------------------------------------- user B, store


async def test_b_cannot_load_a_session(db, users: UserFactory, world: World, unchanged) -> None:
    """Session ids are per user: A's id is, for B, an id with no session yet."""
    b = users.create()
    ctx = await store.load_context(
        db, b, session_id=world.a_session, agent_name="default", window=10
    )
    assert ctx.session is None and ctx.messages == [] and ctx.summary is None


async def test_b_cannot_record_a_turn_into_a_session(
    db, admin, users: UserFactory, world: World, unchanged
) -> None:
    """A turn of B's under A's session id goes into B's own session of that id."""
    b = users.create()
    info = await store.record_turn(db, b, turn(world.a_session, exchange("mine now?", "no")))
    assert info.id == world.a_session and info.message_count == 2
    owners = admin.execute(
        "select user_id from public.chat_sessions where id = %s order by user_id = %s",
        (world.a_session, b.user_id),
    ).fetchall()
    assert owners == [(world.a.user_id,), (b.user_id,)]


async def test_b_cannot_clear_a_session(db, users: UserFactory, world: World, unchanged) -> None:
    b = users.create()
    with pytest.raises(SessionNotFound):
        await store.clear_session(db, b, session_id=world.a_session, agent_name="default", ttl=TTL)


async def test_b_reads_nothing_of_a(db, users: UserFactory, world: World, unchanged) -> None:
    b = users.create()
    assert await store.list_sessions(db, b, agent_name=None, limit=100) == []
    assert await store.active_session(db, b, "default") is None
    notes = await store.read_notes(db, b, "default")
    assert (notes.notes, notes.version) == ("", 0)
    ctx = await store.load_context(db, b, session_id=None, agent_name="default", window=10)
    assert ctx.session is None and ctx.messages == []


async def test_delete_user_data_of_b_leaves_a_intact(
    db, admin, users: UserFactory, world: World, unchanged
) -> None:
    b = users.create()
    await record(db, b, exchange("hello", "hi B"), notes="B likes coffee")
    counts = await store.delete_user_data(db, b)
    assert counts == {
        "memories": 0,
        "messages": 2,
        "active_sessions": 1,
        "sessions": 1,
        "long_term_memory": 1,
    }
    assert all(rows == [] for rows in snapshot(admin, b.user_id).values())
