"""`memchat db distribute` on a real Citus cluster, and what a request then
sees: the user tables distributed by user_id in one co-location group, the
shared ones reference tables, foreign keys and policies in place; the
caller's claims reach the workers, where row-level security keeps users
apart on the shards; a turn is recorded and read back. On plain PostgreSQL
the step refuses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from memchat import store
from memchat.store.db import Database, claims_statements
from memchat.store.distribute import (
    DELEGATED_FUNCTIONS,
    DISTRIBUTED_TABLES,
    LOGIN_ROLES,
    REFERENCE_TABLES,
    STATEMENT_ROLES,
    NotCitus,
    distribute,
    placed,
)
from memchat.store.embeddings import RECALL, RECALL_MEMORIES, recall_params
from memchat.store.migrations import MIGRATIONS_DIR, migrate
from tests.utils.citus_cluster import CitusCluster, shard_groups
from tests.utils.store_data import TTL, become, exchange, record, turn
from tests.utils.users import UserFactory

# The foreign keys of memchat's tables (not of the shards the coordinator holds).
FOREIGN_KEYS = """
    select k.conrelid::regclass::text, k.conname, pg_get_constraintdef(k.oid)
      from pg_constraint k
     where k.contype = 'f' and k.conparentid = 0
       and k.conrelid = any(%s::regclass[])
     order by 1, 2
"""
POLICIES = """
    select schemaname || '.' || tablename, policyname, cmd, roles from pg_policies
     where schemaname in ('public', 'memchat', 'auth') order by 1, 2
"""
TABLES = [*REFERENCE_TABLES, *DISTRIBUTED_TABLES]


@pytest.fixture(scope="module")
def coordinator(cluster: CitusCluster) -> Iterator[psycopg.Connection]:
    """The coordinator's owner connection, on a migrated cluster (not yet
    distributed: the first test distributes it)."""
    migrate(cluster.coordinator_url)
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def distributed(cluster: CitusCluster, coordinator: psycopg.Connection) -> CitusCluster:
    distribute(cluster.coordinator_url)
    return cluster


@pytest.fixture
async def api_db(distributed: CitusCluster) -> AsyncIterator[Database]:
    """The API's connection to the coordinator: `memchat_api`, trusted on 127.0.0.1."""
    url = distributed.coordinator_url.replace("postgres@", "memchat_api@", 1)
    database = Database(url, max_connections=4)
    yield database
    await database.close()


@pytest.fixture(scope="module")
def citus_users(coordinator: psycopg.Connection) -> UserFactory:
    return UserFactory(coordinator)


def test_distribute_refuses_a_database_without_citus(admin_url: str) -> None:
    with pytest.raises(NotCitus, match="no citus extension"):
        distribute(admin_url)


def test_distribute_places_every_table_once_and_keeps_the_keys(
    cluster: CitusCluster, coordinator: psycopg.Connection
) -> None:
    keys_before = coordinator.execute(FOREIGN_KEYS, (TABLES,)).fetchall()
    policies_before = coordinator.execute(POLICIES).fetchall()
    assert placed(coordinator) == {}
    done = distribute(cluster.coordinator_url)
    assert done.changed
    assert set(done.distributed) == set(DISTRIBUTED_TABLES)
    assert set(done.reference) == set(REFERENCE_TABLES)
    kinds = placed(coordinator)
    assert {t for t, kind in kinds.items() if kind == "distributed"} == set(DISTRIBUTED_TABLES)
    assert {t for t, kind in kinds.items() if kind == "reference"} == set(REFERENCE_TABLES)
    # One co-location group, distributed by user_id.
    rows = coordinator.execute(
        "select distinct colocation_id, distribution_column from citus_tables"
        " where citus_table_type = 'distributed'"
    ).fetchall()
    assert rows == [(rows[0][0], "user_id")]
    assert coordinator.execute(FOREIGN_KEYS, (TABLES,)).fetchall() == keys_before
    # The same policies, for the same commands and roles, but the cleanup's
    # count of expired sessions' messages (supabase/citus/policies.sql).
    assert coordinator.execute(POLICIES).fetchall() == [
        p for p in policies_before if p[1] != "messages_cleanup_count"
    ]
    # Run again: nothing moves.
    again = distribute(cluster.coordinator_url)
    assert not again.changed and again.citus_version == done.citus_version


def test_no_policy_of_a_distributed_table_holds_a_subquery(
    distributed: CitusCluster, coordinator: psycopg.Connection
) -> None:
    rows = coordinator.execute(
        "select schemaname || '.' || tablename, policyname from pg_policies"
        " where schemaname || '.' || tablename = any(%s)"
        "   and (coalesce(qual, '') ~* 'select' or coalesce(with_check, '') ~* 'select')",
        (list(DISTRIBUTED_TABLES),),
    ).fetchall()
    assert rows == []


def test_the_login_roles_plan_for_the_callers_shard(
    distributed: CitusCluster, coordinator: psycopg.Connection
) -> None:
    for role in LOGIN_ROLES:
        (config,) = coordinator.execute(
            "select rolconfig from pg_roles where rolname = %s", (role,)
        ).fetchone() or (None,)
        assert "citus.propagate_set_commands=local" in config, role
        assert "plan_cache_mode=force_custom_plan" in config, role
    generic = coordinator.execute(
        "select count(*) from pg_proc where pronamespace = 'memchat'::regnamespace"
        " and 'plan_cache_mode=force_generic_plan' = any(proconfig)"
    ).fetchone()
    assert generic == (0,)
    for url in distributed.worker_urls:
        with psycopg.connect(url, autocommit=True) as worker:
            login = worker.execute(
                "select array_agg(rolname order by rolname) from pg_roles"
                " where rolname = any(%s) and rolcanlogin",
                (list(STATEMENT_ROLES),),
            ).fetchone()
        assert login == (sorted(STATEMENT_ROLES),)


async def _sessions_seen(db: Database, claims: dict[str, Any]) -> int:
    return int(await db.value(claims, "select count(*) from public.chat_sessions"))


async def test_a_request_sees_its_own_rows_on_the_shards(
    api_db: Database, citus_users: UserFactory
) -> None:
    alice, bob = citus_users.create(), citus_users.create()
    await api_db.value(
        alice.claims,
        "insert into public.chat_sessions (id, user_id, agent_name, expires_at)"
        " values (%s, %s, 'default', now() + interval '1 hour') returning id",
        (uuid.uuid4(), alice.user_id),
    )
    assert await _sessions_seen(api_db, alice.claims) == 1
    assert await _sessions_seen(api_db, bob.claims) == 0


def test_the_claims_reach_the_workers_only_as_set_local(
    distributed: CitusCluster, citus_users: UserFactory
) -> None:
    """The same request with the claims' propagation off: the shards see no
    caller, and row-level security there hides the caller's own row."""
    frank = citus_users.create()
    url = distributed.coordinator_url.replace("postgres@", "memchat_api@", 1)
    seen = {}
    for propagate in ("local", "none"):
        with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
            conn.execute(
                psycopg.sql.SQL("set local citus.propagate_set_commands = {}").format(
                    psycopg.sql.Literal(propagate)
                )
            )
            # The API's own statements (`become` would set the propagation).
            for query, params in claims_statements(frank.claims):
                conn.execute(query, params)
            if propagate == "local":
                conn.execute(
                    "insert into public.chat_sessions (id, user_id, agent_name, expires_at)"
                    " values (%s, %s, 'default', now() + interval '1 hour')",
                    (uuid.uuid4(), frank.user_id),
                )
            row = conn.execute(
                "select count(*) from public.chat_sessions where user_id = %s", (frank.user_id,)
            ).fetchone()
            seen[propagate] = row[0] if row else None
    assert seen == {"local": 1, "none": 0}


def test_on_a_worker_a_users_statement_sees_only_that_users_rows(
    distributed: CitusCluster, coordinator: psycopg.Connection, citus_users: UserFactory
) -> None:
    carol, dave = citus_users.create(), citus_users.create()
    for user in (carol, dave):
        coordinator.execute(
            "insert into public.chat_sessions (id, user_id, agent_name, expires_at)"
            " values (%s, %s, 'default', now() + interval '1 hour')",
            (uuid.uuid4(), user.user_id),
        )
    # The shard holding carol's sessions, and the worker that holds it.
    shard, port = coordinator.execute(
        "select s.shard_name, s.nodeport from citus_shards s"
        " where s.table_name = 'public.chat_sessions'::regclass"
        "   and s.shardid = get_shard_id_for_distribution_column('public.chat_sessions', %s)",
        (carol.user_id,),
    ).fetchone() or (None, None)
    worker = next(url for url in distributed.worker_urls if f":{port}/" in url)
    seen = {}
    for caller in (carol, dave):
        with psycopg.connect(worker, autocommit=True) as conn, conn.transaction():
            become(conn, caller.claims)
            rows = conn.execute(
                psycopg.sql.SQL("select user_id from {}").format(psycopg.sql.Identifier(shard))
            ).fetchall()
        seen[caller.user_id] = {row[0] for row in rows}
    assert seen[carol.user_id] == {carol.user_id}
    # dave's session may share carol's shard: there he sees his own alone.
    assert seen[dave.user_id] <= {dave.user_id}


async def test_a_turn_is_recorded_and_read_back_on_citus(
    api_db: Database, citus_users: UserFactory, coordinator: psycopg.Connection
) -> None:
    erin = citus_users.create()
    info = await record(api_db, erin, exchange("I like green tea", "Noted: green tea."))
    assert info.message_count == 2 and len(info.message_ids) == 2
    again = await record(
        api_db, erin, exchange("and oolong", "Noted: oolong too."), session_id=info.id
    )
    assert again.id == info.id and again.message_count == 4
    context = await store.load_context(
        api_db, erin, session_id=info.id, agent_name="default", window=10
    )
    assert context.session is not None and context.session.id == info.id
    assert [m["data"]["content"] for m in context.messages] == [
        "I like green tea",
        "Noted: green tea.",
        "and oolong",
        "Noted: oolong too.",
    ]


def _distribute_command(url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SUPABASE_"))}
    env["DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "memchat.cli", "db", "distribute"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_command_refuses_plain_postgresql_and_is_idempotent_on_citus(
    admin_url: str, distributed: CitusCluster
) -> None:
    refused = _distribute_command(admin_url)
    assert refused.returncode == 2, refused.stderr
    assert "no citus extension" in refused.stderr
    again = _distribute_command(distributed.coordinator_url)
    assert again.returncode == 0, again.stderr
    assert "every table already in place" in again.stdout


async def test_clear_feedback_notes_export_and_erase_work_on_citus(
    api_db: Database,
    citus_users: UserFactory,
    coordinator: psycopg.Connection,
    distributed: CitusCluster,
) -> None:
    """The request paths beside the turn, each routed to the caller's shard
    group; a cleared message's feedback goes with it (the row trigger of
    supabase/citus/triggers.sql)."""
    gina, hal = citus_users.create(), citus_users.create()
    info = await record(api_db, gina, exchange("my cat is Miso", "Miso, noted."))
    await record(api_db, hal, exchange("my dog is Rex", "Rex, noted."))
    answer = info.message_ids[-1]
    rated = await store.set_feedback(api_db, gina, answer, 1, "good")
    assert rated is not None and rated.rating == 1
    assert await store.set_feedback(api_db, hal, answer, -1, None) is None  # not hal's

    saved = await store.save_notes(api_db, gina, "default", "likes cats", 0)
    assert saved.version == 1 and (await store.read_notes(api_db, gina, "default")).notes == (
        "likes cats"
    )
    restored = await store.restore_notes(api_db, gina, "default", 1, 1)
    assert restored is not None and (restored.version, restored.notes) == (2, "likes cats")
    stats = await store.chat_stats(api_db, gina, None)
    assert stats["feedback"]["positive"] == 1 and stats["sessions"]["total"] == 1
    one = await store.session_stats(api_db, gina, info.id)
    assert one is not None and one["messages"] == 2
    assert await store.session_stats(api_db, hal, info.id) is None  # not hal's
    # The notes' and the stats' functions are delegated: one shard group.
    uid = gina.user_id
    delegated = [
        ("select memchat.chat_stats(%s, null)", (uid,)),
        ("select memchat.session_stats(%s, %s)", (uid, info.id)),
        ("select memchat.save_notes(%s, 'default', 'likes dogs too', null)", (uid,)),
        ("select memchat.restore_notes(%s, 'default', 1, null)", (uid,)),
    ]
    assert shard_groups(distributed.coordinator_url, gina.claims, delegated) == 1

    async with store.export.snapshot(api_db, gina, whole_account=True) as reader:
        sessions = [s async for batch in reader.sessions() for s in batch]
        texts = [t async for batch in reader.messages(info.id) for t in batch]
    assert [s.id for s in sessions] == [info.id] and len(texts) == 2

    cleared = await store.clear_session(
        api_db, gina, session_id=info.id, agent_name="default", ttl=TTL
    )
    assert cleared.deleted_messages == 2
    feedback = coordinator.execute(
        "select count(*) from memchat.message_feedback where user_id = %s", (gina.user_id,)
    ).fetchone()
    assert feedback == (0,)

    counts = await store.delete_user_data(api_db, gina)
    assert counts["sessions"] == 2 and counts["long_term_memory"] == 1
    left = coordinator.execute(
        "select (select count(*) from public.chat_sessions where user_id = %(u)s),"
        " (select count(*) from memchat.notes_versions where user_id = %(u)s),"
        " (select count(*) from public.chat_sessions where user_id = %(h)s)",
        {"u": gina.user_id, "h": hal.user_id},
    ).fetchone()
    assert left == (0, 0, 1)


def test_the_turns_functions_run_on_the_callers_worker(
    distributed: CitusCluster, coordinator: psycopg.Connection
) -> None:
    rows = coordinator.execute(
        "select o.objid::regprocedure::text, o.distribution_argument_index, o.force_delegation,"
        "       o.colocationid = (select colocationid from pg_dist_partition"
        "                          where logicalrelid = 'public.chat_sessions'::regclass)"
        "  from pg_dist_object o"
        " where o.classid = 'pg_proc'::regclass and o.objid = any(%s::regprocedure[])",
        (list(DELEGATED_FUNCTIONS),),
    ).fetchall()
    # Distributed by their first argument, p_user_id, with the users' tables.
    assert sorted(name for name, *_ in rows) == sorted(
        f.replace(", ", ",").replace("timestamptz", "timestamp with time zone")
        for f in DELEGATED_FUNCTIONS
    )
    assert {(index, force, colocated) for _, index, force, colocated in rows} == {(0, True, True)}


DIMS = 512  # the embedding column as the migrations make it
MODEL = "test-embedding-model"


def _axis(i: int) -> list[float]:
    values = [0.0] * DIMS
    values[i] = 1.0
    return values


async def test_recall_runs_on_the_callers_worker_in_one_shard_group(
    api_db: Database, citus_users: UserFactory, distributed: CitusCluster
) -> None:
    fay, other = citus_users.create(), citus_users.create()
    session = uuid.uuid4()
    said = {
        "I keep bees on the roof": (0, "Bees: noted."),
        "My sister lives in Porto": (1, "Porto, noted."),
        "I am learning the oboe": (2, "The oboe: noted."),
    }
    for question, (axis, answer) in said.items():
        for caller in (fay, other):
            await store.record_turn(
                api_db,
                caller,
                replace(
                    turn(session if caller is fay else uuid.uuid4(), exchange(question, answer)),
                    embedding=store.Embedding(MODEL, _axis(axis)),
                ),
            )
    query = store.RecallQuery(
        session_id=None,
        agent_name="default",
        window=0,
        embedding=store.Embedding(MODEL, _axis(1)),
        k=2,
        min_score=0.0,
        duplicate_score=0.95,
        text="where does my sister live?",
    )
    hits = await store.recall(api_db, fay, query)
    # Best by meaning and by words, with its answer; only Fay's own rows.
    assert hits[0].question == "My sister lives in Porto" and hits[0].answer == "Porto, noted."
    assert {h.session_id for h in hits} == {session}
    params = recall_params(fay.user_id, query)
    statements = [(RECALL, params), (RECALL_MEMORIES, params)]
    assert shard_groups(distributed.coordinator_url, fay.claims, statements) == 1


def test_distribute_puts_the_citus_forms_back_after_a_migration(
    distributed: CitusCluster, coordinator: psycopg.Connection, tmp_path: Path
) -> None:
    def forms() -> tuple[bool, bool, bool]:
        """The claims' Citus forms, and the statistics step's setting."""
        row = coordinator.execute(
            "select (select strpos(prosrc, 'claim_due') > 0 from pg_proc where oid ="
            "          'memchat.summary_claim(integer, double precision)'::regprocedure),"
            "       (select strpos(prosrc, 'claim_due') > 0 from pg_proc where oid ="
            "          'memchat.embedding_claim(integer, double precision)'::regprocedure),"
            "       (select 'citus.multi_shard_modify_mode=sequential' = any(proconfig)"
            "          from pg_proc where oid = 'memchat.embedding_statistics()'::regprocedure)"
        ).fetchone()
        assert row is not None
        return (row[0], row[1], row[2])

    assert forms() == (True, True, True)
    # A later migration replaces them with their plain-PostgreSQL forms.
    coordinator.execute(
        "create or replace function memchat.summary_claim(p_limit integer,"
        " p_lease_seconds double precision) returns jsonb language plpgsql security definer"
        " set search_path = '' as $$ begin return '[]'::jsonb; end $$"
    )
    coordinator.execute("alter function memchat.embedding_statistics() reset all")
    coordinator.execute("alter function memchat.embedding_statistics() set search_path = ''")
    assert forms() == (False, True, False)
    distribute(distributed.coordinator_url)
    assert forms() == (True, True, True)

    # `memchat migrate` does it itself once its migrations replaced them:
    # those of the repository and a later one (the module's last test).
    migrations = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, migrations)
    (migrations / "29991231000000_plain_forms_again.sql").write_text(
        "create or replace function memchat.summary_claim(p_limit integer,"
        " p_lease_seconds double precision) returns jsonb language plpgsql security definer"
        " set search_path = '' as $$ begin return '[]'::jsonb; end $$;\n"
        "alter function memchat.embedding_statistics() reset all;\n"
        "alter function memchat.embedding_statistics() set search_path = '';\n"
    )
    assert migrate(distributed.coordinator_url, migrations) == ["29991231000000"]
    assert forms() == (True, True, True)


def _shard_storage(coordinator: psycopg.Connection, table: str, column: str) -> set[str]:
    """The storage of `column` in every shard of `table`."""
    rows = coordinator.execute(
        "select r.result from run_command_on_shards(%s, %s) r",
        (
            table,
            "select attstorage from pg_attribute where attrelid = '%s'::regclass"
            f" and attname = '{column}'",
        ),
    ).fetchall()
    return {result for (result,) in rows}


async def test_the_recall_keys_are_kept_in_the_row_on_the_shards(
    api_db: Database, citus_users: UserFactory, distributed: CitusCluster
) -> None:
    """The migrations store the keys' vectors and lexemes in the row (MAIN),
    and so must every shard of theirs, made by Citus with the type's
    storage; values stored out of line before (a shard that lost it, as a
    moved one does) are written in the row by `distribute` again."""
    coordinator = psycopg.connect(distributed.coordinator_url, autocommit=True)
    partitions = [
        name
        for (name,) in coordinator.execute(
            "select inhrelid::regclass::text from pg_inherits"
            " where inhparent = any(array['memchat.message_embeddings',"
            " 'memchat.message_facts']::regclass[]) order by 1"
        ).fetchall()
    ]
    assert len(partitions) == 64
    for partition in partitions:
        assert _shard_storage(coordinator, partition, "embedding") == {"m"}, partition
    gus = citus_users.create()
    own = coordinator.execute(
        "select memchat.key_partition_name('message_embeddings', %s)", (gus.user_id,)
    ).fetchone()
    assert own is not None
    partition = f"memchat.{own[0]}"
    # A shard as Citus makes it: the vectors out of line.
    coordinator.execute(
        "select run_command_on_shards(%s, %s)",
        (partition, "alter table %s alter column embedding set storage external"),
    )
    assert _shard_storage(coordinator, partition, "embedding") == {"e"}
    await store.record_turn(
        api_db,
        gus,
        replace(
            turn(uuid.uuid4(), exchange("I grow tomatoes", "Tomatoes: noted.")),
            embedding=store.Embedding(MODEL, _axis(3)),
        ),
    )
    toasted = (
        "select count(*) filter (where pg_column_toast_chunk_id(embedding) is not null), count(*)"
        " from memchat.message_embeddings where user_id = %s"
    )
    assert coordinator.execute(toasted, (gus.user_id,)).fetchone() == (1, 1)
    distribute(distributed.coordinator_url)
    assert _shard_storage(coordinator, partition, "embedding") == {"m"}
    assert coordinator.execute(toasted, (gus.user_id,)).fetchone() == (0, 1)
    coordinator.close()
