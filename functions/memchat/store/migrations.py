"""The schema: `supabase/migrations` applied the way the supabase CLI does,
`supabase/schemas` (its current state) applied to a database of its own,
and the catalogs of two databases compared.

Applied versions are recorded in `supabase_migrations.schema_migrations`, the
table `supabase db push` uses, so either tool can take over from the other.
On a database that is not a Supabase one, `infra/bootstrap.sql` (roles and
the `auth` schema) is applied first; it is never applied to Supabase.

The migrations before BASELINE_VERSION were squashed into it: a database
that ran them (SQUASHED_VERSIONS) has the baseline's schema already, so
`migrate` records the baseline as applied there in their place, as
`supabase migration repair` would.

`supabase/schemas/*.sql` (listed in order by `[db.migrations] schema_paths`
in supabase/config.toml, as Supabase's declarative schemas are) is the
schema as it is now; tests/store/test_schema.py checks that it and the
migrations build the same catalog (`catalog`, `differences`), and `memchat
db diff` writes the migration for what can be written from the difference
(`schema_diff`).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import tomllib
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memchat.store.db import connect

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SUPABASE_DIR = PROJECT_ROOT / "supabase"
MIGRATIONS_DIR = SUPABASE_DIR / "migrations"
BOOTSTRAP_SQL = PROJECT_ROOT / "infra" / "bootstrap.sql"
_NAME = re.compile(r"^(\d+)_(.+)\.sql$")
# Serialises concurrent `memchat migrate` runs (CI workers, several dev shells).
_LOCK_KEY = 0x6D656D63686174  # "memchat"

# The migration that replaced the history before it, and that history.
BASELINE_VERSION = "20261201000150"
SQUASHED_VERSIONS = frozenset(
    {
        "20261121000000",
        "20261121000100",
        "20261122000000",
        "20261122000100",
        "20261122000150",
        "20261122000200",
        "20261122000300",
        "20261122000400",
        "20261125000000",
        "20261125000500",
        "20261126000000",
        "20261126000100",
        "20261126000200",
        "20261127000000",
        "20261127000100",
        "20261127000200",
        "20261128000000",
        "20261128010000",
        "20261128020000",
        "20261128030000",
        "20261128040000",
        "20261128050000",
        "20261128060000",
        "20261128070000",
        "20261128080000",
        "20261128090000",
        "20261128100000",
        "20261128110000",
        "20261128120000",
        "20261129000000",
        "20261129010000",
        "20261129020000",
        "20261129030000",
        "20261129040000",
        "20261129050000",
        "20261201000000",
        "20261201000100",
    }
)


class MigrationError(RuntimeError):
    """A database the migrations cannot take further as it is."""


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if match:
            found.append(Migration(match.group(1), match.group(2), path))
    return found


def is_supabase(conn: psycopg.Connection[Any]) -> bool:
    """Supabase databases have the `supabase_admin` role; plain PostgreSQL does not."""
    row = conn.execute("select exists (select 1 from pg_roles where rolname = 'supabase_admin')")
    result = row.fetchone()
    return bool(result and result[0])


def migrate(conninfo: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations; returns the versions applied. Idempotent.

    On a Citus coordinator whose tables are distributed, the distribution
    step runs again after any migration applied (`memchat db distribute`,
    idempotent): a migration that replaces a function puts back its plain
    PostgreSQL form, settings and all, which Citus cannot run (the Citus
    forms, the plan settings, the delegation: docs/deploy.md, "Citus")."""
    applied_now: list[str] = []
    distributed = False
    with connect(conninfo) as conn:
        conn.execute("select pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            if not is_supabase(conn):
                with conn.transaction():
                    conn.execute(BOOTSTRAP_SQL.read_text())
            with conn.transaction():
                conn.execute("create schema if not exists supabase_migrations")
                conn.execute(
                    "create table if not exists supabase_migrations.schema_migrations"
                    " (version text primary key, statements text[], name text)"
                )
            migrations = discover(directory)
            done = _adopt_baseline(conn, migrations, _recorded(conn))
            for migration in migrations:
                if migration.version in done:
                    continue
                text = migration.path.read_text()
                with conn.transaction():
                    conn.execute(text)
                    conn.execute(
                        "insert into supabase_migrations.schema_migrations"
                        " (version, statements, name) values (%s, %s, %s)",
                        (migration.version, [text], migration.name),
                    )
                logger.info("applied migration %s_%s", migration.version, migration.name)
                applied_now.append(migration.version)
            if applied_now:
                from memchat.store.distribute import on_citus, placed

                distributed = on_citus(conn) and bool(placed(conn))
        finally:
            conn.execute("select pg_advisory_unlock(%s)", (_LOCK_KEY,))
    if distributed:
        from memchat.store.distribute import distribute

        distribute(conninfo)
        logger.info("distributed again after the migrations (Citus)")
    return applied_now


def _recorded(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute("select version from supabase_migrations.schema_migrations").fetchall()
    return {row[0] for row in rows}


def _adopt_baseline(
    conn: psycopg.Connection[Any], migrations: list[Migration], done: set[str]
) -> set[str]:
    """The versions to take as applied: `done`, where a database that ran the
    squashed history has the baseline recorded in its place (the rows of the
    history deleted, so that `supabase db push` finds no version it lacks).
    A database with part of that history cannot be taken further."""
    baseline = next((m for m in migrations if m.version == BASELINE_VERSION), None)
    ran = done & SQUASHED_VERSIONS
    if baseline is None or BASELINE_VERSION in done or not ran:
        return done
    if ran != SQUASHED_VERSIONS:
        raise MigrationError(
            f"the database ran {len(ran)} of the {len(SQUASHED_VERSIONS)} migrations that"
            f" {baseline.path.name} replaced (the last: {max(ran)}): migrate it with a checkout"
            " from before the squash first (all of them applied, it takes the baseline as"
            " applied), or start it over"
        )
    note = (
        f"-- not run: the database had run the {len(ran)} migrations this baseline replaced"
        f" ({min(ran)} to {max(ran)})"
    )
    with conn.transaction():
        conn.execute(
            "delete from supabase_migrations.schema_migrations where version = any(%s)",
            (sorted(ran),),
        )
        conn.execute(
            "insert into supabase_migrations.schema_migrations (version, statements, name)"
            " values (%s, %s, %s)",
            (baseline.version, [note], baseline.name),
        )
    logger.info(
        "recorded migration %s_%s as applied in place of the %d it replaced",
        baseline.version,
        baseline.name,
        len(ran),
    )
    return (done - ran) | {baseline.version}


# ------------------------------------------------------------ the schema files


def schema_files(supabase_dir: Path = SUPABASE_DIR) -> list[Path]:
    """The schema files in the order supabase/config.toml lists them
    (`[db.migrations] schema_paths`, paths or glob patterns relative to the
    supabase directory; each file once, where it is first listed)."""
    config = tomllib.loads((supabase_dir / "config.toml").read_text())
    patterns = config.get("db", {}).get("migrations", {}).get("schema_paths", [])
    files: list[Path] = []
    for pattern in patterns:
        relative = pattern.removeprefix("./")
        if any(char in relative for char in "*?["):
            matches = sorted(supabase_dir.glob(relative))
        else:
            path = supabase_dir / relative
            if not path.is_file():
                raise FileNotFoundError(f"{path}: listed in schema_paths, not found")
            matches = [path]
        files.extend(path for path in matches if path not in files)
    return files


def apply_schema(conninfo: str, supabase_dir: Path = SUPABASE_DIR) -> list[Path]:
    """Build the schema from its files on an empty database (after
    infra/bootstrap.sql where it is not a Supabase one), in one transaction;
    returns the files applied. An error names the file."""
    files = schema_files(supabase_dir)
    with connect(conninfo) as conn:
        if not is_supabase(conn):
            with conn.transaction():
                conn.execute(BOOTSTRAP_SQL.read_text())
        with conn.transaction():
            for path in files:
                try:
                    conn.execute(path.read_text())
                except psycopg.Error as exc:
                    raise MigrationError(f"{path.relative_to(supabase_dir)}: {exc}") from exc
    return files


def with_dbname(conninfo: str, dbname: str) -> str:
    params = conninfo_to_dict(conninfo)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@contextmanager
def scratch_database(owner_conninfo: str, label: str) -> Iterator[str]:
    """A new, empty database on `owner_conninfo`'s server (its URL, as that
    owner), with Supabase's stand-in (infra/bootstrap.sql: a new database
    has no `auth` schema, on Supabase too); dropped afterwards."""
    name = f"memchat_scratch_{label}_{uuid.uuid4().hex[:12]}"
    with connect(owner_conninfo) as owner:
        owner.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
        try:
            url = with_dbname(owner_conninfo, name)
            with connect(url) as conn, conn.transaction():
                conn.execute(BOOTSTRAP_SQL.read_text())
            yield url
        finally:
            owner.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))


# ------------------------------------------------------------ catalogs

# The kinds of catalog entries (each key is "<kind> <name>"), in the order
# differences are reported.
KINDS = (
    "schema",
    "extension",
    "default privileges",
    "type",
    "table",
    "partitioned table",
    "view",
    "materialized view",
    "sequence",
    "foreign table",
    "composite type",
    "column",
    "constraint",
    "index",
    "policy",
    "trigger",
    "rule",
    "statistics",
    "function",
    "comment",
)
_RELATION_KINDS = {
    "r": "table",
    "p": "partitioned table",
    "v": "view",
    "m": "materialized view",
    "S": "sequence",
    "f": "foreign table",
    "c": "composite type",
}

_SCHEMAS = """
select n.oid, n.nspname from pg_catalog.pg_namespace n
 where n.nspname not in ('pg_catalog', 'information_schema', 'supabase_migrations')
   and n.nspname !~ '^pg_(toast|temp_|toast_temp_)'
"""


# An ACL is read as its sorted aclitem texts, the owner's implicit rights
# spelled out (acldefault: what `revoke ... from public` of nothing granted
# writes). Objects of extensions (pgvector's) are left out.
# Each query's first column is the object's name, the others its properties.
_CATALOG_QUERIES: dict[str, str] = {
    "schema": """
        select n.nspname, pg_catalog.pg_get_userbyid(n.nspowner) as owner,
               array(select a::text from unnest(coalesce(n.nspacl,
                        pg_catalog.acldefault('n', n.nspowner))) a order by 1) as acl
          from pg_catalog.pg_namespace n where n.oid = any(%(schemas)s)""",
    "extension": """
        select e.extname, e.extversion as version, n.nspname as schema
          from pg_catalog.pg_extension e
          join pg_catalog.pg_namespace n on n.oid = e.extnamespace""",
    "default privileges": """
        select pg_catalog.pg_get_userbyid(d.defaclrole) || ' in '
                 || coalesce(n.nspname, 'every schema') || ' on ' || d.defaclobjtype::text,
               array(select a::text from unnest(d.defaclacl) a order by 1) as acl
          from pg_catalog.pg_default_acl d
          left join pg_catalog.pg_namespace n on n.oid = d.defaclnamespace""",
    "type": """
        select t.oid::pg_catalog.regtype::text, t.typtype::text as kind,
               pg_catalog.format_type(t.typbasetype, t.typtypmod) as base,
               t.typnotnull as not_null, pg_catalog.pg_get_expr(t.typdefaultbin, 0) as default,
               array(select e.enumlabel::text from pg_catalog.pg_enum e
                      where e.enumtypid = t.oid order by e.enumsortorder) as labels,
               array(select pg_catalog.pg_get_constraintdef(c.oid) from pg_catalog.pg_constraint c
                      where c.contypid = t.oid order by c.conname) as constraints,
               pg_catalog.pg_get_userbyid(t.typowner) as owner,
               array(select a::text from unnest(coalesce(t.typacl,
                        pg_catalog.acldefault('T', t.typowner))) a order by 1) as acl
          from pg_catalog.pg_type t
         where t.typnamespace = any(%(schemas)s)
           and t.typtype in ('d', 'e', 'r', 'm', 'b', 'p')
           and not exists (select 1 from pg_catalog.pg_type a where a.typarray = t.oid)
           and not exists (select 1 from pg_catalog.pg_depend x
                            where x.classid = 'pg_type'::pg_catalog.regclass
                              and x.objid = t.oid and x.deptype = 'e')""",
    "relation": """
        select c.oid::pg_catalog.regclass::text, c.relkind::text as kind,
               pg_catalog.pg_get_userbyid(c.relowner) as owner,
               c.relpersistence::text as persistence,
               c.relrowsecurity as row_security, c.relforcerowsecurity as forced_row_security,
               array(select o from unnest(c.reloptions) o order by 1) as options,
               (select string_agg(p.inhparent::pg_catalog.regclass::text, ', '
                                  order by p.inhseqno)
                  from pg_catalog.pg_inherits p where p.inhrelid = c.oid) as parent,
               pg_catalog.pg_get_expr(c.relpartbound, c.oid) as partition_bound,
               case when c.relkind = 'p' then pg_catalog.pg_get_partkeydef(c.oid) end
                 as partition_key,
               c.relreplident::text as replica_identity,
               case when c.relkind in ('r', 'p') then c.reltuples >= 0 end as analysed,
               case when c.relkind in ('v', 'm') then pg_catalog.pg_get_viewdef(c.oid) end
                 as definition,
               (select row(s.seqtypid::pg_catalog.regtype, s.seqstart, s.seqincrement,
                           s.seqmax, s.seqmin, s.seqcache, s.seqcycle)::text
                  from pg_catalog.pg_sequence s where s.seqrelid = c.oid) as sequence,
               array(select a::text from unnest(coalesce(c.relacl,
                        pg_catalog.acldefault('r', c.relowner))) a order by 1) as acl
          from pg_catalog.pg_class c
         where c.relnamespace = any(%(schemas)s)
           and c.relkind in ('r', 'p', 'v', 'm', 'S', 'f', 'c')
           and not exists (select 1 from pg_catalog.pg_depend x
                            where x.classid = 'pg_class'::pg_catalog.regclass
                              and x.objid = c.oid and x.deptype = 'e')""",
    "column": """
        select a.attrelid::pg_catalog.regclass::text || '.' || pg_catalog.quote_ident(a.attname),
               pg_catalog.row_number() over (partition by a.attrelid order by a.attnum)
                 as position,
               pg_catalog.format_type(a.atttypid, a.atttypmod) as type,
               a.attnotnull as not_null,
               pg_catalog.pg_get_expr(d.adbin, d.adrelid) as default,
               a.attidentity::text as identity, a.attgenerated::text as generated,
               a.attstorage::text as storage, a.attcompression::text as compression,
               l.collname as collation, a.attstattarget::text as statistics,
               array(select o from unnest(a.attoptions) o order by 1) as options,
               array(select x::text from unnest(a.attacl) x order by 1) as acl
          from pg_catalog.pg_attribute a
          join pg_catalog.pg_class c on c.oid = a.attrelid
          left join pg_catalog.pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
          left join pg_catalog.pg_collation l on l.oid = a.attcollation
         where c.relnamespace = any(%(schemas)s) and c.relkind in ('r', 'p', 'v', 'm', 'f', 'c')
           and a.attnum > 0 and not a.attisdropped""",
    "constraint": """
        select c.conrelid::pg_catalog.regclass::text || ' ' || pg_catalog.quote_ident(c.conname),
               c.contype::text as kind, pg_catalog.pg_get_constraintdef(c.oid) as definition,
               c.condeferrable as deferrable, c.condeferred as deferred,
               c.convalidated as validated, c.conislocal as local, c.coninhcount as inherited,
               c.connoinherit as no_inherit
          from pg_catalog.pg_constraint c
          join pg_catalog.pg_class r on r.oid = c.conrelid
         where r.relnamespace = any(%(schemas)s)""",
    "index": """
        select c.oid::pg_catalog.regclass::text, pg_catalog.pg_get_indexdef(c.oid) as definition,
               array(select o from unnest(c.reloptions) o order by 1) as options,
               (select string_agg(p.inhparent::pg_catalog.regclass::text, ', ')
                  from pg_catalog.pg_inherits p where p.inhrelid = c.oid) as parent,
               i.indisvalid as valid, i.indisclustered as clustered,
               i.indisreplident as replica_identity
          from pg_catalog.pg_class c join pg_catalog.pg_index i on i.indexrelid = c.oid
         where c.relnamespace = any(%(schemas)s) and c.relkind in ('i', 'I')""",
    "policy": """
        select p.polrelid::pg_catalog.regclass::text || ' ' || pg_catalog.quote_ident(p.polname),
               p.polcmd::text as command, p.polpermissive as permissive,
               array(select case when r = 0 then 'public' else pg_catalog.pg_get_userbyid(r) end
                       from unnest(p.polroles) r order by 1) as roles,
               pg_catalog.pg_get_expr(p.polqual, p.polrelid) as using,
               pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) as with_check
          from pg_catalog.pg_policy p
          join pg_catalog.pg_class r on r.oid = p.polrelid
         where r.relnamespace = any(%(schemas)s)""",
    "trigger": """
        select t.tgrelid::pg_catalog.regclass::text || ' ' || pg_catalog.quote_ident(t.tgname),
               pg_catalog.pg_get_triggerdef(t.oid) as definition, t.tgenabled::text as enabled,
               t.tgparentid <> 0 as cloned
          from pg_catalog.pg_trigger t
          join pg_catalog.pg_class r on r.oid = t.tgrelid
         where r.relnamespace = any(%(schemas)s) and not t.tgisinternal""",
    "rule": """
        select r.ev_class::pg_catalog.regclass::text || ' ' || pg_catalog.quote_ident(r.rulename),
               pg_catalog.pg_get_ruledef(r.oid) as definition, r.ev_enabled::text as enabled
          from pg_catalog.pg_rewrite r
          join pg_catalog.pg_class c on c.oid = r.ev_class
         where c.relnamespace = any(%(schemas)s) and r.rulename <> '_RETURN'""",
    "statistics": """
        select s.stxnamespace::pg_catalog.regnamespace::text || '.'
                 || pg_catalog.quote_ident(s.stxname),
               pg_catalog.pg_get_statisticsobjdef(s.oid) as definition
          from pg_catalog.pg_statistic_ext s where s.stxnamespace = any(%(schemas)s)""",
    "function": """
        select p.oid::pg_catalog.regprocedure::text, p.prokind::text as kind,
               case when p.prokind <> 'a' then pg_catalog.pg_get_functiondef(p.oid) end
                 as definition,
               pg_catalog.pg_get_userbyid(p.proowner) as owner,
               array(select a::text from unnest(coalesce(p.proacl,
                        pg_catalog.acldefault('f', p.proowner))) a order by 1) as acl
          from pg_catalog.pg_proc p
         where p.pronamespace = any(%(schemas)s)
           and not exists (select 1 from pg_catalog.pg_depend x
                            where x.classid = 'pg_proc'::pg_catalog.regclass
                              and x.objid = p.oid and x.deptype = 'e')""",
    "comment": """
        select pg_catalog.pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description
          from pg_catalog.pg_description d
          cross join lateral pg_catalog.pg_identify_object(d.classoid, d.objoid, d.objsubid) o
         where (o.schema = any(%(schema_names)s)
                or (d.classoid = 'pg_catalog.pg_namespace'::pg_catalog.regclass
                    and d.objoid = any(%(schemas)s)))
           and not exists (select 1 from pg_catalog.pg_depend x
                            where x.classid = d.classoid and x.objid = d.objoid
                              and x.deptype = 'e')""",
}

Catalog = dict[str, dict[str, Any]]


def catalog(conninfo: str) -> Catalog:
    """What the schema is, read off the database's catalog: one entry per
    object (`"<kind> <name>"`: its properties), over every schema but
    PostgreSQL's own and `supabase_migrations`. Roles, their memberships and
    settings belong to the server, not the database, and are not in it;
    neither are rows."""
    with connect(conninfo) as conn:
        return catalog_of(conn)


def catalog_of(conn: psycopg.Connection[Any]) -> Catalog:
    """`catalog` of what `conn` sees (its transaction's changes included)."""
    entries: Catalog = {}
    with conn.transaction():
        # Every name qualified with its schema, whatever the search path was.
        conn.execute("set local search_path = ''")
        schemas = conn.execute(_SCHEMAS).fetchall()
        params = {"schemas": [oid for oid, _ in schemas], "schema_names": [n for _, n in schemas]}
        for query, sql_text in _CATALOG_QUERIES.items():
            cursor = conn.execute(sql_text.encode(), params)
            properties = [column.name for column in cursor.description or []][1:]
            for name, *values in cursor.fetchall():
                entry = dict(zip(properties, values, strict=True))
                kind = _RELATION_KINDS[entry.pop("kind")] if query == "relation" else query
                entries[f"{kind} {name}"] = entry
    return entries


def _kind_of(key: str) -> str:
    return max((k for k in KINDS if key.startswith(k + " ")), key=len)


def _order(key: str) -> tuple[int, str]:
    return KINDS.index(_kind_of(key)), key


def _first_line_apart(a: str, b: str) -> str:
    lines_a, lines_b = a.splitlines(), b.splitlines()
    for number, (line_a, line_b) in enumerate(zip(lines_a, lines_b, strict=False), start=1):
        if line_a != line_b:
            return f"line {number}: {line_a.strip()!r} / {line_b.strip()!r}"
    number = min(len(lines_a), len(lines_b)) + 1
    return f"line {number}: {len(lines_a)} lines / {len(lines_b)} lines"


def differences(
    a: Catalog, b: Catalog, labels: Sequence[str] = ("the migrations", "the schema files")
) -> list[str]:
    """How catalog `b` differs from `a`, one line per object (in KINDS
    order), each naming the object and its first differing property; [] if
    they agree."""
    found = []
    for key in sorted(a.keys() | b.keys(), key=_order):
        if key not in b:
            found.append(f"{key}: only in {labels[0]}")
        elif key not in a:
            found.append(f"{key}: only in {labels[1]}")
        elif a[key] != b[key]:
            prop = next(p for p in a[key] if a[key][p] != b[key].get(p))
            va, vb = a[key][prop], b[key].get(prop)
            if isinstance(va, str) and isinstance(vb, str) and "\n" in va + vb:
                shown = _first_line_apart(va, vb)
            else:
                shown = f"{va!r} / {vb!r}"
            found.append(f"{key}: {prop} differs ({labels[0]} / {labels[1]}): {shown}")
    return found


# ------------------------------------------------------------ memchat db diff

# Functions that another function writes when it runs (EXECUTE), for the
# server it runs on (its pgvector, the column's size): a change to them is
# made by running that function again, never by copying what it wrote here.
WRITTEN_BY = {
    "memchat.nearest_keys_indexed(uuid,text,text,extensions.vector,integer)": (
        "select memchat.index_recall_keys();"
    ),
}


@dataclass
class SchemaDiff:
    """What `memchat db diff` writes, and what it leaves to a hand-written
    migration."""

    statements: list[str] = field(default_factory=list)  # the migration's
    written: list[str] = field(default_factory=list)  # one line per object written
    remaining: list[str] = field(default_factory=list)  # differences left

    def migration(self) -> str:
        header = [
            "-- Written by `memchat db diff`: what supabase/schemas has that the",
            "-- migrations before this one did not make:",
            *(f"--   {what}" for what in self.written),
            "",
            # SQL functions' bodies are checked when they run, not when made
            # (as pg_dump's output does): one may call another made after it.
            "set local check_function_bodies = off;",
            "",
            "",
        ]
        return "\n".join(header) + "\n\n".join(self.statements) + "\n"


def schema_diff(owner_conninfo: str, supabase_dir: Path = SUPABASE_DIR) -> SchemaDiff:
    """The migration that makes what `supabase_dir`'s migrations build agree
    with its schema files, as far as it can be written from the two
    catalogs: functions, views, policies and row-level security, triggers,
    privileges and comments. Both are built in scratch
    databases on the owner's server; the migration is applied to the first as
    it is written (a statement that fails there is left out, and said), and
    what then still differs (tables, columns, constraints, indexes, types,
    schemas, extensions...) is `remaining`."""
    result = SchemaDiff()
    with (
        scratch_database(owner_conninfo, "migrations") as built_url,
        scratch_database(owner_conninfo, "schema") as wanted_url,
    ):
        migrate(built_url, supabase_dir / "migrations")
        apply_schema(wanted_url, supabase_dir)
        wanted = catalog(wanted_url)
        with connect(built_url) as conn, conn.transaction():
            conn.execute("set local check_function_bodies = off")
            built = catalog_of(conn)
            if not differences(built, wanted):
                return result
            # Definitions first; then the rights and comments they were
            # made with, compared with the schema's.
            for step in (_definitions, _privileges, _comments):
                for what, statements in step(built, wanted):
                    try:
                        with conn.transaction():
                            for statement in statements:
                                conn.execute(statement.encode())
                    except psycopg.Error as exc:
                        result.remaining.append(f"{what}: not written ({exc})".strip())
                        continue
                    result.statements.extend(statements)
                    result.written.append(what)
                built = catalog_of(conn)
            result.remaining.extend(differences(built, wanted))
    return result


Step = list[tuple[str, list[str]]]


def _changed(built: Catalog, wanted: Catalog, kind: str) -> list[str]:
    """The names of the objects of `kind` that differ (or are in one only)."""
    return sorted(
        key.split(" ", len(kind.split()))[-1]
        for key in built.keys() | wanted.keys()
        if _kind_of(key) == kind and built.get(key) != wanted.get(key)
    )


def _definitions(built: Catalog, wanted: Catalog) -> Step:
    """Views that change are dropped first (and those that read them), then
    policies and triggers that change; functions are made or replaced, then
    the views, policies and triggers made again."""
    steps: Step = []
    views = _view_order(built, _changed(built, wanted, "view"))
    for name in reversed(views):
        if f"view {name}" in built:
            steps.append((f"view {name} (dropped)", [f"drop view {name};"]))
    for name in _changed(built, wanted, "policy"):
        if f"policy {name}" in built:
            table, policy_name = name.split(" ", 1)
            steps.append((f"policy {name} (dropped)", [f"drop policy {policy_name} on {table};"]))
    for name in _changed(built, wanted, "trigger"):
        old = built.get(f"trigger {name}")
        if old is not None and not old["cloned"]:
            table, trigger_name = name.split(" ", 1)
            steps.append(
                (f"trigger {name} (dropped)", [f"drop trigger {trigger_name} on {table};"])
            )
    # A function another writes comes after the one that writes it.
    functions = sorted(_changed(built, wanted, "function"), key=lambda n: (n in WRITTEN_BY, n))
    for name in functions:
        step = _function(name, built.get(f"function {name}"), wanted.get(f"function {name}"))
        if step is not None:
            steps.append(step)
    for name in _view_order(wanted, views):
        view = wanted.get(f"view {name}")
        if view is not None:
            options = f" with ({', '.join(view['options'])})" if view["options"] else ""
            body = view["definition"].rstrip().rstrip(";")
            steps.append((f"view {name}", [f"create view {name}{options} as\n{body};"]))
    for name in _changed(built, wanted, "policy"):
        policy = wanted.get(f"policy {name}")
        if policy is not None:
            steps.append((f"policy {name}", [_create_policy(name, policy)]))
    for key in sorted(wanted, key=_order):
        if _kind_of(key) in ("table", "partitioned table") and key in built:
            step = _row_security(key.split(" ")[-1], built[key], wanted[key])
            if step is not None:
                steps.append(step)
    for name in _changed(built, wanted, "trigger"):
        trigger = wanted.get(f"trigger {name}")
        if trigger is not None and not trigger["cloned"]:
            steps.append((f"trigger {name}", [trigger["definition"] + ";"]))
    return steps


def _view_order(entries: Catalog, names: list[str]) -> list[str]:
    """`names` and every view that reads one of them, each after those it
    reads (by the names its definition mentions)."""
    views = {
        key[len("view ") :]: entry["definition"] or ""
        for key, entry in entries.items()
        if _kind_of(key) == "view"
    }
    chosen = set(names)
    while True:
        readers = {
            name
            for name, definition in views.items()
            if name not in chosen and any(_mentions(definition, other) for other in chosen)
        }
        if not readers:
            break
        chosen |= readers
    ordered: list[str] = []
    while len(ordered) < len(chosen):
        ready = [
            name
            for name in sorted(chosen - set(ordered))
            if all(o in ordered or o == name for o in chosen if _mentions(views.get(name, ""), o))
        ]
        ordered.extend(ready[:1] or sorted(chosen - set(ordered)))
    return ordered


def _mentions(definition: str, name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w.])", definition) is not None


def _function(
    name: str, old: dict[str, Any] | None, new: dict[str, Any] | None
) -> tuple[str, list[str]] | None:
    if new is None:
        return f"function {name} (dropped)", [f"drop function {name};"]
    if name in WRITTEN_BY:
        if old is not None and old["definition"] == new["definition"]:
            return None
        return f"function {name} (written again)", [WRITTEN_BY[name]]
    if old is not None and old["definition"] == new["definition"]:
        return None
    statements = []
    if old is not None and _header(old["definition"]) != _header(new["definition"]):
        # `create or replace` keeps a function's result type and argument
        # names: another one is a new function (its rights granted again).
        statements.append(f"drop function {name};")
    statements.append(new["definition"].rstrip() + ";")
    return f"function {name}", statements


def _header(definition: str) -> str:
    """A function's arguments and result: pg_get_functiondef's text up to LANGUAGE."""
    return definition.split("\n LANGUAGE ", 1)[0]


def _create_policy(name: str, policy: dict[str, Any]) -> str:
    table, policy_name = name.split(" ", 1)
    commands = {"r": "select", "a": "insert", "w": "update", "d": "delete", "*": "all"}
    roles = ", ".join(_role(r) for r in policy["roles"])
    statement = (
        f"create policy {policy_name} on {table}"
        f"{'' if policy['permissive'] else ' as restrictive'}"
        f" for {commands[policy['command']]} to {roles}"
    )
    if policy["using"] is not None:
        statement += f"\n  using ({policy['using']})"
    if policy["with_check"] is not None:
        statement += f"\n  with check ({policy['with_check']})"
    return statement + ";"


def _role(name: str) -> str:
    if name == "public" or re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return name
    return sql.Identifier(name).as_string()


def _row_security(
    table: str, old: dict[str, Any], new: dict[str, Any]
) -> tuple[str, list[str]] | None:
    statements = []
    if old["row_security"] != new["row_security"]:
        switch = "enable" if new["row_security"] else "disable"
        statements.append(f"alter table {table} {switch} row level security;")
    if old["forced_row_security"] != new["forced_row_security"]:
        switch = "force" if new["forced_row_security"] else "no force"
        statements.append(f"alter table {table} {switch} row level security;")
    return (f"row-level security of {table}", statements) if statements else None


_PRIVILEGES = {
    "r": "select",
    "a": "insert",
    "w": "update",
    "d": "delete",
    "D": "truncate",
    "x": "references",
    "t": "trigger",
    "m": "maintain",
    "X": "execute",
    "U": "usage",
    "C": "create",
}
_ACLITEM = re.compile(r'^(?P<grantee>"(?:[^"]|"")*"|[^=]*)=(?P<privileges>[^/]*)/')


def _rights(acl: list[str] | None, owner: str) -> dict[str, str]:
    """Each grantee's privilege letters (`*`: with grant option), the owner's
    left out."""
    rights = {}
    for item in acl or []:
        match = _ACLITEM.match(item)
        if match is None:
            continue
        grantee = match["grantee"]
        if grantee.startswith('"'):
            grantee = grantee[1:-1].replace('""', '"')
        if grantee != owner:
            rights[grantee or "public"] = match["privileges"]
    return rights


def _grants(
    target: str, old: list[str] | None, new: list[str] | None, owner: str, columns: str = ""
) -> list[str]:
    """The statements that take the rights on `target` from ACL `old` to
    `new` (sorted aclitem texts)."""
    before, after = _rights(old, owner), _rights(new, owner)
    statements = []
    for grantee in sorted(before.keys() | after.keys(), key=lambda g: (g != "public", g)):
        if before.get(grantee) == after.get(grantee):
            continue
        role = _role(grantee)
        if grantee in before:
            statements.append(f"revoke all{columns} on {target} from {role};")
        letters = after.get(grantee, "")
        for option, suffix in ((False, ""), (True, " with grant option")):
            privileges = [
                _PRIVILEGES[letter] + columns
                for i, letter in enumerate(letters)
                if letter != "*" and (letters[i + 1 : i + 2] == "*") == option
            ]
            if privileges:
                statements.append(f"grant {', '.join(privileges)} on {target} to {role}{suffix};")
    return statements


def _privileges(built: Catalog, wanted: Catalog) -> Step:
    """Rights on schemas, tables, views, sequences, columns and functions
    that are not the schema's (those of what was just made included)."""
    targets = {
        "schema": "schema {}",
        "table": "table {}",
        "partitioned table": "table {}",
        "view": "table {}",
        "materialized view": "table {}",
        "sequence": "sequence {}",
        "function": "function {}",
    }
    steps: Step = []
    for key in sorted(wanted.keys() & built.keys(), key=_order):
        kind = _kind_of(key)
        old, new = built[key], wanted[key]
        if "acl" not in new or old["acl"] == new["acl"]:
            continue
        name = key[len(kind) + 1 :]
        if kind == "column":
            table, _, column = name.rpartition(".")
            statements = _grants(f"table {table}", old["acl"], new["acl"], "", f" ({column})")
        elif kind in targets:
            statements = _grants(targets[kind].format(name), old["acl"], new["acl"], new["owner"])
        else:
            continue
        if statements:
            steps.append((f"privileges on {key}", statements))
    return steps


def _comments(built: Catalog, wanted: Catalog) -> Step:
    steps: Step = []
    for described in _changed(built, wanted, "comment"):
        target = _comment_target(described)
        if target is not None:
            text = wanted.get(f"comment {described}", {}).get("description")
            steps.append((f"comment on {described}", [f"comment on {target} is {_literal(text)};"]))
    return steps


_DESCRIBED = re.compile(
    r"^(?:column (?P<column>\S+) of (?:table|view|materialized view|foreign table) (?P<of>\S+)"
    r"|(?P<kind>constraint|policy|trigger|rule) (?P<name>\S+) on (?:table |view )?(?P<on>\S+)"
    r"|(?P<object>(?:materialized view|foreign table|table|view|function|procedure|schema|index"
    r"|sequence|type) .+))$"
)


def _comment_target(described: str) -> str | None:
    """`comment on`'s object for pg_describe_object's text (None: none this writes)."""
    match = _DESCRIBED.match(described)
    if match is None:
        return None
    if match["column"]:
        return f"column {match['of']}.{match['column']}"
    if match["kind"]:
        return f"{match['kind']} {match['name']} on {match['on']}"
    return match["object"]


def _literal(value: str | None) -> str:
    if value is None:
        return "null"
    return "'" + value.replace("'", "''") + "'"


def next_version(directory: Path, now: dt.datetime | None = None) -> str:
    """A migration version after every one in `directory`: the time (UTC), or
    one second past the last version when that is later."""
    version = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%d%H%M%S")
    existing = [migration.version for migration in discover(directory)]
    if existing and version <= max(existing):
        last = dt.datetime.strptime(max(existing), "%Y%m%d%H%M%S")
        version = (last + dt.timedelta(seconds=1)).strftime("%Y%m%d%H%M%S")
    return version
