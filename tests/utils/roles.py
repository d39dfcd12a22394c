"""What each database role may do, read off the catalog as plain lines.

docs/deploy.md ("Roles: exactly what each may do") carries the same text
between `<!-- roles:begin -->` and `<!-- roles:end -->`;
tests/store/test_roles_statement.py compares the two, so a migration that
widens (or narrows) a role fails until the statement says so. The lines:

    <role> (login|nologin, inherit|noinherit[, bypassrls])
      becomes: <roles it may SET ROLE to>          (memberships)
      schemas: <schemas it may use>
      <table>: <privileges> [(<columns>)]          (table- or column-level)
      rows of <table>: <command> <policy>, ...     (RLS policies that apply)
      execute: <functions>

Effective rights: what the role holds itself and through the roles it
inherits (not those it may only become).
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

ROLES = (
    "anon",
    "authenticated",
    "service_role",
    "memchat_api",
    "memchat_user",
    "memchat_cleanup",
    "memchat_worker",
    "memchat_analyst",
)
SCHEMAS = ("public", "memchat", "memchat_analytics", "auth")
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
SEQUENCE_PRIVILEGES = ("USAGE", "SELECT", "UPDATE")
COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")
BEGIN, END = "<!-- roles:begin -->", "<!-- roles:end -->"
# Where the roles statement (and the advisors' findings) are written.
DEPLOY_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def describe_roles(conn: psycopg.Connection) -> str:
    """Every role's rights (ROLES), one block each, in the docs' format."""
    return "\n".join(_describe(conn, role) for role in ROLES)


def _describe(conn: psycopg.Connection, role: str) -> str:
    login, inherit, bypass = conn.execute(
        "select rolcanlogin, rolinherit, rolbypassrls from pg_roles where rolname = %s", (role,)
    ).fetchone() or (None, None, None)
    flags = ["login" if login else "nologin", "inherit" if inherit else "noinherit"]
    if bypass:
        flags.append("bypassrls")
    lines = [f"{role} ({', '.join(flags)})"]
    becomes = [
        r[0]
        for r in conn.execute(
            "select g.rolname from pg_roles g where pg_has_role(%s, g.oid, 'member')"
            " and g.rolname <> %s order by 1",
            (role, role),
        ).fetchall()
    ]
    lines.append(f"  becomes: {', '.join(becomes) or '-'}")
    schemas = [
        r[0]
        for r in conn.execute(
            "select n.nspname from pg_namespace n where n.nspname = any(%s)"
            " and has_schema_privilege(%s, n.oid, 'USAGE') order by 1",
            (list(SCHEMAS), role),
        ).fetchall()
    ]
    lines.append(f"  schemas: {', '.join(schemas) or '-'}")
    relations = conn.execute(
        "select format('%%I.%%I', n.nspname, c.relname), c.relkind = 'S'"
        " from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = any(%s) and c.relkind in ('r', 'p', 'v', 'm', 'f', 'S') order by 1",
        (list(SCHEMAS),),
    ).fetchall()
    for relation, is_sequence in relations:
        rights = _relation_rights(conn, role, relation, is_sequence)
        if rights:
            lines.append(f"  {relation}: {rights}")
        policies = _policies(conn, role, relation)
        if policies:
            lines.append(f"  rows of {relation}: {policies}")
    functions = [
        r[0]
        for r in conn.execute(
            "select p.oid::regprocedure::text from pg_proc p"
            " join pg_namespace n on n.oid = p.pronamespace"
            " where n.nspname = any(%s) and has_function_privilege(%s, p.oid, 'EXECUTE')"
            " order by 1",
            (list(SCHEMAS), role),
        ).fetchall()
    ]
    lines.append(f"  execute: {', '.join(functions) or '-'}")
    return "\n".join(lines)


def _relation_rights(conn: psycopg.Connection, role: str, relation: str, sequence: bool) -> str:
    if sequence:
        held = [
            p.lower()
            for p in SEQUENCE_PRIVILEGES
            if conn.execute(
                "select has_sequence_privilege(%s, %s, %s)", (role, relation, p)
            ).fetchone()
            == (True,)
        ]
        return ", ".join(held)
    held = [
        p.lower()
        for p in TABLE_PRIVILEGES
        if conn.execute("select has_table_privilege(%s, %s, %s)", (role, relation, p)).fetchone()
        == (True,)
    ]
    if len(held) == len(TABLE_PRIVILEGES):
        return "all"
    parts = list(held)
    for privilege in COLUMN_PRIVILEGES:
        if privilege.lower() in held:
            continue
        columns = [
            r[0]
            for r in conn.execute(
                "select a.attname from pg_attribute a"
                " where a.attrelid = %s::regclass and a.attnum > 0 and not a.attisdropped"
                "   and has_column_privilege(%s, a.attrelid, a.attnum, %s) order by a.attnum",
                (relation, role, privilege),
            ).fetchall()
        ]
        if columns:
            parts.append(f"{privilege.lower()} ({', '.join(columns)})")
    return ", ".join(parts)


def _policies(conn: psycopg.Connection, role: str, relation: str) -> str:
    """The RLS policies that apply to the role on a table it has rights on."""
    rows = conn.execute(
        "select lower(p.cmd), p.policyname from pg_policies p"
        " where format('%%I.%%I', p.schemaname, p.tablename) = %s"
        "   and exists (select 1 from unnest(p.roles) r(name)"
        "               where r.name = 'public' or pg_has_role(%s, r.name, 'usage'))"
        " order by 2",
        (relation, role),
    ).fetchall()
    return ", ".join(f"{cmd} {name}" for cmd, name in rows)


def documented(path: Path, begin: str = BEGIN, end: str = END) -> str:
    """The text block in docs/deploy.md between `begin` and `end` (the roles
    statement by default), without the fence."""
    text = path.read_text(encoding="utf-8")
    found = re.search(re.escape(begin) + r"\n```text\n(.*?)```\n" + re.escape(end), text, re.S)
    assert found, f"{path} has no text block between {begin} and {end}"
    return found.group(1).rstrip("\n")
