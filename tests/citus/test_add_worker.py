"""A worker added to a running cluster, and a user's shard group moved onto
it, as docs/deploy.md ("Adding workers") says: the new node gets memchat's
roles, functions and reference tables from Citus, and the moved user's
requests (the turns' functions, recall, export, erasure) run there, routed
to one shard group, while the other users' stay where they were.

A whole rebalance moves a third of the shard groups (minutes, even on an
empty cluster); the move of one group is what it is made of.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import psycopg
import pytest

from memchat import store
from memchat.store.db import Database
from memchat.store.distribute import distribute
from memchat.store.embeddings import RECALL, RECALL_MEMORIES, recall_params
from memchat.store.migrations import migrate
from tests.citus.test_distribute import MODEL, _axis
from tests.utils.citus_cluster import CitusCluster, add_worker, shard_groups
from tests.utils.store_data import exchange, turn
from tests.utils.users import UserFactory

# The node that holds a user's shard group (all its co-located shards).
NODE_OF = """
select n.nodeport
  from pg_dist_placement p join pg_dist_node n using (groupid)
 where p.shardid = get_shard_id_for_distribution_column('public.chat_sessions', %s)
"""
MOVE = """
select citus_move_shard_placement(
  get_shard_id_for_distribution_column('public.chat_sessions', %s),
  '127.0.0.1', %s, '127.0.0.1', %s, shard_transfer_mode => 'block_writes')
"""


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


@pytest.fixture(scope="module")
def coordinator(cluster: CitusCluster) -> Iterator[psycopg.Connection]:
    """The coordinator's owner connection on a migrated, distributed cluster."""
    migrate(cluster.coordinator_url)
    distribute(cluster.coordinator_url)
    with psycopg.connect(cluster.coordinator_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def api_db(cluster: CitusCluster, coordinator: psycopg.Connection) -> AsyncIterator[Database]:
    url = cluster.coordinator_url.replace("postgres@", "memchat_api@", 1)
    database = Database(url, max_connections=2)
    yield database
    await database.close()


async def remember(db: Database, caller: store.Caller, session: uuid.UUID, axis: int) -> None:
    said = turn(session, exchange(f"fact number {axis} of mine", f"noted: {axis}"))
    await store.record_turn(
        db, caller, replace(said, embedding=store.Embedding(MODEL, _axis(axis)))
    )


def recall_query(axis: int) -> store.RecallQuery:
    return store.RecallQuery(
        session_id=None,
        agent_name="default",
        window=0,
        embedding=store.Embedding(MODEL, _axis(axis)),
        k=3,
        min_score=0.5,
        duplicate_score=0.95,
        text=f"which fact was number {axis}?",
    )


async def test_a_users_shard_group_moved_to_a_new_worker_serves_its_requests(
    api_db: Database, coordinator: psycopg.Connection, cluster: CitusCluster
) -> None:
    users = UserFactory(coordinator)
    moved, stays = users.create(), users.create()
    sessions = {moved.user_id: uuid.uuid4(), stays.user_id: uuid.uuid4()}
    for caller in (moved, stays):
        for axis in range(3):
            await remember(api_db, caller, sessions[caller.user_id], axis)

    new_worker = add_worker(cluster)
    new_port = _port(new_worker)
    # Citus gave the new node memchat's roles and functions.
    with psycopg.connect(new_worker, autocommit=True) as worker:
        roles = {r for (r,) in worker.execute("select rolname from pg_roles")}
        assert {"memchat_user", "memchat_api", "memchat_worker"} <= roles
        assert worker.execute(
            "select to_regprocedure('memchat.recall(uuid, uuid, text,"
            " integer, extensions.vector, text, text, integer, double precision,"
            " double precision, timestamptz, timestamptz)')"
        ).fetchone() != (None,)

    (source,) = coordinator.execute(NODE_OF, (moved.user_id,)).fetchone() or (None,)
    (other,) = coordinator.execute(NODE_OF, (stays.user_id,)).fetchone() or (None,)
    assert source != new_port and other != new_port  # no shards on it yet
    # The reference tables first (a rebalance copies them itself), then the group.
    coordinator.execute("select replicate_reference_tables('block_writes')")
    coordinator.execute(MOVE, (moved.user_id, source, new_port))
    assert coordinator.execute(NODE_OF, (moved.user_id,)).fetchone() == (new_port,)
    assert coordinator.execute(NODE_OF, (stays.user_id,)).fetchone() == (other,)

    for caller in (moved, stays):
        session = sessions[caller.user_id]
        context = await store.load_context(
            api_db, caller, session_id=session, agent_name="default", window=10
        )
        assert [m["data"]["content"] for m in context.messages][:2] == [
            "fact number 0 of mine",
            "noted: 0",
        ]
        await remember(api_db, caller, session, 3)  # a new turn, on its node
        hits = await store.recall(api_db, caller, recall_query(3))
        assert [(h.question, h.answer) for h in hits] == [("fact number 3 of mine", "noted: 3")]
        params = recall_params(caller.user_id, recall_query(1))
        statements = [(RECALL, params), (RECALL_MEMORIES, params)]
        assert shard_groups(cluster.coordinator_url, caller.claims, statements) == 1

    async with store.export.snapshot(api_db, moved, whole_account=True) as reader:
        exported = [s.id async for batch in reader.sessions() for s in batch]
    assert exported == [sessions[moved.user_id]]
    counts = await store.delete_user_data(api_db, moved)
    assert counts["sessions"] == 1
    left = coordinator.execute(
        "select (select count(*) from public.chat_message_history where user_id = %s),"
        " (select count(*) from public.chat_message_history where user_id = %s)",
        (moved.user_id, stays.user_id),
    ).fetchone()
    assert left == (0, 8)
