"""`memchat db diff`, run as a developer runs it (subprocesses), on a copy of
the supabase directory: a schema file changed, the migration it writes
makes the migrations build what the schema files build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from memchat.store.migrations import differences, discover
from tests.store.test_schema import built_from_migrations, built_from_schema, copy_of_supabase

MEMCHAT = [sys.executable, "-m", "memchat.cli"]


def db_diff(owner_url: str, supabase_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SUPABASE_"))}
    env.update(DATABASE_URL=owner_url, MEMCHAT_HOME=str(supabase_dir.parent / ".memchat"))
    return subprocess.run(
        [*MEMCHAT, "db", "diff", "--supabase-dir", str(supabase_dir), *args],
        env=env,
        cwd=supabase_dir.parent,
        capture_output=True,
        text=True,
        timeout=180,
    )


def change(path: Path, before: str, after: str) -> None:
    text = path.read_text()
    assert text.count(before) == 1, f"{path.name} no longer holds the text this test changes"
    path.write_text(text.replace(before, after))


def written(supabase_dir: Path, before: list[str]) -> list[Path]:
    return [m.path for m in discover(supabase_dir / "migrations") if m.version not in before]


@pytest.fixture
def supabase_dir(tmp_path: Path) -> Path:
    return copy_of_supabase(tmp_path)


def test_nothing_is_written_when_they_agree(admin_url: str, supabase_dir: Path) -> None:
    before = [m.version for m in discover(supabase_dir / "migrations")]

    result = db_diff(admin_url, supabase_dir)

    assert result.returncode == 0, result.stderr
    assert "build the same schema" in result.stderr
    assert written(supabase_dir, before) == []


def test_the_migration_it_writes_makes_them_agree(
    admin: psycopg.Connection, admin_url: str, supabase_dir: Path
) -> None:
    schemas = supabase_dir / "schemas"
    # A function changed, a new one (with its grant and comment), a policy
    # and a view changed, a trigger gone.
    change(
        schemas / "functions/words.sql",
        "create function memchat.words_budget() returns integer\n"
        "language sql immutable parallel safe\nset search_path = ''\nas $$ select 100 $$;",
        "create function memchat.words_budget() returns integer\n"
        "language sql immutable parallel safe\nset search_path = ''\nas $$ select 120 $$;",
    )
    with (schemas / "functions/stats.sql").open("a") as extra:
        extra.write(
            "\ncreate function memchat.stats_version() returns integer\n"
            "language plpgsql immutable\nset search_path = ''\n"
            "as $$ begin return 2; end $$;\n"
            "comment on function memchat.stats_version() is 'Which stats these are.';\n"
        )
    change(
        schemas / "grants.sql",
        "  memchat.session_stats(uuid, uuid),\n",
        "  memchat.session_stats(uuid, uuid),\n  memchat.stats_version(),\n",
    )
    change(
        schemas / "policies.sql",
        "for delete to memchat_cleanup using (expires_at <= now());\n\n-- An active",
        "for delete to memchat_cleanup using (expires_at < now());\n\n-- An active",
    )
    change(
        schemas / "views.sql",
        "select t.day, count(distinct t.user_id) as users, count(*) as turns\n",
        "select t.day, count(distinct t.user_id) as users, count(*) as turns,\n"
        "       count(distinct t.agent_name) as agents\n",
    )
    change(
        schemas / "triggers.sql",
        "create trigger chat_message_history_truncate\n"
        "  after truncate on public.chat_message_history\n"
        "  for each statement execute function memchat.truncate_message_dependents();\n",
        "",
    )
    before = [m.version for m in discover(supabase_dir / "migrations")]

    result = db_diff(admin_url, supabase_dir, "--name", "words_budget")

    assert result.returncode == 0, result.stderr
    [migration] = written(supabase_dir, before)
    assert migration.name.endswith("_words_budget.sql")
    assert migration.name > f"{max(before)}_"
    text = migration.read_text()
    assert "CREATE OR REPLACE FUNCTION memchat.words_budget()" in text
    assert "select 120" in text
    assert "CREATE OR REPLACE FUNCTION memchat.stats_version()" in text
    assert "grant execute on function memchat.stats_version() to memchat_user;" in text
    assert "revoke all on function memchat.stats_version() from public;" in text
    assert "drop policy chat_sessions_cleanup_delete on public.chat_sessions;" in text
    assert "drop view memchat_analytics.daily_active_users;" in text
    assert "drop trigger chat_message_history_truncate on public.chat_message_history;" in text
    # Only what changed: not the rest of the schema.
    assert "memchat.recall(" not in text
    assert str(migration) in result.stderr

    # Applied after the others, the migrations build what the schema files do.
    found = differences(
        built_from_migrations(admin, admin_url, supabase_dir),
        built_from_schema(admin, admin_url, supabase_dir),
    )
    assert found == []


def test_what_it_cannot_write_is_listed(admin_url: str, supabase_dir: Path) -> None:
    change(
        supabase_dir / "schemas/tables/limits.sql",
        "  max_import_message_chars integer not null default 200000\n"
        "    check (max_import_message_chars >= 1)\n",
        "  max_import_message_chars integer not null default 200000\n"
        "    check (max_import_message_chars >= 1),\n"
        "  max_sessions integer not null default 1000\n",
    )
    before = [m.version for m in discover(supabase_dir / "migrations")]

    result = db_diff(admin_url, supabase_dir, "--print")

    assert result.returncode == 1, result.stderr
    assert "for a migration written by hand" in result.stderr
    assert "column memchat.limits.max_sessions: only in the schema files" in result.stderr
    assert result.stdout == ""
    assert written(supabase_dir, before) == []
