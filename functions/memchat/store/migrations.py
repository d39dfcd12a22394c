"""Apply `supabase/migrations` the way the supabase CLI does.

Applied versions are recorded in `supabase_migrations.schema_migrations`, the
table `supabase db push` uses, so either tool can take over from the other.
On a database that is not a Supabase one, `infra/bootstrap.sql` (roles and
the `auth` schema) is applied first; it is never applied to Supabase.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from memchat.store.db import connect

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
MIGRATIONS_DIR = PROJECT_ROOT / "supabase" / "migrations"
BOOTSTRAP_SQL = PROJECT_ROOT / "infra" / "bootstrap.sql"
_NAME = re.compile(r"^(\d+)_(.+)\.sql$")
# Serialises concurrent `memchat migrate` runs (CI workers, several dev shells).
_LOCK_KEY = 0x6D656D63686174  # "memchat"


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
    """Apply pending migrations; returns the versions applied. Idempotent."""
    applied_now: list[str] = []
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
            done = {
                r[0]
                for r in conn.execute(
                    "select version from supabase_migrations.schema_migrations"
                ).fetchall()
            }
            for migration in discover(directory):
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
        finally:
            conn.execute("select pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now
