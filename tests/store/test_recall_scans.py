"""A recall's hits are read through indexes, never a whole table.

memchat.recall_hits reads, for each hit, its message, its session, the
exchanges before and after it and the three exchanges' answers: a few index
entries of the caller's each. Where the caller holds most of a table's rows
(a new deployment, or on Citus a shard of few users) the statistics make a
sequential scan look cheapest, and each of those lookups then reads the
whole table: the function turns sequential scans off. This server's scan
counters of the transaction (pg_stat_xact_user_tables) tell which scans it
made, in a database of the module's own whose one user holds every row,
freshly analysed.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg import sql

from memchat import store
from memchat.config import DUPLICATE_SCORE
from memchat.store.db import Database, claims_statements
from memchat.store.embeddings import RECALL, recall_params
from memchat.store.fragments import register
from tests.utils.analytics_data import Fresh
from tests.utils.store_data import exchange, turn
from tests.utils.users import UserFactory

# This server's scan counters: on Citus the scans are the workers'.
pytestmark = pytest.mark.plain_only

DIMS = 512
MODEL = "test-embedding-model"
TURNS = 40
# The tables recall_hits reads.
READ = ("chat_message_history", "chat_sessions")
SCANS = """
select coalesce(sum(t.seq_scan), 0)::int, coalesce(sum(t.idx_scan), 0)::int,
       coalesce(sum(t.idx_tup_fetch), 0)::int
  from pg_catalog.pg_stat_xact_user_tables t
 where t.schemaname = 'public' and t.relname = any(%s)
"""
HITS = "select memchat.recall_hits(%s, %s, null, null)"
RECALL_HITS = "memchat.recall_hits(bigint[], double precision[], uuid, bigint)"


def vector(seed: int) -> list[float]:
    values = [0.0] * DIMS
    values[seed % DIMS] = 1.0
    values[(seed * 7 + 3) % DIMS] = 0.5
    norm = math.sqrt(1.25)
    return [v / norm for v in values]


@pytest.fixture(scope="module")
async def history(fresh: Fresh) -> AsyncIterator[store.Caller]:
    """One user with TURNS turns in one session, each with its embedding; the
    tables analysed with that user's rows their only ones."""
    caller = UserFactory(fresh.admin).create()
    session_id = uuid.uuid4()
    db = Database(fresh.api_url, max_connections=1)
    try:
        for t in range(TURNS):
            said = turn(session_id, exchange(f"question {t} about tea", f"answer {t} on tea"))
            await store.record_turn(
                db, caller, replace(said, embedding=store.Embedding(MODEL, vector(t)))
            )
    finally:
        await db.close()
    fresh.admin.execute("analyze")
    yield caller


def hits_scans(conn: psycopg.Connection, who: store.Caller) -> tuple[int, int, int, Any]:
    """A recall by `who` in the open transaction of `conn` (as the owner),
    then its hits read once more: the sequential and index scans of the
    tables memchat.recall_hits reads that the second made, the rows its
    index scans fetched, and the hits."""
    register(conn.adapters)
    for query, params in claims_statements(who.claims):
        conn.execute(query, params)
    asked = store.RecallQuery(
        session_id=uuid.uuid4(),
        agent_name="default",
        window=10,
        embedding=store.Embedding(MODEL, vector(7)),
        k=5,
        min_score=0.0,
        text="the seventh?",  # no word of the stored turns: by meaning alone
        duplicate_score=DUPLICATE_SCORE,
    )
    row = conn.execute(RECALL, recall_params(who.user_id, asked)).fetchone()
    assert row is not None
    ids = [hit["message_id"] for hit in row[0]]
    seq_before, idx_before, fetched_before = conn.execute(SCANS, (list(READ),)).fetchone() or (
        0,
        0,
        0,
    )
    hits = conn.execute(HITS, (ids, [0.5] * len(ids))).fetchone()
    assert hits is not None and [hit["message_id"] for hit in hits[0]] == ids
    seq, idx, fetched = conn.execute(SCANS, (list(READ),)).fetchone() or (0, 0, 0)
    return seq - seq_before, idx - idx_before, fetched - fetched_before, hits[0]


def test_a_recalls_hits_are_read_without_reading_a_table_whole(
    fresh: Fresh, history: store.Caller
) -> None:
    with psycopg.connect(fresh.admin_url) as conn:
        seq, idx, _, hits = hits_scans(conn, history)
        conn.rollback()
    assert len(hits) == 5 and hits[0]["question"] == "question 7 about tea"
    assert hits[0]["answer"] == "answer 7 on tea"
    assert hits[0]["before"]["answer"] == "answer 6 on tea"
    assert hits[0]["after"]["answer"] == "answer 8 on tea"
    assert idx > 0  # the counters count this transaction's scans
    assert seq == 0


def test_the_counters_see_the_sequential_scans_the_settings_prevent(
    fresh: Fresh, history: store.Caller
) -> None:
    # The same with the function's enable_seqscan reset (rolled back): the
    # planner reads these small tables whole, and the counters show it.
    with psycopg.connect(fresh.admin_url) as conn:
        conn.execute(sql.SQL("alter function {} reset enable_seqscan").format(sql.SQL(RECALL_HITS)))
        seq, _, _, hits = hits_scans(conn, history)
        conn.rollback()
    assert len(hits) == 5 and hits[0]["question"] == "question 7 about tea"
    assert seq > 0


@pytest.mark.parametrize("sorts", ["off (the function's)", "on"])
def test_each_neighbour_is_the_first_entry_of_an_index_read_in_order(
    fresh: Fresh, history: store.Caller, sorts: str
) -> None:
    """Planned for the call's values (as Citus plans every call), a hit's
    neighbours are found by reading an index in order up to the first one
    (sorts off), not by sorting every message of the caller's: with sorts
    on (the function's setting reset, rolled back) the planner chooses that,
    and each lookup fetches the caller's every message."""
    with psycopg.connect(fresh.admin_url) as conn:
        conn.execute("set plan_cache_mode = force_custom_plan")
        if sorts == "on":
            conn.execute(
                sql.SQL("alter function {} reset enable_sort").format(sql.SQL(RECALL_HITS))
            )
        _, _, fetched, hits = hits_scans(conn, history)
        conn.rollback()
    assert len(hits) == 5 and hits[0]["after"]["answer"] == "answer 8 on tea"
    # Read in order, a hit's lookups fetch a few rows each, whatever the
    # history's length; sorted, each fetches the caller's every message.
    if sorts == "on":
        assert fetched > TURNS * len(hits)
    else:
        assert fetched <= TURNS * len(hits)
