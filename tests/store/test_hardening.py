"""Regression tests for the security review (issue 20), at the database.

Each test's docstring names the finding it attacks; each failed on the main
branch the review was made against.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from memchat import messages
from memchat.errors import DatabaseUnavailable
from memchat.store.db import Database, RequestLimits
from memchat.store.distribute import DELEGATED_FUNCTIONS, on_citus
from tests.store.conftest import World
from tests.store.test_privileges import sqlstate
from tests.utils.store_data import (
    acting_as,
    load_context_args,
    record_turn_args,
    through_data_api,
)

INSERT_QUEUE = (
    "insert into memchat.summary_queue (session_id, user_id) values (%(session)s, %(owner)s)"
)


# --------------------------------------------- 4. the summary queue's owner


@pytest.mark.parametrize("owner", ["a", "b"])
def test_nobody_queues_a_summary_of_someone_elses_session(
    conn: psycopg.Connection, world: World, owner: str
) -> None:
    """Finding 4: the queue's insert policy checked only user_id, so B could
    queue A's session (as B's row, or keep it leased) and delay A's turns."""
    params = {"session": world.a_session, "owner": getattr(world, owner).user_id}
    with acting_as(conn, world.b.claims):
        # On Citus B's row for A's session meets the composite key first
        # (see tests/store/conftest.py, refused).
        refusals = {"42501", "23503"} if on_citus(conn) else {"42501"}
        assert sqlstate(conn, INSERT_QUEUE, params) in refusals


def test_a_user_queues_their_own_session(conn: psycopg.Connection, world: World) -> None:
    params = {"session": world.b_session, "owner": world.b.user_id}
    with acting_as(conn, world.b.claims):
        assert sqlstate(conn, INSERT_QUEUE, params) == "ok"


# ------------------------------------------------------ 5. message ids


def test_the_api_role_cannot_choose_a_message_id(conn: psycopg.Connection, world: World) -> None:
    """Finding 5: ids were BY DEFAULT, so memchat_user could insert id
    2^62 and make every later insert collide with it. ALWAYS refuses an
    explicit id; OVERRIDING SYSTEM VALUE needs the id column's insert right,
    which the role does not have."""
    insert = (
        "insert into public.chat_message_history (id, session_id, user_id, message)"
        " values (4611686018427387904, %(a_session)s, %(a)s, %(message)s)"
    )
    with acting_as(conn, world.a.claims):
        assert sqlstate(conn, insert, world.params) == "428C9"  # generated_always
        overriding = insert.replace(") values", ") overriding system value values", 1)
        # The owner's only; on Citus the inserters hold the column (docs/deploy.md,
        # "Citus": identity columns), so ids collide with the user's own rows only.
        if not on_citus(conn):
            assert sqlstate(conn, overriding, world.params) == "42501"


# ------------------------------------- 6. the Data API and the id sequence


@pytest.mark.parametrize(
    "statement",
    [
        "select setval('public.chat_message_history_id_seq', 1)",
        "select nextval('public.chat_message_history_id_seq')",
        "select last_value from public.chat_message_history_id_seq",
    ],
)
@pytest.mark.parametrize("role", ["anon", "authenticated"])
def test_the_data_api_roles_cannot_touch_the_id_sequence(
    gateway: psycopg.Connection, world: World, role: str, statement: str
) -> None:
    """Finding 6: Supabase's default privileges give anon and authenticated
    everything on new sequences in `public`: setval on the message ids
    worked on a hosted project. Revoked by the migration."""
    if role == "anon":
        with acting_as(gateway, None):
            assert sqlstate(gateway, statement) == "42501"
    else:
        with through_data_api(gateway, world.a.claims):
            assert sqlstate(gateway, statement) == "42501"


def test_the_local_bootstrap_grants_what_supabase_grants(admin: psycopg.Connection) -> None:
    """Finding 6: the tests must see what production sees, so the plain-
    PostgreSQL bootstrap sets Supabase's default privileges on `public`: a
    table created there later is the Data API's unless a migration revokes it."""
    table = f"public.probe_{uuid.uuid4().hex[:8]}"
    admin.execute(f"create table {table} (id bigint generated always as identity)")
    try:
        rights = admin.execute(
            "select has_table_privilege('anon', %(t)s, 'select'),"
            " has_table_privilege('authenticated', %(t)s, 'delete'),"
            " has_sequence_privilege('authenticated', pg_get_serial_sequence(%(t)s, 'id'),"
            "                        'update')",
            {"t": table},
        ).fetchone()
    finally:
        admin.execute(f"drop table {table}")
    assert rights == (True, True, True)


# ------------------------------------------------------------ 12. timeouts


def test_the_login_roles_carry_timeouts(admin: psycopg.Connection) -> None:
    """Finding 12: no statement_timeout or idle_in_transaction_session_timeout
    on the API's roles, so one request could hold a connection without bound."""
    settings = dict(
        admin.execute(
            "select r.rolname, s.setconfig from pg_db_role_setting s"
            " join pg_roles r on r.oid = s.setrole where s.setdatabase = 0"
            " and r.rolname in ('memchat_api', 'memchat_worker', 'memchat_cleanup')"
        ).fetchall()
    )
    assert set(settings) == {"memchat_api", "memchat_worker", "memchat_cleanup"}
    for config in settings.values():
        names = {item.split("=", 1)[0] for item in config}
        assert {"statement_timeout", "idle_in_transaction_session_timeout"} <= names


async def test_a_request_is_held_to_its_statement_timeout(database_url: str, world: World) -> None:
    """DB_STATEMENT_TIMEOUT_MS, set in every request's transaction."""
    db = Database(database_url, limits=RequestLimits(statement_timeout_ms=200))
    try:
        with pytest.raises(DatabaseUnavailable) as refused:
            async with db.pipeline(world.a.claims) as conn:
                await conn.execute("select pg_sleep(2)")
        assert isinstance(refused.value.__cause__, psycopg.errors.QueryCanceled)
        async with db.pipeline(world.a.claims) as conn:  # the connection is fine after
            cur = conn.cursor()
            await cur.execute("select current_setting('statement_timeout')")
        assert await cur.fetchone() == ("200ms",)
    finally:
        await db.close()


async def test_a_request_cannot_sit_in_an_open_transaction(database_url: str, world: World) -> None:
    """DB_IDLE_IN_TRANSACTION_TIMEOUT_MS: a request that stops talking inside
    its transaction (an export to a reader that stalled) loses it."""
    db = Database(database_url, limits=RequestLimits(idle_in_transaction_timeout_ms=200))
    try:
        with pytest.raises((DatabaseUnavailable, psycopg.errors.IdleInTransactionSessionTimeout)):
            async with db.transaction(world.a.claims) as conn:
                await asyncio.sleep(1.0)
                await conn.execute("select 1")
    finally:
        await db.close()


# ------------------------------------- the turn's functions name their caller


@pytest.mark.parametrize("call", ["load_context", "record_turn"])
def test_a_turns_function_refuses_a_user_id_not_the_callers(
    conn: psycopg.Connection, world: World, call: str
) -> None:
    """load_context and record_turn take the caller's id first (on Citus,
    the worker they run on): B naming A is refused, as is naming no one."""
    from memchat.store.turns import LOAD_CONTEXT, RECORD_TURN

    statement = {"load_context": LOAD_CONTEXT, "record_turn": RECORD_TURN}[call]

    def args(user_id: uuid.UUID | None) -> tuple[Any, ...]:
        if call == "load_context":
            return load_context_args(user_id, world.a_session)
        return record_turn_args(user_id, world.a_session, [messages.human("hi")])

    with acting_as(conn, world.b.claims):
        assert sqlstate(conn, statement, args(world.a.user_id)) == "42501"
        # A delegated function called with a null distribution argument
        # crashes Citus 14.0.1's coordinator (docs/deploy.md): never sent there.
        if not on_citus(conn):
            assert sqlstate(conn, statement, args(None)) == "42501"


@pytest.mark.parametrize("function", DELEGATED_FUNCTIONS)
def test_every_delegated_function_refuses_a_user_id_not_the_callers(
    conn: psycopg.Connection, world: World, function: str
) -> None:
    """Each function `memchat db distribute` delegates by its first argument
    checks it before anything else: B naming A is refused, whatever else
    the call says."""
    name, _, rest = function.partition("(")
    others = [t.strip() for t in rest.rstrip(")").split(",")][1:]
    call = sql.SQL("select {}(%s{})").format(
        sql.SQL(name),
        sql.SQL("").join(sql.SQL(", null::{}").format(sql.SQL(t)) for t in others),
    )
    with acting_as(conn, world.b.claims):
        assert sqlstate(conn, call, (world.a.user_id,)) == "42501"
