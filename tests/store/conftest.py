"""Fixtures of the store tests: two users' rows, and connections as each role."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.abc import Query
from psycopg.types.json import Jsonb

from memchat import messages, store
from memchat.store.distribute import on_citus
from tests.utils.store_data import exchange, snapshot
from tests.utils.users import UserFactory

MESSAGE = Jsonb(messages.human("written by someone else"))


def on(template: str, table: str) -> sql.Composed:
    """The statement `template` with `{table}` filled in as an identifier."""
    return sql.SQL(template).format(table=sql.Identifier(table))


def refused(conn: psycopg.Connection, query: Query, params: dict[str, Any]) -> bool:
    """Whether the database refuses the statement (the savepoint keeps the transaction)."""
    try:
        with conn.transaction():
            conn.execute(query, params)
    except psycopg.errors.InsufficientPrivilege:
        return True
    except psycopg.errors.ForeignKeyViolation:
        # On Citus a shard's BEFORE triggers run before row-level security's
        # check, and their writes meet the composite keys first, which hold
        # a user's rows together (docs/deploy.md "Citus").
        if on_citus(conn):
            return True
        raise
    except _CITUS_REFUSALS as error:
        if citus_refuses_the_owner(conn, error):
            return True
        raise
    return False


# Citus's own refusals of a write that would move a row to another user or
# names none (`user_id` is its distribution column), made before row-level
# security or the trigger that fills `user_id` in on plain PostgreSQL.
_CITUS_REFUSALS = (psycopg.errors.FeatureNotSupported, psycopg.errors.NullValueNotAllowed)
_CITUS_OWNER_ERRORS = {
    "modifying the partition value of rows is not allowed",
    "cannot perform an INSERT without a partition column value",
}


def citus_refuses_the_owner(conn: psycopg.Connection, error: psycopg.Error) -> bool:
    """Whether `error` is Citus refusing to change a row's `user_id` or to
    insert one without it (plain PostgreSQL's policies refuse instead)."""
    return error.diag.message_primary in _CITUS_OWNER_ERRORS and on_citus(conn)


def refusals(conn: psycopg.Connection) -> tuple[type[psycopg.Error], ...]:
    """The errors a write the database refuses raises: row-level security's,
    and on Citus the composite keys' too (see `refused`)."""
    if on_citus(conn):
        return (psycopg.errors.InsufficientPrivilege, psycopg.errors.ForeignKeyViolation)
    return (psycopg.errors.InsufficientPrivilege,)


def affected(conn: psycopg.Connection, query: Query, params: dict[str, Any]) -> int | str:
    """Rows the statement changed, or "refused"."""
    try:
        with conn.transaction():
            return conn.execute(query, params).rowcount
    except psycopg.errors.InsufficientPrivilege:
        return "refused"
    except _CITUS_REFUSALS as error:
        if citus_refuses_the_owner(conn, error):
            return "refused"
        raise


@dataclass(frozen=True)
class World:
    a: store.Caller
    b: store.Caller
    a_session: uuid.UUID
    b_session: uuid.UUID
    a_rows: dict[str, list[dict[str, Any]]]

    @property
    def params(self) -> dict[str, Any]:
        return {
            "a": self.a.user_id,
            "b": self.b.user_id,
            "a_session": self.a_session,
            "b_session": self.b_session,
            "message": MESSAGE,
        }


@pytest.fixture
def world(admin: psycopg.Connection, users: UserFactory) -> World:
    """A and B each own one session with its active pointer, two messages and notes."""
    a, b = users.create(), users.create()
    a_session, b_session = uuid.uuid4(), uuid.uuid4()
    with admin.transaction():
        for owner, session in ((a, a_session), (b, b_session)):
            admin.execute(
                "insert into public.chat_sessions (id, user_id, title, message_count)"
                " values (%s, %s, 'hello', 2)",
                (session, owner.user_id),
            )
            admin.execute(
                "insert into public.user_agent_active_sessions"
                " (user_id, agent_name, active_session_id) values (%s, 'default', %s)",
                (owner.user_id, session),
            )
            for message in exchange("hello", "hi"):
                admin.execute(
                    "insert into public.chat_message_history (session_id, user_id, message)"
                    " values (%s, %s, %s)",
                    (session, owner.user_id, Jsonb(message)),
                )
            admin.execute(
                "insert into public.agent_long_term_memory (user_id, agent_name, notes)"
                " values (%s, 'default', 'likes tea')",
                (owner.user_id,),
            )
    a_rows = snapshot(admin, a.user_id)
    assert all(len(rows) >= 1 for rows in a_rows.values())
    return World(a, b, a_session, b_session, a_rows)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    """The API's login (`memchat_api`), connected as the store connects (its
    parameters' adapters included); `acting_as` switches to a user's role."""
    with store.connect(database_url) as connection:
        yield connection


@pytest.fixture
def gateway(admin_url: str) -> Iterator[psycopg.Connection]:
    """A connection that may become `anon` or `authenticated`, as PostgREST's
    `authenticator` does (the owner's here)."""
    with psycopg.connect(admin_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def unchanged(world: World, admin: psycopg.Connection) -> Iterator[None]:
    """After the test, A's rows are exactly as arranged."""
    yield
    assert snapshot(admin, world.a.user_id) == world.a_rows
