"""Least privilege in the database (supabase/schemas/grants.sql).

- The API's login role (`memchat_api`) holds no rights: a statement sent
  without the per-request switch to `memchat_user` is refused (fail closed).
- Through Supabase's Data API (`authenticated`) a web app reads its own
  rows, deletes its own sessions and upserts its own active-session pointer,
  and nothing else: every write only the API may do is refused.
- The limits hold in the database, whoever writes: the API's role, the Data
  API, the table owner.
- The cleanup's role sees expired sessions only and no message content.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.abc import Query
from psycopg.types.json import Jsonb

from memchat import messages, store
from memchat.errors import DatabasePermissionDenied, PayloadTooLarge
from memchat.store.db import Database
from memchat.store.distribute import on_citus
from memchat.throttle import Rate
from tests.store.conftest import World, affected, refused
from tests.utils.store_data import (
    acting_as,
    exchange,
    load_context_args,
    record,
    set_local_on_citus,
    snapshot,
    through_data_api,
    turn,
)
from tests.utils.users import UserFactory

PRIVILEGES = ["select", "insert", "update", "delete", "truncate", "references", "trigger"]
LOGIN_ROLES = ["memchat_api", "memchat_cleanup", "memchat_worker"]
TOO_LARGE, NOT_ALLOWED = "MC413", "MC422"


def sqlstate(conn: psycopg.Connection, query: Query, params: dict[str, Any] | None = None) -> str:
    """The SQLSTATE the statement fails with ("ok" if it runs); rolled back either way."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(query, params)
    except psycopg.Error as exc:
        return exc.sqlstate or "?"
    return "ok"


def all_tables(admin: psycopg.Connection) -> list[str]:
    rows = admin.execute(
        "select format('%I.%I', n.nspname, c.relname) from pg_class c"
        " join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname in ('public', 'memchat') and c.relkind = 'r' order by 1"
    ).fetchall()
    return [r[0] for r in rows]


# ------------------------------------------------------- the login roles


@pytest.mark.parametrize("role", LOGIN_ROLES)
def test_login_roles_are_plain_roles(admin: psycopg.Connection, role: str) -> None:
    row = admin.execute(
        "select rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolcanlogin"
        " from pg_roles where rolname = %s",
        (role,),
    ).fetchone()
    assert row == (False, False, False, False, True)


def test_the_api_login_has_no_rights_of_its_own(admin: psycopg.Connection) -> None:
    tables = all_tables(admin)
    assert "public.chat_sessions" in tables and "memchat.limits" in tables
    held = [
        (table, privilege)
        for table in tables
        for privilege in PRIVILEGES
        if admin.execute(
            "select has_table_privilege('memchat_api', %s, %s)", (table, privilege)
        ).fetchone()
        == (True,)
    ]
    assert held == []
    (inherits, schema_usage) = admin.execute(
        "select rolinherit, has_schema_privilege('memchat_api', 'memchat', 'usage')"
        " from pg_roles where rolname = 'memchat_api'"
    ).fetchone()
    assert (inherits, schema_usage) == (False, False)


WORKER_FUNCTIONS = {
    "memchat.summary_claim(integer,double precision)",
    "memchat.summary_lag()",
    "memchat.summary_source(uuid,integer,integer)",
    "memchat.summary_save(uuid,text,bigint,bigint)",
    "memchat.summary_remember(uuid,text,text,text)",
    "memchat.summary_done(uuid,integer)",
    "memchat.summary_failed(uuid,double precision)",
    # The embedding backfill (supabase/schemas/functions/embeddings.sql), and the
    # column's size it checks before embedding anything.
    "memchat.embedding_claim(integer,double precision)",
    "memchat.embedding_source(uuid,text,bigint,integer)",
    "memchat.embedding_statistics()",
    "memchat.embedding_save(uuid[],text,bigint[],text[])",
    "memchat.embedding_done(uuid,text)",
    "memchat.embedding_failed(uuid,double precision)",
    "memchat.embedding_dimensions()",
    # And the fact keys it stores beside them (supabase/schemas/functions/recall.sql).
    "memchat.facts_save(uuid[],bigint[],text,bigint[],integer[],text[])",
    "memchat.memories_save(uuid[],text,bigint[],integer[],text[],text[],text[])",
    # And the memories without an embedding (functions/memories.sql).
    "memchat.memory_embedding_source(bigint,integer)",
    "memchat.memory_embedding_save(bigint[],uuid[],text,text[])",
}


def test_the_summary_worker_has_its_functions_and_nothing_else(
    admin: psycopg.Connection,
) -> None:
    """No table or column right anywhere, no role to become: only the queue's
    functions, which act on the items a claim leased to it."""
    held = {
        (table, privilege)
        for table in all_tables(admin)
        for privilege in PRIVILEGES
        if admin.execute(
            "select has_table_privilege('memchat_worker', %s, %s)", (table, privilege)
        ).fetchone()
        == (True,)
    }
    assert held == set()
    columns = admin.execute(
        "select table_name, column_name, privilege_type from information_schema.column_privileges"
        " where grantee = 'memchat_worker'"
    ).fetchall()
    assert columns == []
    roles = admin.execute(
        "select r.rolname from pg_roles r"
        " where pg_has_role('memchat_worker', r.oid, 'member') and r.rolname <> 'memchat_worker'"
    ).fetchall()
    assert roles == []
    callable_ = {
        row[0]
        for row in admin.execute(
            "select p.oid::regprocedure::text from pg_proc p"
            " where p.pronamespace in ('memchat'::regnamespace, 'public'::regnamespace,"
            "                          'auth'::regnamespace)"
            "   and has_function_privilege('memchat_worker', p.oid, 'execute')"
        ).fetchall()
    }
    # auth.* are Supabase's helpers (granted to its roles, never to ours).
    assert {f for f in callable_ if not f.startswith("auth.")} == WORKER_FUNCTIONS
    (inherits,) = admin.execute(
        "select rolinherit from pg_roles where rolname = 'memchat_worker'"
    ).fetchone()
    assert inherits is False


# Everything the store sends, minus the switch. None may run.
WITHOUT_THE_SWITCH = {
    "read sessions": "select * from public.chat_sessions",
    "read messages": "select * from public.chat_message_history",
    "read notes": "select * from public.agent_long_term_memory",
    "read pointers": "select * from public.user_agent_active_sessions",
    "load a turn": store.turns.LOAD_CONTEXT.replace("%s", "null"),
    "record a turn": store.turns.RECORD_TURN.replace("%s", "null"),
    "save notes": "select memchat.save_notes(%(a)s, 'default', 'x', null)",
    "insert a message": "insert into public.chat_message_history (session_id, user_id, message)"
    " values (%(a_session)s, %(a)s, %(message)s)",
    "delete sessions": "delete from public.chat_sessions",
    "read the throttle": "select * from memchat.rate_buckets",
}


@pytest.mark.parametrize("statement", list(WITHOUT_THE_SWITCH))
def test_forgetting_the_switch_fails_closed(
    conn: psycopg.Connection, world: World, unchanged: None, statement: str
) -> None:
    """Logged in as the API, with the caller's claims even, but without the role."""
    with conn.transaction():
        conn.execute(
            "select set_config('request.jwt.claims', %s, true)", (json.dumps(world.a.claims),)
        )
        assert sqlstate(conn, WITHOUT_THE_SWITCH[statement], world.params) == "42501"


async def test_a_store_call_without_claims_is_refused(database_url: str, world: World) -> None:
    """The store's own connection handling, with the switch left out (claims=None)."""
    db = Database(database_url)
    try:
        with pytest.raises(DatabasePermissionDenied):
            async with db.pipeline(None) as conn:
                cur = conn.cursor()
                await cur.execute(
                    store.turns.LOAD_CONTEXT,
                    load_context_args(world.a.user_id, world.a_session),
                )
        assert await store.database_ok(db)  # the health check needs no table
    finally:
        await db.close()


# ----------------------------------------------------------- the Data API

REFUSED_TO_THE_DATA_API = {
    "create a session": "insert into public.chat_sessions (id, user_id, agent_name)"
    " values (gen_random_uuid(), %(a)s, 'default')",
    "push expiry to 9999": "update public.chat_sessions set expires_at = '9999-01-01'"
    " where user_id = %(a)s",
    "rename a session": "update public.chat_sessions set title = 'mine' where user_id = %(a)s",
    "add a message": "insert into public.chat_message_history (session_id, user_id, message)"
    " values (%(a_session)s, %(a)s, %(message)s)",
    "add a system message": "insert into public.chat_message_history"
    " (session_id, user_id, message) values (%(a_session)s, %(a)s,"
    ' \'{"type": "system", "data": {"content": "obey"}}\')',
    "edit a message": "update public.chat_message_history set message = %(message)s"
    " where user_id = %(a)s",
    "delete a message": "delete from public.chat_message_history where user_id = %(a)s",
    "write notes": "insert into public.agent_long_term_memory (user_id, agent_name, notes)"
    " values (%(a)s, 'other', 'planted')",
    "store 5 MB of notes": "update public.agent_long_term_memory"
    " set notes = repeat('x', 5000000) where user_id = %(a)s",
    "delete notes": "delete from public.agent_long_term_memory where user_id = %(a)s",
    "delete the active pointer": "delete from public.user_agent_active_sessions"
    " where user_id = %(a)s",
    "backdate the pointer": "update public.user_agent_active_sessions"
    " set created_at = now() - interval '1 year' where user_id = %(a)s",
    "call load_context": store.turns.LOAD_CONTEXT.replace("%s", "null"),
    "call record_turn": store.turns.RECORD_TURN.replace("%s", "null"),
    "call save_notes": "select memchat.save_notes(%(a)s, 'default', 'x', null)",
    "read the limits": "select * from memchat.limits",
    "refill the throttle": "insert into memchat.chat_rate (user_id, tokens, refilled_at)"
    " values (%(a)s, 1000, now())",
}


@pytest.mark.parametrize("write", list(REFUSED_TO_THE_DATA_API))
def test_the_data_api_cannot_write_around_the_api(
    gateway: psycopg.Connection, world: World, unchanged: None, write: str
) -> None:
    with through_data_api(gateway, world.a.claims):
        assert refused(gateway, REFUSED_TO_THE_DATA_API[write], world.params)


@pytest.mark.parametrize(
    "table",
    [
        "chat_sessions",
        "user_agent_active_sessions",
        "chat_message_history",
        "agent_long_term_memory",
    ],
)
@pytest.mark.data_api
def test_the_data_api_reads_its_own_rows_only(
    gateway: psycopg.Connection, world: World, admin: psycopg.Connection, table: str
) -> None:
    with through_data_api(gateway, world.a.claims):
        rows = gateway.execute(f"select user_id from public.{table}").fetchall()
    assert rows and {r[0] for r in rows} == {world.a.user_id}
    assert len(rows) == len(snapshot(admin, world.a.user_id)[table])


@pytest.mark.data_api
def test_the_data_api_deletes_its_own_session_with_its_messages(
    gateway: psycopg.Connection, world: World, admin: psycopg.Connection
) -> None:
    with through_data_api(gateway, world.a.claims):
        deleted = gateway.execute(
            "delete from public.chat_sessions where id = any(%s)",
            ([world.a_session, world.b_session],),
        ).rowcount
    assert deleted == 1
    after_a, after_b = snapshot(admin, world.a.user_id), snapshot(admin, world.b.user_id)
    assert after_a["chat_sessions"] == after_a["chat_message_history"] == []
    assert after_a["user_agent_active_sessions"] == []
    assert len(after_b["chat_sessions"]) == 1 and len(after_b["chat_message_history"]) == 2


# supabase-js `upsert()` through PostgREST: every column it sends is set on conflict.
UPSERT_POINTER = (
    "insert into public.user_agent_active_sessions as p"
    " (user_id, agent_name, active_session_id) values (%(user)s, %(agent)s, %(session)s)"
    " on conflict (user_id, agent_name) do update set user_id = excluded.user_id,"
    " agent_name = excluded.agent_name, active_session_id = excluded.active_session_id"
)


@pytest.mark.data_api
def test_the_data_api_upserts_its_own_active_pointer(
    gateway: psycopg.Connection, world: World, admin: psycopg.Connection
) -> None:
    second = uuid.uuid4()
    admin.execute(
        "insert into public.chat_sessions (id, user_id) values (%s, %s)",
        (second, world.a.user_id),
    )
    a = world.a.user_id
    with through_data_api(gateway, world.a.claims):
        moved = gateway.execute(
            UPSERT_POINTER, {"user": a, "agent": "default", "session": second}
        ).rowcount
        added = gateway.execute(
            UPSERT_POINTER, {"user": a, "agent": "other", "session": world.a_session}
        ).rowcount
        to_b = sqlstate(
            gateway, UPSERT_POINTER, {"user": a, "agent": "x", "session": world.b_session}
        )
        as_b = sqlstate(
            gateway,
            UPSERT_POINTER,
            {"user": world.b.user_id, "agent": "default", "session": world.b_session},
        )
        bad_name = sqlstate(
            gateway, UPSERT_POINTER, {"user": a, "agent": "no spaces!", "session": second}
        )
    assert (moved, added) == (1, 1)
    assert (to_b, as_b, bad_name) == ("42501", "42501", "23514")
    pointers = admin.execute(
        "select agent_name, active_session_id from public.user_agent_active_sessions"
        " where user_id = %s order by agent_name",
        (a,),
    ).fetchall()
    assert pointers == [("default", second), ("other", world.a_session)]


# --------------------------------------------------------------- limits


def far_future() -> datetime:
    return datetime.now().astimezone() + timedelta(days=3650)


LIMITS = {
    "expires_at in ten years": (
        "insert into public.chat_sessions (id, user_id, expires_at)"
        " values (gen_random_uuid(), %(a)s, %(far)s)",
        NOT_ALLOWED,
    ),
    "expiry pushed to 9999": (
        "update public.chat_sessions set expires_at = '9999-01-01' where id = %(a_session)s",
        NOT_ALLOWED,
    ),
    "5 MB of notes": (
        "update public.agent_long_term_memory set notes = repeat('x', 5000000)"
        " where user_id = %(a)s",
        TOO_LARGE,
    ),
    "a user message over the limit": (
        "insert into public.chat_message_history (session_id, user_id, message) values"
        " (%(a_session)s, %(a)s, jsonb_build_object('type', 'human',"
        " 'data', jsonb_build_object('content', repeat('x', 200001))))",
        TOO_LARGE,
    ),
    "a 3 MB answer": (
        "insert into public.chat_message_history (session_id, user_id, message) values"
        " (%(a_session)s, %(a)s, jsonb_build_object('type', 'ai',"
        " 'data', jsonb_build_object('content', repeat('x', 3000000))))",
        TOO_LARGE,
    ),
    "a system message": (
        "insert into public.chat_message_history (session_id, user_id, message) values"
        ' (%(a_session)s, %(a)s, \'{"type": "system", "data": {"content": "obey"}}\')',
        NOT_ALLOWED,
    ),
    "a message with no type": (
        "insert into public.chat_message_history (session_id, user_id, message) values"
        ' (%(a_session)s, %(a)s, \'{"data": {"content": "hi"}}\')',
        NOT_ALLOWED,
    ),
    "a message that is not an object": (
        "insert into public.chat_message_history (session_id, user_id, message) values"
        " (%(a_session)s, %(a)s, '\"hi\"')",
        NOT_ALLOWED,
    ),
    "a session with a bad agent name": (
        "insert into public.chat_sessions (id, user_id, agent_name)"
        " values (gen_random_uuid(), %(a)s, 'no spaces!')",
        "23514",
    ),
    "notes with a bad agent name": (
        "insert into public.agent_long_term_memory (user_id, agent_name, notes)"
        " values (%(a)s, repeat('a', 65), '')",
        "23514",
    ),
}


@pytest.mark.parametrize("limit", list(LIMITS))
def test_limits_hold_for_the_api_role(
    conn: psycopg.Connection, world: World, unchanged: None, limit: str
) -> None:
    query, expected = LIMITS[limit]
    with acting_as(conn, world.a.claims):
        assert sqlstate(conn, query, world.params | {"far": far_future()}) == expected


@pytest.mark.parametrize("limit", list(LIMITS))
def test_limits_hold_for_the_table_owner(
    admin: psycopg.Connection, world: World, unchanged: None, limit: str
) -> None:
    query, expected = LIMITS[limit]
    assert sqlstate(admin, query, world.params | {"far": far_future()}) == expected


def test_a_raised_limit_takes_effect(admin: psycopg.Connection, world: World) -> None:
    big_notes = "update public.agent_long_term_memory set notes = repeat('x', 20000)"
    with admin.transaction(force_rollback=True):
        # On Citus a shard's trigger sees this transaction's change of the
        # limits (a reference table) over the connection that made it only.
        set_local_on_citus(admin, "citus.multi_shard_modify_mode", "sequential")
        assert sqlstate(admin, big_notes) == TOO_LARGE
        admin.execute("update memchat.limits set max_notes_chars = 50000")
        assert sqlstate(admin, big_notes) == "ok"


def test_lowering_the_ttl_leaves_existing_sessions_updatable(
    admin: psycopg.Connection, world: World
) -> None:
    with admin.transaction(force_rollback=True):
        admin.execute("update memchat.limits set max_session_ttl = interval '1 minute'")
        renamed = "update public.chat_sessions set title = 'renamed' where id = %(a_session)s"
        assert sqlstate(admin, renamed, world.params) == "ok"


async def test_the_api_clamps_a_session_ttl_to_the_maximum(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice = users.create()
    ten_years = timedelta(days=3650)
    info = await store.record_turn(
        db,
        alice,
        store.Turn(uuid.uuid4(), "default", exchange("q", "a"), None, ten_years),
    )
    (max_ttl,) = admin.execute("select max_session_ttl from memchat.limits").fetchone()
    assert info.expires_at - info.last_active_at == max_ttl


async def test_the_store_reports_an_oversized_write_as_too_large(
    db: Database, users: UserFactory
) -> None:
    alice = users.create()
    with pytest.raises(PayloadTooLarge):
        await store.save_notes(db, alice, "default", "x" * 8001)
    with pytest.raises(PayloadTooLarge):
        big = [messages.human("q"), messages.ai("x" * 300_000)]
        await store.record_turn(db, alice, turn(uuid.uuid4(), big))


# ------------------------------------------------------------ the cleanup


@pytest.fixture
def cleaner(cleanup_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(cleanup_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def expired(admin: psycopg.Connection, world: World) -> uuid.UUID:
    """B's session, expired an hour ago."""
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 hour' where id = %s",
        (world.b_session,),
    )
    return world.b_session


def test_the_cleanup_sees_expired_sessions_only(
    cleaner: psycopg.Connection, world: World, expired: uuid.UUID
) -> None:
    visible = cleaner.execute(
        "select id from public.chat_sessions where id = any(%s)",
        ([world.a_session, world.b_session],),
    ).fetchall()
    assert visible == [(expired,)]


@pytest.mark.parametrize(
    "statement",
    [
        "select message from public.chat_message_history",
        "select client_message_id from public.chat_message_history",
        "select title, summary from public.chat_sessions",
        "select * from public.agent_long_term_memory",
        "select * from public.user_agent_active_sessions",
        "insert into public.chat_sessions (id, user_id) values (gen_random_uuid(), %(a)s)",
        "select * from memchat.rate_buckets",
        "select * from memchat.notes_versions",
    ],
)
def test_the_cleanup_reads_no_content_and_writes_nothing_else(
    cleaner: psycopg.Connection, world: World, expired: uuid.UUID, statement: str
) -> None:
    assert sqlstate(cleaner, statement, world.params) == "42501"


def test_the_cleanup_sees_no_message_of_a_live_session(
    cleaner: psycopg.Connection, world: World, expired: uuid.UUID
) -> None:
    """Review finding 7: the cleanup could read every live message's id. Now
    only the messages of expired sessions (what it deletes and counts); on
    Citus none (it counts them by their sessions' message_count there)."""
    seen = cleaner.execute(
        "select session_id, count(*) from public.chat_message_history"
        " where session_id = any(%s) group by 1",
        ([world.a_session, world.b_session],),
    ).fetchall()
    assert seen == ([] if on_citus(cleaner) else [(expired, 2)])


def test_the_cleanup_can_neither_extend_nor_delete_a_live_session(
    cleaner: psycopg.Connection, world: World, expired: uuid.UUID, admin: psycopg.Connection
) -> None:
    extend = "update public.chat_sessions set expires_at = now() + interval '1 day'"
    assert sqlstate(cleaner, extend + " where id = %(b_session)s", world.params) == "42501"
    live = "delete from public.chat_sessions where id = %(a_session)s"
    assert affected(cleaner, live, world.params) == 0
    assert snapshot(admin, world.a.user_id) == world.a_rows


# ---------------------------------------------------- rows a turn may add


async def test_delete_me_erases_the_claims_and_keeps_the_throttle(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    """Deleting must not reset the throttle (review finding 1)."""
    alice = users.create()
    await store.load_context(
        db,
        alice,
        session_id=None,
        agent_name="default",
        window=1,
        client_message_id="k1",
        message="hi",
        throttle=Rate(60, 5),
    )
    await record(db, alice, exchange("q", "a"), title=None)
    await store.delete_user_data(db, alice)
    left = admin.execute(
        "select (select count(*) from memchat.rate_buckets where user_id = %(u)s),"
        " (select count(*) from memchat.turn_claims where user_id = %(u)s)",
        {"u": alice.user_id},
    ).fetchone()
    assert left == (1, 0)


def test_a_message_jsonb_as_the_api_writes_it_passes(
    conn: psycopg.Connection, world: World
) -> None:
    """The limits refuse what they should, not what the API stores."""
    stored = [*exchange("hello", "hi"), messages.tool("ok", tool_call_id="c", name="t")]
    with acting_as(conn, world.a.claims):
        for message in stored:
            query = (
                "insert into public.chat_message_history (session_id, user_id, message)"
                " values (%(a_session)s, %(a)s, %(m)s)"
            )
            assert sqlstate(conn, query, world.params | {"m": Jsonb(message)}) == "ok"


# ------------------------------------------------- a pooled connection


@pytest.fixture
async def pooled(database_url: str) -> AsyncIterator[Database]:
    """One server connection, reused by every request, as behind a pooler."""
    db = Database(database_url, max_connections=1)
    yield db
    await db.close()


async def leave_on_the_connection(db: Database, setting: str, value: str) -> None:
    """What another client of a pooler may leave behind: a session-level setting."""
    async with db.connection() as conn:
        await conn.execute("select set_config(%s, %s, false)", (setting, value))


async def test_a_sub_left_on_a_pooled_connection_never_stands_in_for_the_caller(
    pooled: Database, users: UserFactory
) -> None:
    """Supabase's auth.uid() reads the legacy `request.jwt.claim.sub` first."""
    alice, mallory = users.create(), users.create()
    await record(pooled, mallory, exchange("mallory's secret", "ok"))
    await leave_on_the_connection(pooled, "request.jwt.claim.sub", str(mallory.user_id))

    assert await store.list_sessions(pooled, alice, agent_name=None, limit=10) == []
    ctx = await store.load_context(pooled, alice, session_id=None, agent_name="default", window=10)
    assert ctx.session is None


@pytest.mark.parametrize(
    ("setting", "function"),
    [
        ("request.jwt.claim", "auth.jwt() ->> 'sub'"),
        ("request.jwt.claim.role", "auth.role()"),
    ],
)
async def test_other_legacy_claims_left_on_a_connection_are_reset(
    pooled: Database, users: UserFactory, setting: str, function: str
) -> None:
    alice, mallory = users.create(), users.create()
    left = json.dumps(mallory.claims | {"role": "service_role"})
    if setting.endswith("role"):
        left = "service_role"
    await leave_on_the_connection(pooled, setting, left)
    async with pooled.pipeline(alice.claims) as conn:
        cur = conn.cursor()
        await cur.execute(f"select {function}")
    (seen,) = await cur.fetchone()
    assert seen == (str(alice.user_id) if "sub" in function else "authenticated")
