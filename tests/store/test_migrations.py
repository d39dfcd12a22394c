"""The migrations: idempotent on a fresh database, the baseline taken as
applied where the history it squashed ran, and the schema they leave.

Checks the security shape DATA.md promises: RLS on every table, nothing for
`anon`, policies in the `(select auth.uid())` form, and user_id-led indexes
behind every policy.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from memchat.store.migrations import (
    BASELINE_VERSION,
    SQUASHED_VERSIONS,
    MigrationError,
    discover,
    migrate,
)
from tests.utils.analytics_data import empty_database
from tests.utils.store_data import USER_TABLES

# The migrations as they leave one server (on Citus `memchat db distribute`
# rewrites the policies): not in the Citus lane.
pytestmark = pytest.mark.plain_only

TABLES = list(USER_TABLES)
PRIVILEGES = ["select", "insert", "update", "delete", "truncate", "references", "trigger"]


@pytest.fixture
def fresh_database(admin: psycopg.Connection, admin_url: str) -> Iterator[str]:
    """A new, empty database on the same server, dropped afterwards."""
    with empty_database(admin, admin_url, "memchat_fresh") as url:
        yield url


def test_migrations_apply_twice_on_a_fresh_database(fresh_database: str) -> None:
    expected = [(m.version, m.name) for m in discover()]
    assert expected, "no migrations found in supabase/migrations"

    assert migrate(fresh_database) == [version for version, _ in expected]
    assert migrate(fresh_database) == []

    with psycopg.connect(fresh_database) as conn:
        recorded = conn.execute(
            "select version, name, statements from supabase_migrations.schema_migrations"
            " order by version"
        ).fetchall()
        tables = conn.execute(
            "select c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace"
            " where n.nspname = 'public' and c.relkind = 'r' order by c.relname"
        ).fetchall()
    assert [(v, n) for v, n, _ in recorded] == expected
    assert all(statements and statements[0].strip() for _, _, statements in recorded)
    assert sorted(t for (t,) in tables) == sorted(TABLES)


def recorded(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "select version, statements from supabase_migrations.schema_migrations"
        ).fetchall()
    return dict(rows)


def ran_the_squashed_history(url: str, versions: frozenset[str] = SQUASHED_VERSIONS) -> None:
    """The database's records as the migrations before the baseline left
    them, `versions` of them. Its schema stays the baseline's: the squashed
    migrations built the same catalog (compared when they were squashed)."""
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute(
            "delete from supabase_migrations.schema_migrations where version <= %s",
            (BASELINE_VERSION,),
        )
        for version in sorted(versions):
            conn.execute(
                "insert into supabase_migrations.schema_migrations (version, statements, name)"
                " values (%s, %s, %s)",
                (version, ["-- the squashed migration's statements"], "squashed"),
            )


def test_the_baseline_replaced_the_history_before_it() -> None:
    versions = [m.version for m in discover()]
    assert BASELINE_VERSION in versions
    assert SQUASHED_VERSIONS.isdisjoint(versions)
    assert max(SQUASHED_VERSIONS) < BASELINE_VERSION


def test_a_database_that_ran_the_squashed_history_takes_the_baseline_as_applied(
    fresh_database: str,
) -> None:
    migrate(fresh_database)
    after_baseline = [m.version for m in discover() if m.version > BASELINE_VERSION]
    ran_the_squashed_history(fresh_database)
    # Those after the baseline it had not run yet either.
    with psycopg.connect(fresh_database) as conn, conn.transaction():
        conn.execute(
            "delete from supabase_migrations.schema_migrations where version = any(%s)",
            (after_baseline,),
        )

    # The baseline is not run (its tables exist: it would fail), the rest is.
    assert migrate(fresh_database) == after_baseline
    records = recorded(fresh_database)
    assert sorted(records) == [BASELINE_VERSION, *after_baseline]
    assert records[BASELINE_VERSION][0].startswith("-- not run: the database had run the 37")
    assert migrate(fresh_database) == []


def test_a_database_with_part_of_the_squashed_history_is_not_migrated(
    fresh_database: str,
) -> None:
    migrate(fresh_database)
    part = frozenset(sorted(SQUASHED_VERSIONS)[:30])
    ran_the_squashed_history(fresh_database, part)

    with pytest.raises(MigrationError, match=r"ran 30 of the 37 migrations"):
        migrate(fresh_database)
    assert set(recorded(fresh_database)) >= part
    assert BASELINE_VERSION not in recorded(fresh_database)


@pytest.mark.parametrize("table", TABLES)
def test_row_level_security_is_enabled(admin: psycopg.Connection, table: str) -> None:
    row = admin.execute(
        "select relrowsecurity from pg_class where oid = %s::regclass", (f"public.{table}",)
    ).fetchone()
    assert row == (True,)


@pytest.mark.parametrize("table", TABLES)
def test_anon_has_no_privileges(admin: psycopg.Connection, table: str) -> None:
    granted = [
        privilege
        for privilege in PRIVILEGES
        if admin.execute(
            "select has_table_privilege('anon', %s, %s)", (f"public.{table}", privilege)
        ).fetchone()
        == (True,)
    ]
    assert granted == []


# Who each policy is for: the Data API (`authenticated`, whose member
# `memchat_user` reads as it does), the API's writes (`memchat_user`), the
# TTL cleanup (`memchat_cleanup`). The operator's analytics (`memchat_analyst`)
# reads owner-rights views, never these tables.
POLICY_ROLES = {
    "chat_sessions": {
        ("SELECT", "authenticated"),
        ("DELETE", "authenticated"),
        ("INSERT", "memchat_user"),
        ("UPDATE", "memchat_user"),
        ("SELECT", "memchat_cleanup"),
        ("UPDATE", "memchat_cleanup"),
        ("DELETE", "memchat_cleanup"),
    },
    "user_agent_active_sessions": {
        ("SELECT", "authenticated"),
        ("INSERT", "authenticated"),
        ("UPDATE", "authenticated"),
        ("DELETE", "memchat_user"),
    },
    # Messages are immutable: no update grant, so no update policy.
    "chat_message_history": {
        ("SELECT", "authenticated"),
        ("INSERT", "memchat_user"),
        ("DELETE", "memchat_user"),
        ("SELECT", "memchat_cleanup"),
    },
    "agent_long_term_memory": {
        ("SELECT", "authenticated"),
        ("INSERT", "memchat_user"),
        ("UPDATE", "memchat_user"),
        ("DELETE", "memchat_user"),
    },
}


@pytest.mark.parametrize("table", TABLES)
def test_policies_name_their_roles_and_use_wrapped_auth_uid(
    admin: psycopg.Connection, table: str
) -> None:
    policies = admin.execute(
        "select policyname, cmd, roles::text[], qual, with_check from pg_policies"
        " where schemaname = 'public' and tablename = %s",
        (table,),
    ).fetchall()
    assert {(cmd, role) for _, cmd, roles, _, _ in policies for role in roles} == (
        POLICY_ROLES[table]
    )
    for name, _, roles, qual, with_check in policies:
        assert len(roles) == 1, name
        expressions = [e for e in (qual, with_check) if e is not None]
        assert expressions, name
        if roles == ["memchat_cleanup"]:
            # The cleanup acts for no user: it sees expired sessions only.
            assert all("auth.uid()" not in e for e in expressions), name
            if table == "chat_sessions":
                assert "expires_at <= now()" in (qual or ""), name
            continue
        for expression in expressions:
            calls = len(re.findall(r"auth\.uid\(\)", expression))
            wrapped = len(re.findall(r"\(\s*SELECT auth\.uid\(\)", expression))
            assert calls >= 1, f"{name}: {expression}"
            assert wrapped == calls, f"{name} calls auth.uid() per row: {expression}"


@pytest.mark.parametrize("table", TABLES)
def test_an_index_is_led_by_user_id(admin: psycopg.Connection, table: str) -> None:
    definitions = [
        indexdef
        for (indexdef,) in admin.execute(
            "select indexdef from pg_indexes where schemaname = 'public' and tablename = %s",
            (table,),
        ).fetchall()
    ]
    led_by_user_id = [d for d in definitions if re.search(r"USING \w+ \(user_id\b", d)]
    assert led_by_user_id, definitions


def test_messages_have_the_window_index(admin: psycopg.Connection) -> None:
    (indexdef,) = admin.execute(
        "select indexdef from pg_indexes where schemaname = 'public'"
        " and indexname = 'chat_message_history_session_id_idx'"
    ).fetchone()
    assert indexdef.endswith("(session_id, id DESC)")
