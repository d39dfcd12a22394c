"""memchat on Citus: `memchat db distribute` (docs/deploy.md, "Citus").

The migrations build the same schema on Citus's coordinator as on plain
PostgreSQL. This step then makes every table of a user's rows a distributed
table, hash-distributed by `user_id` and co-located with `chat_sessions`
(a user's rows of every table live in one shard group, on one node), and the
small shared tables reference tables (a copy on every node). What it changes
on the way, in one transaction:

- the policies: Citus refuses subqueries in a distributed table's policies,
  so `(select auth.uid())` becomes `auth.uid()` and the checks with an
  EXISTS take the form `supabase/citus/policies.sql` gives them;
- the foreign keys: dropped while the tables move, then made again between
  the distributed tables and to the reference ones (Citus enforces both);
- the triggers: kept (`citus.enable_unsafe_triggers`; each runs on the
  shard of its row), but those that read a statement's transition table,
  which Citus cannot plan, become the row triggers of
  `supabase/citus/triggers.sql`, and the TRUNCATE one goes;
- the workers' claims: without FOR UPDATE SKIP LOCKED, which Citus runs on
  no distributed table, as `supabase/citus/workers.sql` writes them; the
  history import a row per statement (`supabase/citus/import.sql`: Citus
  would copy an INSERT ... SELECT's rows, which row-level security
  refuses); after a later `memchat migrate`, run this again;
- the login roles: `citus.propagate_set_commands = 'local'`, so the claims
  a request sets (memchat.begin_request) reach every worker it touches, and
  custom plans only (`plan_cache_mode`, the functions' too), which Citus
  prunes to the caller's shard;
- `memchat_user`, `authenticated` and `anon` may log in: Citus opens a
  worker connection as the role the statement runs as (docs/deploy.md says
  who may connect);
- identity columns: who may insert a row may insert its id, which Citus
  takes on the coordinator and sends to the shard;
- the turn's functions (DELEGATED_FUNCTIONS) are delegated by their
  `p_user_id` to the worker holding that user's shards;
- after that transaction, the partitions' shards get their columns'
  storage as the migrations set it (the recall keys' vectors in the row),
  which Citus leaves at the type's: again after a shard move.

Run it again and it does nothing; run it where Citus is absent and it
refuses (NotCitus). The migrations must have been applied first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from memchat.store.db import REQUEST_ROLE, connect
from memchat.store.migrations import SUPABASE_DIR, discover

CITUS_POLICIES = SUPABASE_DIR / "citus" / "policies.sql"
CITUS_TRIGGERS = SUPABASE_DIR / "citus" / "triggers.sql"
CITUS_WORKERS = SUPABASE_DIR / "citus" / "workers.sql"
CITUS_IMPORT = SUPABASE_DIR / "citus" / "import.sql"

# Tables read by every user and written rarely: a copy on every node.
REFERENCE_TABLES = (
    "auth.users",
    "memchat.limits",
    "memchat.analytics_key",
    "memchat.word_statistics",
    "memchat.common_words",
)
# A user's rows, distributed by user_id; the first is the co-location group's.
DISTRIBUTED_TABLES = (
    "public.chat_sessions",
    "public.user_agent_active_sessions",
    "public.chat_message_history",
    "public.agent_long_term_memory",
    "memchat.notes_versions",
    "memchat.rate_buckets",
    "memchat.turn_claims",
    "memchat.summary_queue",
    "memchat.embedding_queue",
    "memchat.message_feedback",
    "memchat.message_facts_made",
    "memchat.memories",
    "memchat.forgotten_memories",
    "memchat.message_embeddings",
    "memchat.message_facts",
)
DISTRIBUTION_COLUMN = "user_id"
# The request functions run on the worker holding the caller's shards, in
# the request's transaction: one hop from the coordinator, not one per
# statement. Each takes its caller's id first (and refuses another's).
DELEGATED_FUNCTIONS = (
    "memchat.load_context(uuid, uuid, text, integer, boolean, text, text, double precision,"
    " integer, double precision, integer)",
    "memchat.record_turn(uuid, uuid, text, text, jsonb, interval, text, text, integer,"
    " boolean, extensions.vector, text, integer)",
    "memchat.recall(uuid, uuid, text, integer, extensions.vector, text, text, integer,"
    " double precision, double precision, timestamptz, timestamptz)",
    "memchat.recall_memories(uuid, text, extensions.vector, text, text, integer, double precision)",
    "memchat.import_memories(uuid, jsonb, integer)",
    "memchat.save_notes(uuid, text, text, integer)",
    "memchat.restore_notes(uuid, text, integer, integer)",
    "memchat.chat_stats(uuid, text)",
    "memchat.session_stats(uuid, uuid)",
    "memchat.import_sessions(uuid, jsonb, jsonb, jsonb, interval, jsonb)",
)

# The login roles of memchat's statements: their sessions get these settings.
LOGIN_ROLES = ("memchat_api", "memchat_worker", "memchat_cleanup")
SESSION_SETTINGS = (
    # A transaction block's SET LOCAL goes to the workers it reaches: the
    # claims a request sets (memchat.begin_request).
    ("citus.propagate_set_commands", "local"),
    # Citus prunes to one shard by the value of user_id: a generic plan
    # (PostgreSQL's choice after a statement's fifth run in a session, or a
    # function's plan_cache_mode) cannot be planned distributed when it
    # joins tables, and crashes the server in ON CONFLICT DO UPDATE
    # (docs/deploy.md, "Citus").
    ("plan_cache_mode", "force_custom_plan"),
)

# The roles a statement switches to (the API's requests; the Data API's):
# Citus connects to the workers as the role a statement runs as.
STATEMENT_ROLES = (REQUEST_ROLE, "authenticated", "anon")

# Supabase's recommended form, which Citus refuses in a distributed table's policy.
_SELECT_UID = re.compile(r"\(\s*SELECT\s+auth\.uid\(\)\s+AS\s+uid\s*\)", re.IGNORECASE)
_SUBQUERY = re.compile(r"\bSELECT\b", re.IGNORECASE)


class NotCitus(RuntimeError):
    """The database is not a Citus coordinator (or is not ready for this step)."""


@dataclass(frozen=True)
class Distribution:
    """What `distribute` did: the tables it made reference and distributed
    tables (empty: they already were)."""

    citus_version: str
    reference: tuple[str, ...]
    distributed: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.reference or self.distributed)


def citus_version(conn: psycopg.Connection[Any]) -> str | None:
    """The citus extension's version on this database, None without it."""
    row = conn.execute("select extversion from pg_extension where extname = 'citus'").fetchone()
    return str(row[0]) if row else None


def on_citus(conn: psycopg.Connection[Any]) -> bool:
    """Whether `conn` is to a Citus database (`memchat db distribute`)."""
    return citus_version(conn) is not None


def placed(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """memchat's tables Citus holds, by name: 'reference' or 'distributed'."""
    rows = conn.execute(
        """
        select n.nspname || '.' || c.relname,
               case when p.partmethod = 'n' then 'reference' else 'distributed' end
          from pg_dist_partition p
          join pg_class c on c.oid = p.logicalrelid
          join pg_namespace n on n.oid = c.relnamespace
         where p.logicalrelid = any(%s::regclass[])
        """,
        ([*REFERENCE_TABLES, *DISTRIBUTED_TABLES],),
    ).fetchall()
    return dict(rows)


def _table(name: str) -> sql.Identifier:
    schema, table = name.split(".")
    return sql.Identifier(schema, table)


def distribute(conninfo: str) -> Distribution:
    """Distribute memchat's tables on the Citus coordinator at `conninfo` (its
    owner's connection: the migrations' rights). Idempotent."""
    with connect(conninfo) as conn:
        version = citus_version(conn)
        if version is None:
            raise NotCitus(
                "this database has no citus extension: `memchat db distribute` runs on a"
                ' Citus coordinator (docs/deploy.md, "Citus")'
            )
        _require_migrated(conn)
        before = placed(conn)
        todo_reference = tuple(t for t in REFERENCE_TABLES if t not in before)
        todo_distributed = tuple(t for t in DISTRIBUTED_TABLES if t not in before)
        with conn.transaction():
            conn.execute("set local citus.enable_unsafe_triggers = on")
            # Foreign keys to reference tables: one connection per node.
            conn.execute("set local citus.multi_shard_modify_mode = 'sequential'")
            if todo_reference or todo_distributed:
                keys = _drop_foreign_keys(conn)
                _rewrite_policies(conn)
                for table in todo_reference:
                    conn.execute("select create_reference_table(%s)", (table,))
                anchor = DISTRIBUTED_TABLES[0]
                for table in todo_distributed:
                    conn.execute(
                        "select create_distributed_table(%s, %s, colocate_with => %s)",
                        (table, DISTRIBUTION_COLUMN, "none" if table == anchor else anchor),
                    )
                for table, name, definition in keys:
                    conn.execute(
                        sql.SQL("alter table {} add constraint {} {}").format(
                            _table(table), sql.Identifier(name), sql.SQL(definition)
                        )
                    )
            for script in (CITUS_TRIGGERS, CITUS_WORKERS, CITUS_IMPORT):
                for statement in statements(script.read_text()):
                    conn.execute(statement)
            _set_sessions(conn)
            for function in DELEGATED_FUNCTIONS:
                conn.execute(
                    "select create_distributed_function(%s, 'p_user_id',"
                    " colocate_with => %s, force_delegation => true)",
                    (function, DISTRIBUTED_TABLES[0]),
                )
            _grant_identity_columns(conn)
        _shard_storage(conn)
    return Distribution(version, todo_reference, todo_distributed)


# A partition's columns with the storage the migrations gave them, other
# than their type's (the recall keys' vectors and lexemes: MAIN, in the
# row). Citus makes a partition's shards, here or after a shard move, with
# the type's storage (it writes a column's storage only where the column is
# not inherited) and refuses ALTER TABLE ... SET STORAGE on a distributed
# table: so every shard of theirs gets it here, and its rows stored out of
# line before are written again in the row.
_PARTITION_STORAGE = """
select p.logicalrelid::regclass::text, a.attname::text,
       case a.attstorage when 'p' then 'plain' when 'e' then 'external'
                         when 'm' then 'main' else 'extended' end,
       pg_catalog.format_type(a.atttypid, a.atttypmod)
  from pg_dist_partition p
  join pg_attribute a on a.attrelid = p.logicalrelid
  join pg_type t on t.oid = a.atttypid
 where a.attnum > 0 and not a.attisdropped and a.attinhcount > 0
   and a.attstorage <> t.typstorage
 order by 1, 2
"""


def _shard_storage(conn: psycopg.Connection[Any]) -> None:
    """Each partition shard's columns stored as the partition's are
    (_PARTITION_STORAGE), by commands Citus runs on every shard
    (run_command_on_shards: outside this transaction, after it)."""
    for table, column, storage, type_name in conn.execute(_PARTITION_STORAGE).fetchall():
        name = sql.Identifier(column)
        commands = [
            sql.SQL("alter table %s alter column {} set storage {}").format(name, sql.SQL(storage))
        ]
        if storage != "external":
            # Its values stored out of line before: one made again is stored
            # as the column's storage says (one kept unchanged is not).
            commands.append(
                sql.SQL(
                    "update %s set {c} = {c}::text::{t}"
                    " where pg_catalog.pg_column_toast_chunk_id({c}) is not null"
                ).format(c=name, t=sql.SQL(type_name))
            )
        for command in commands:
            failed = conn.execute(
                "select r.result from run_command_on_shards(%s, %s) r where not r.success",
                (table, command.as_string(conn)),
            ).fetchall()
            if failed:
                raise NotCitus(f"{table}.{column} storage on its shards: {failed[0][0]}")


def statements(script: str) -> list[str]:
    """A SQL file's statements, one at a time: Citus sends a DDL statement's
    text to the workers as it came, and a worker takes one statement per
    command. A statement ends with `;` at the end of a line outside a
    dollar-quoted body (`$$`); comments between statements are dropped."""
    found: list[str] = []
    current: list[str] = []
    quoted = False
    for line in script.splitlines():
        if not current and not quoted and (not line.strip() or line.lstrip().startswith("--")):
            continue
        current.append(line)
        quoted ^= line.count("$$") % 2 == 1
        if not quoted and line.rstrip().endswith(";"):
            found.append("\n".join(current))
            current = []
    if current:
        raise ValueError(f"a statement without its ending ';': {current[0]!r}")
    return found


def _require_migrated(conn: psycopg.Connection[Any]) -> None:
    applied = {
        row[0]
        for row in conn.execute(
            "select version from supabase_migrations.schema_migrations"
            " where to_regclass('supabase_migrations.schema_migrations') is not null"
        ).fetchall()
    }
    missing = [m.version for m in discover() if m.version not in applied]
    if missing:
        raise NotCitus(
            f"{len(missing)} migration(s) not applied ({', '.join(missing)}):"
            " run `memchat migrate` first"
        )


def _drop_foreign_keys(conn: psycopg.Connection[Any]) -> list[tuple[str, str, str]]:
    """Drops the foreign keys of memchat's tables (Citus cannot move a table
    another local table references): their tables, names and definitions."""
    tables = [*REFERENCE_TABLES, *DISTRIBUTED_TABLES]
    rows = conn.execute(
        """
        select n.nspname || '.' || c.relname, k.conname, pg_get_constraintdef(k.oid)
          from pg_constraint k
          join pg_class c on c.oid = k.conrelid
          join pg_namespace n on n.oid = c.relnamespace
         where k.contype = 'f' and k.conparentid = 0
           and n.nspname || '.' || c.relname = any(%s)
         order by 1, 2
        """,
        (tables,),
    ).fetchall()
    for table, name, _ in rows:
        conn.execute(
            sql.SQL("alter table {} drop constraint {}").format(_table(table), sql.Identifier(name))
        )
    return [(str(t), str(n), str(d)) for t, n, d in rows]


def _rewrite_policies(conn: psycopg.Connection[Any]) -> None:
    """The policies of the tables to distribute, in the form Citus takes."""
    for statement in statements(CITUS_POLICIES.read_text()):
        conn.execute(statement)
    rows = conn.execute(
        """
        select schemaname || '.' || tablename, policyname, qual, with_check
          from pg_policies
         where schemaname || '.' || tablename = any(%s)
         order by 1, 2
        """,
        (list(DISTRIBUTED_TABLES),),
    ).fetchall()
    for table, name, using, check in rows:
        parts = []
        for clause, expression in (("using", using), ("with check", check)):
            if expression is None:
                continue
            rewritten = _SELECT_UID.sub("auth.uid()", expression)
            if _SUBQUERY.search(rewritten):
                raise NotCitus(
                    f"policy {name} on {table} has a subquery Citus refuses:"
                    f" give it a form in {CITUS_POLICIES.relative_to(SUPABASE_DIR.parent)}"
                )
            if rewritten != expression:
                parts.append(sql.SQL(clause + " ({})").format(sql.SQL(rewritten)))
        if parts:
            conn.execute(
                sql.SQL("alter policy {} on {} {}").format(
                    sql.Identifier(name), _table(table), sql.SQL(" ").join(parts)
                )
            )


def _set_sessions(conn: psycopg.Connection[Any]) -> None:
    """The login roles' SESSION_SETTINGS; the functions that force a generic
    plan on plain PostgreSQL plan each call for its values instead; the
    STATEMENT_ROLES may log in."""
    for role in LOGIN_ROLES:
        for name, value in SESSION_SETTINGS:
            conn.execute(
                sql.SQL("alter role {} set {} = {}").format(
                    sql.Identifier(role), sql.Identifier(*name.split(".")), sql.Literal(value)
                )
            )
    generic = conn.execute(
        """
        select p.oid::regprocedure::text from pg_proc p
         where p.pronamespace = 'memchat'::regnamespace
           and 'plan_cache_mode=force_generic_plan' = any(p.proconfig)
         order by 1
        """
    ).fetchall()
    for (function,) in generic:
        conn.execute(
            sql.SQL("alter function {} set plan_cache_mode = force_custom_plan").format(
                sql.SQL(function)
            )
        )
    for role in STATEMENT_ROLES:
        conn.execute(sql.SQL("alter role {} login").format(sql.Identifier(role)))


def _grant_identity_columns(conn: psycopg.Connection[Any]) -> None:
    """Citus takes an identity column's value on the coordinator and sends
    it in the shard's INSERT: whoever may insert into the table may insert
    that column too (its values still come from the identity)."""
    rows = conn.execute(
        """
        select n.nspname, c.relname, a.attname, r.rolname
          from pg_attribute a
          join pg_class c on c.oid = a.attrelid
          join pg_namespace n on n.oid = c.relnamespace
          cross join pg_roles r
         where a.attidentity <> '' and not a.attisdropped
           and n.nspname || '.' || c.relname = any(%s)
           and r.rolname !~ '^pg_'
           and has_any_column_privilege(r.oid, c.oid, 'INSERT')
           and not has_column_privilege(r.oid, c.oid, a.attnum, 'INSERT')
         order by 1, 2, 3, 4
        """,
        (list(DISTRIBUTED_TABLES),),
    ).fetchall()
    for schema, table, column, role in rows:
        conn.execute(
            sql.SQL("grant insert ({}) on {} to {}").format(
                sql.Identifier(column), sql.Identifier(schema, table), sql.Identifier(role)
            )
        )
