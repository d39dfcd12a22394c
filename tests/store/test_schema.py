"""The schema files (supabase/schemas) and the migrations (supabase/migrations)
build the same schema.

One database is built from the migrations and one from the schema files (in
the order supabase/config.toml lists them), both fresh on the suite's
server, and their catalogs compared: schemas, tables and partitions, columns
with their types, defaults and storage, constraints, indexes, row-level
security and policies, privileges (ACLs, column ones included), functions
(pg_get_functiondef: body, settings, security) and their ACLs, triggers,
views, comments (memchat.store.migrations.catalog). A change to one that the
other does not make fails here, naming the first difference. Roles are the
server's, not a database's: they are not compared.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from memchat.store.migrations import (
    BOOTSTRAP_SQL,
    SUPABASE_DIR,
    Catalog,
    apply_schema,
    catalog,
    differences,
    migrate,
    schema_files,
)
from tests.utils.analytics_data import empty_database


def copy_of_supabase(target: Path) -> Path:
    """The project's supabase directory (config, schema files, migrations),
    copied to `target`, to change."""
    copy = target / "supabase"
    shutil.copytree(
        SUPABASE_DIR, copy, ignore=shutil.ignore_patterns(".temp", ".branches", "*.pyc")
    )
    return copy


def built_from_migrations(
    admin: psycopg.Connection, admin_url: str, supabase_dir: Path = SUPABASE_DIR
) -> Catalog:
    with empty_database(admin, admin_url, "memchat_from_migrations") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            # What Supabase provides, also when the test server is a Supabase
            # one: a new database has none of it.
            conn.execute(BOOTSTRAP_SQL.read_text())
        migrate(url, supabase_dir / "migrations")
        return catalog(url)


def built_from_schema(
    admin: psycopg.Connection, admin_url: str, supabase_dir: Path = SUPABASE_DIR
) -> Catalog:
    with empty_database(admin, admin_url, "memchat_from_schema") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(BOOTSTRAP_SQL.read_text())
        apply_schema(url, supabase_dir)
        return catalog(url)


@pytest.fixture(scope="module")
def from_migrations(admin: psycopg.Connection, admin_url: str) -> Iterator[Catalog]:
    yield built_from_migrations(admin, admin_url)


def test_every_schema_file_is_listed_once_and_in_order() -> None:
    listed = schema_files()
    on_disk = sorted((SUPABASE_DIR / "schemas").rglob("*.sql"))
    assert sorted(listed) == on_disk, "a schema file is missing from schema_paths"
    assert len(set(listed)) == len(listed)
    assert listed[0].name == "roles_and_schemas.sql"
    assert listed[-1].name == "grants.sql"


def test_the_schema_files_build_what_the_migrations_build(
    admin: psycopg.Connection, admin_url: str, from_migrations: Catalog
) -> None:
    found = differences(from_migrations, built_from_schema(admin, admin_url))
    assert not found, (
        "supabase/schemas and supabase/migrations build different schemas"
        f" ({len(found)} differences); the first:\n{found[0]}\n"
        "Edit the schema file and write the migration (`memchat db diff` writes it for"
        " functions, views, policies, triggers, privileges, comments)."
    )
    # What the comparison covers is there to compare.
    kinds = {key.split(" ", 1)[0] for key in from_migrations}
    assert {"function", "policy", "trigger", "view", "index", "column", "comment"} <= kinds
    assert "function memchat.recall(" in "\n".join(from_migrations)


# Each a change to one schema file that no migration makes, and the
# difference it must be reported as (the first).
DRIFTS = {
    "a function's body": (
        "functions/recall.sql",
        "v_depth integer := greatest(p_k * 2, 20);",
        "v_depth integer := greatest(p_k * 3, 20);",
        "function memchat.recall(uuid,uuid,text,integer,extensions.vector,text,text,integer,"
        "double precision,double precision,timestamp with time zone,timestamp with time zone):"
        " definition differs",
    ),
    "a function's setting": (
        "functions/words.sql",
        "set enable_nestloop = off\nas $$\nbegin\n  -- Without a user",
        "set enable_nestloop = on\nas $$\nbegin\n  -- Without a user",
        "function memchat.rounds_matching(",
    ),
    "a policy": (
        "policies.sql",
        "for delete to memchat_cleanup using (expires_at <= now());\n\n-- An active",
        "for delete to memchat_cleanup using (expires_at < now());\n\n-- An active",
        "policy public.chat_sessions chat_sessions_cleanup_delete: using differs",
    ),
    "a grant": (
        "grants.sql",
        "grant select on memchat.notes_versions to memchat_user;",
        "grant select, insert on memchat.notes_versions to memchat_user;",
        "table memchat.notes_versions: acl differs",
    ),
    "a column's default": (
        "tables/limits.sql",
        "max_stored_messages bigint not null default 100000",
        "max_stored_messages bigint not null default 200000",
        "column memchat.limits.max_stored_messages: default differs",
    ),
}


@pytest.mark.parametrize("drift", list(DRIFTS))
def test_a_schema_file_that_drifts_is_reported(
    admin: psycopg.Connection,
    admin_url: str,
    from_migrations: Catalog,
    tmp_path: Path,
    drift: str,
) -> None:
    file, before, after, reported = DRIFTS[drift]
    copy = copy_of_supabase(tmp_path)
    path = copy / "schemas" / file
    text = path.read_text()
    assert text.count(before) == 1, f"{file} no longer holds the text this test changes"
    path.write_text(text.replace(before, after))

    found = differences(from_migrations, built_from_schema(admin, admin_url, copy))

    assert found, f"{drift} changed in {file} went unnoticed"
    assert found[0].startswith(reported), found[0]
    assert len(found) == 1, found
