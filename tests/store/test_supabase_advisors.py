"""What Supabase's advisors (the dashboard's Security and Performance
Advisors, the `splinter` lints) find in memchat's schema: only what
docs/deploy.md ("Supabase's advisors") says they find, each for the reason
it gives.

The lints' own SQL is not run here (it is not a package); each test reads
the catalog for the condition a lint reports, over memchat's schemas.
"""

from __future__ import annotations

import re

import psycopg
import pytest

from tests.utils.roles import DEPLOY_GUIDE, documented
from tests.utils.roles import SCHEMAS as ROLE_SCHEMAS

# Supabase's advisors read one server's catalog (on Citus the policies are
# rewritten): not in the Citus lane.
pytestmark = pytest.mark.plain_only

# memchat's schemas; the lints skip `auth` (Supabase's; here its stand-in).
SCHEMAS = [schema for schema in ROLE_SCHEMAS if schema != "auth"]
SEARCH_PATH_BEGIN, SEARCH_PATH_END = "<!-- search-path:begin -->", "<!-- search-path:end -->"
# The tables only their owner reads (through its SECURITY DEFINER functions).
OWNER_ONLY = {"memchat.analytics_key", "memchat.common_words", "memchat.word_statistics"}
KEY_PARTITION = re.compile(r"memchat\.message_(embeddings|facts)_p\d\d")
DATA_API_ROLES = ("anon", "authenticated")
AUTH_CALL = re.compile(r"auth\.(uid|jwt|role|email)\(\)")
AUTH_SELECT = re.compile(r"select\s+auth\.(uid|jwt|role|email)\(\)")


def test_the_functions_without_a_search_path_are_the_documented_inlined_ones(
    admin: psycopg.Connection,
) -> None:
    # "Function Search Path Mutable" (WARN).
    rows = admin.execute(
        """
        select p.oid::regprocedure::text, l.lanname, p.prosecdef
          from pg_catalog.pg_proc p
          join pg_catalog.pg_namespace n on n.oid = p.pronamespace
          join pg_catalog.pg_language l on l.oid = p.prolang
         where n.nspname = any(%s)
           and not exists (select 1 from pg_catalog.pg_depend d
                            where d.objid = p.oid and d.deptype = 'e')
           and not exists (select 1 from unnest(coalesce(p.proconfig, '{}')) c
                            where c like 'search_path=%%')
         order by 1
        """,
        (SCHEMAS,),
    ).fetchall()
    assert "\n".join(name for name, _, _ in rows) == documented(
        DEPLOY_GUIDE, SEARCH_PATH_BEGIN, SEARCH_PATH_END
    )
    # Plain SQL with the caller's rights: what the planner inlines
    # (tests/store/test_plans.py checks that it does).
    assert {(language, definer) for _, language, definer in rows} == {("sql", False)}


def test_the_tables_with_row_level_security_and_no_policy_are_the_owners_alone(
    admin: psycopg.Connection,
) -> None:
    # "RLS Enabled No Policy" (INFO): every row refused to every role but the
    # owner; no other role holds a right on them.
    rows = admin.execute(
        """
        select c.oid::regclass::text,
               array(select r from unnest(%s::text[]) r
                      where has_table_privilege(r, c.oid, 'select, insert, update, delete'))
          from pg_catalog.pg_class c
          join pg_catalog.pg_namespace n on n.oid = c.relnamespace
         where n.nspname = any(%s) and c.relkind = 'r' and c.relrowsecurity
           and not exists (select 1 from pg_catalog.pg_policy p where p.polrelid = c.oid)
        """,
        (["anon", "authenticated", "memchat_user", "memchat_worker", "memchat_cleanup"], SCHEMAS),
    ).fetchall()
    names = {name for name, _ in rows}
    partitions = {name for name in names if KEY_PARTITION.fullmatch(name)}
    assert names - partitions == OWNER_ONLY
    assert len(partitions) == 2 * admin.execute("select memchat.key_partitions()").fetchone()[0]
    assert [(name, granted) for name, granted in rows if granted] == []


def test_no_security_lint_fires(admin: psycopg.Connection) -> None:
    # "RLS Disabled in Public" (ERROR).
    assert (
        admin.execute(
            "select c.oid::regclass::text from pg_catalog.pg_class c"
            " where c.relnamespace = 'public'::regnamespace and c.relkind in ('r', 'p')"
            " and not c.relrowsecurity"
        ).fetchall()
        == []
    )
    # What the Data API's roles may run with another role's rights:
    # security-definer functions (WARN) and views, which run with their
    # owner's ("Security Definer View", ERROR).
    assert (
        admin.execute(
            """
            select p.oid::regprocedure::text, r
              from pg_catalog.pg_proc p cross join unnest(%(roles)s::text[]) r
             where p.pronamespace::regnamespace::text = any(%(schemas)s) and p.prosecdef
               and has_function_privilege(r, p.oid, 'execute')
            union all
            select c.oid::regclass::text, r
              from pg_catalog.pg_class c cross join unnest(%(roles)s::text[]) r
             where c.relnamespace::regnamespace::text = any(%(schemas)s) and c.relkind = 'v'
               and has_table_privilege(r, c.oid, 'select')
            """,
            {"roles": list(DATA_API_ROLES), "schemas": SCHEMAS},
        ).fetchall()
        == []
    )


def test_every_policy_reads_the_claims_once_per_statement(admin: psycopg.Connection) -> None:
    # "Auth RLS Initialization Plan" (WARN): auth.uid() inside a subquery,
    # evaluated once, not once per row.
    policies = admin.execute(
        "select schemaname, tablename, policyname, qual, with_check from pg_catalog.pg_policies"
        " where schemaname = any(%s)",
        (SCHEMAS,),
    ).fetchall()
    assert policies
    per_row = [
        (schema, table, name)
        for schema, table, name, *expressions in policies
        for expression in expressions
        if expression
        and AUTH_CALL.search(expression)
        and not AUTH_SELECT.search(expression.lower())
    ]
    assert per_row == []


def test_no_role_meets_two_permissive_policies_for_one_command(
    admin: psycopg.Connection,
) -> None:
    # "Multiple Permissive Policies" (WARN).
    rows = admin.execute(
        """
        select c.oid::regclass::text, r.rolname, x.command, array_agg(p.polname)
          from pg_catalog.pg_policy p
          join pg_catalog.pg_class c on c.oid = p.polrelid
          join pg_catalog.pg_namespace n on n.oid = c.relnamespace
          join pg_catalog.pg_roles r on p.polroles @> array[r.oid] or p.polroles = array[0::oid]
         cross join unnest(case p.polcmd when 'r' then array['select'] when 'a' then array['insert']
                                         when 'w' then array['update'] when 'd' then array['delete']
                                         else array['select', 'insert', 'update', 'delete'] end)
               as x(command)
         where n.nspname = any(%s) and p.polpermissive and not r.rolbypassrls
         group by 1, 2, 3
        having count(*) > 1
        """,
        (SCHEMAS,),
    ).fetchall()
    assert rows == []


def test_every_foreign_key_is_found_through_an_index_of_its_table(
    admin: psycopg.Connection,
) -> None:
    # "Unindexed Foreign Keys" (INFO) names a key without an index on exactly
    # its columns; each of ours has an index that starts with one of them (the
    # user's id, or the session's), so checking or cascading a deleted
    # session or user reads a few rows, not the table.
    rows = admin.execute(
        """
        select k.conrelid::regclass::text, k.conname
          from pg_catalog.pg_constraint k
          join pg_catalog.pg_class c on c.oid = k.conrelid
          join pg_catalog.pg_namespace n on n.oid = c.relnamespace
         where k.contype = 'f' and n.nspname = any(%s)
           and not exists (select 1 from pg_catalog.pg_index i
                            where i.indrelid = k.conrelid and i.indisvalid
                              and i.indkey[0] = any(k.conkey))
        """,
        (SCHEMAS,),
    ).fetchall()
    assert rows == []
