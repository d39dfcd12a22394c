"""What a turn runs in the database is planned once per connection (issue 22).

A statement inside a PL/pgSQL function is planned through the plan cache, once
per connection (generic plans). A SQL-language function the planner does not
inline is planned again each time the statement calling it runs before
PostgreSQL 18, which Supabase runs (15, 17): migration
supabase/schemas/functions/requests.sql made those PL/pgSQL. These tests hold both:

- a turn's store calls, repeated on one connection, plan nothing beyond the
  client's own statements (counted with debug_print_plan, which reports each
  plan the server makes), on the suite's PostgreSQL 18 and on 16
  (tests/utils/postgres16.py);
- every SQL-language function of the migrations is one the planner inlines
  or a constant (supabase/schemas/functions/requests.sql made the rest
  PL/pgSQL), so no version plans one at every call.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg import sql

from memchat import devdb, store
from memchat.config import DUPLICATE_SCORE
from memchat.store.db import Database
from memchat.store.migrations import migrate
from memchat.throttle import Rate
from tests.utils.postgres16 import postgres16
from tests.utils.store_data import exchange, turn
from tests.utils.users import UserFactory

# This server's plans and plan counters: not in the Citus lane.
pytestmark = pytest.mark.plain_only

DIMS = 512
MODEL = "test-embedding-model"
SCHEMAS = ("memchat", "public", "auth")


class PlanCounter:
    """The plans the server makes on one connection (debug_print_plan's LOG
    messages, sent to the client with client_min_messages = log)."""

    def __init__(self) -> None:
        self.plans = 0

    def notice(self, diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary == "plan:":
            self.plans += 1

    async def during(self, work: Callable[[], Awaitable[Any]]) -> int:
        """How many plans were made while `work` ran."""
        before = self.plans
        await work()
        return self.plans - before


@asynccontextmanager
async def one_connection(database_url: str) -> AsyncIterator[tuple[Database, PlanCounter]]:
    """The API's Database with one connection, which reports what it plans."""
    db = Database(database_url, max_connections=1)
    counter = PlanCounter()
    try:
        async with db.connection() as conn:
            conn.add_notice_handler(counter.notice)
            await conn.execute("set client_min_messages = log")
            await conn.execute("set debug_print_plan = on")
        yield db, counter
    finally:
        await db.close()


def vector(seed: int) -> store.Embedding:
    values = [0.0] * DIMS
    values[seed % DIMS] = 1.0
    values[(seed * 7 + 3) % DIMS] = 0.5
    return store.Embedding(MODEL, values)


async def turn_plans(database_url: str, caller: store.Caller) -> dict[str, int]:
    """The plans a turn's store calls make inside the client's statements,
    on a connection that has made its plans: per call, its plans less those
    of a pipeline running `select 1` (the claims, the user check, one
    statement of the client's)."""
    session_id = uuid.uuid4()
    throttle = Rate(per_minute=6000, burst=1000)
    async with one_connection(database_url) as (db, counter):

        async def nothing(statements: int) -> None:
            async with db.pipeline(caller.claims) as conn:
                for _ in range(statements):
                    await conn.execute("select 1")

        async def load() -> None:
            await store.load_context(
                db,
                caller,
                session_id=session_id,
                agent_name="default",
                window=10,
                throttle=throttle,
            )

        async def recall(i: int) -> None:
            await store.recall(
                db,
                caller,
                store.RecallQuery(
                    session_id=session_id,
                    agent_name="default",
                    window=4,
                    embedding=vector(i),
                    k=3,
                    min_score=0.0,
                    text=f"which green teas did I name in round {i}?",
                    duplicate_score=DUPLICATE_SCORE,
                ),
            )

        async def record(i: int) -> None:
            said = turn(session_id, exchange(f"I like green tea number {i}", f"noted: tea {i}"))
            await store.record_turn(
                db, caller, replace(said, embedding=vector(i), summary_due_after=4)
            )

        # The first calls make the connection's plans (a statement left to
        # plan_cache_mode = auto is planned for its values five times first).
        for i in range(8):
            await load()
            await recall(i)
            await record(i)

        # Each call's own statements: recall sends two (the exchanges, the
        # durable memories), the others one.
        own = {n: await counter.during(partial(nothing, n)) for n in (1, 2)}
        assert own[1] >= 2 and own[2] > own[1]  # the counter sees plans at all
        plans = {
            "load_context": await counter.during(load) - own[1],
            "recall": await counter.during(lambda: recall(100)) - own[2],
            "record_turn": await counter.during(lambda: record(100)) - own[1],
        }
    return plans


NOTHING_INSIDE = {"load_context": 0, "recall": 0, "record_turn": 0}


async def test_a_turn_plans_only_the_clients_statements(
    database_url: str, users: UserFactory
) -> None:
    assert await turn_plans(database_url, users.create()) == NOTHING_INSIDE


@pytest.fixture(scope="module")
def postgres_16() -> Iterator[str]:
    """A PostgreSQL 16 server with the migrations applied: its owner's URI."""
    with postgres16() as uri:  # its own directory: tests/utils/postgres16.py says why
        migrate(uri)
        yield uri


async def test_a_turn_plans_only_the_clients_statements_on_postgresql_16(
    postgres_16: str,
) -> None:
    # Before 18 a SQL function the planner does not inline is planned at
    # every call: the migrations' functions must not be such.
    with psycopg.connect(postgres_16, autocommit=True) as admin:
        version = admin.execute("show server_version_num").fetchone()
        assert version is not None and 160000 <= int(version[0]) < 170000
        caller = UserFactory(admin).create()
    api_url = devdb.role_conninfo(postgres_16, devdb.API_ROLE)
    assert await turn_plans(api_url, caller) == NOTHING_INSIDE


# ------------------------------------------------------------- the rule


def functions(admin: psycopg.Connection) -> dict[str, dict[str, Any]]:
    rows = admin.execute(
        """
        select n.nspname || '.' || p.proname, l.lanname, p.provolatile, p.pronargs,
               p.proretset, p.oid::regprocedure::text,
               array(select pg_catalog.format_type(t, null)
                       from unnest(p.proargtypes) with ordinality a(t, i) order by i)
          from pg_catalog.pg_proc p
          join pg_catalog.pg_namespace n on n.oid = p.pronamespace
          join pg_catalog.pg_language l on l.oid = p.prolang
         where n.nspname = any(%s) and p.prokind = 'f'
        """,
        (list(SCHEMAS),),
    ).fetchall()
    return {
        name: {
            "language": language,
            "volatility": volatility,
            "args": args,
            "set": set_returning,
            "signature": signature,
            "types": types,
        }
        for name, language, volatility, args, set_returning, signature, types in rows
    }


def inlined(admin: psycopg.Connection, name: str, f: dict[str, Any]) -> bool:
    """Whether the planner replaces a call of `name` with its body, as
    PL/pgSQL's generic plans see it (parameters, not values)."""
    schema, short = name.split(".")
    params = sql.SQL(", ").join(sql.SQL("$" + str(i + 1)) for i in range(f["args"]))
    call = sql.SQL("{}({})").format(sql.Identifier(schema, short), params)
    statement = (
        sql.SQL("select * from {}").format(call) if f["set"] else sql.SQL("select {}").format(call)
    )
    prepare = sql.SQL("prepare inlined_probe")
    execute = sql.SQL("explain (verbose, costs off) execute inlined_probe")
    if f["args"]:
        types = sql.SQL(", ").join(sql.SQL(t) for t in f["types"])
        nulls = sql.SQL(", ").join(sql.SQL("null") for _ in f["types"])
        prepare = sql.SQL("{}({})").format(prepare, types)
        execute = sql.SQL("{}({})").format(execute, nulls)
    with admin.transaction():
        admin.execute("set local plan_cache_mode = force_generic_plan")
        admin.execute(sql.SQL("{} as {}").format(prepare, statement))
        try:
            plan = "\n".join(row[0] for row in admin.execute(execute).fetchall())
        finally:
            admin.execute("deallocate inlined_probe")
    return re.search(rf"\b{re.escape(short)}\(", plan) is None and (
        f"Function Scan on {short}" not in plan
    )


def test_every_sql_function_is_inlined_or_a_constant(admin: psycopg.Connection) -> None:
    found = functions(admin)
    in_sql = {name for name, f in found.items() if f["language"] == "sql"}
    constants = {n for n in in_sql if found[n]["volatility"] == "i" and found[n]["args"] == 0}
    # What the migrations keep in SQL: the claims' helpers, a message's test,
    # the set-returning helpers read in FROM, the constants.
    assert {"auth.uid", "memchat.embeddable", "memchat.asked"} <= in_sql - constants
    assert "memchat.ann_from_messages" in constants
    planned_per_call = sorted(
        found[name]["signature"]
        for name in in_sql - constants
        if not inlined(admin, name, found[name])
    )
    assert planned_per_call == []


def sql_bodies(admin: psycopg.Connection) -> dict[str, str]:
    """Each function's body in SQL (schema-qualified name: body)."""
    rows = admin.execute(
        "select n.nspname || '.' || p.proname, p.prosrc from pg_proc p"
        " join pg_namespace n on n.oid = p.pronamespace join pg_language l on l.oid = p.prolang"
        " where l.lanname = 'sql' and n.nspname in ('memchat', 'auth', 'public')"
    ).fetchall()
    return {name: body for name, body in rows}


def test_no_sql_function_reads_a_table(admin: psycopg.Connection) -> None:
    # Citus cannot plan a statement into which a SQL function reading a
    # distributed table is inlined (docs/deploy.md "Citus"): every read of a
    # table is a statement's own or a PL/pgSQL function's.
    tables = {
        f"{schema}.{name}"
        for schema, name in admin.execute(
            "select n.nspname, c.relname from pg_class c"
            " join pg_namespace n on n.oid = c.relnamespace"
            " where c.relkind in ('r', 'p', 'v') and n.nspname in ('memchat', 'public', 'auth')"
        ).fetchall()
    }
    reading = sorted(
        name
        for name, body in sql_bodies(admin).items()
        if any(re.search(rf"\b{re.escape(table)}\b", body) for table in tables)
    )
    assert reading == []


def test_the_table_probe_tells_a_sql_function_that_reads_one(admin: psycopg.Connection) -> None:
    name = f"memchat.probe_{uuid.uuid4().hex[:8]}"
    with admin.transaction():
        admin.execute(
            sql.SQL(
                "create function {}() returns bigint language sql stable"
                " as $$ select count(*) from public.chat_sessions $$"
            ).format(sql.Identifier(*name.split(".")))
        )
        assert name in sql_bodies(admin)
        with pytest.raises(AssertionError):
            test_no_sql_function_reads_a_table(admin)
        admin.execute(sql.SQL("drop function {}").format(sql.Identifier(*name.split("."))))


def test_the_inlining_probe_tells_a_function_that_is_not_inlined(
    admin: psycopg.Connection,
) -> None:
    name = f"memchat.probe_{uuid.uuid4().hex[:8]}"
    function = sql.Identifier(*name.split("."))
    with admin.transaction():
        admin.execute(
            sql.SQL(
                "create function {}(p integer) returns integer language sql stable"
                " set search_path = '' as $$ select p + 1 $$"
            ).format(function)
        )
        found = functions(admin)
        assert not inlined(admin, name, found[name])
        admin.execute(
            sql.SQL(
                "create or replace function {}(p integer) returns integer language sql stable"
                " as $$ select p + 1 $$"
            ).format(function)
        )
        found = functions(admin)
        assert inlined(admin, name, found[name])
        admin.execute(sql.SQL("drop function {}(integer)").format(function))
