"""Someone else's session id costs what an unknown id costs.

Review finding 14 asks that another user's session id and an id nobody
holds answer alike in status, body and timing. Status and body are checked
through the API (tests/api/test_hardening.py); here, the work: every
statement that looks a session up by a client's id reads exactly the same
index entries and rows for both (the key is (id, user_id), and the caller's
id, named or from RLS, is part of the index scan), so no timing can tell
them apart. With the old key (id alone) the lookup fetched the other user's
row and RLS dropped it afterwards: more work, and this test failed.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.abc import Query

from memchat import store
from tests.store.conftest import World
from tests.utils.store_data import become, load_context_args

# What the current transaction read from chat_sessions.
_READS = """
select coalesce(seq_scan, 0), coalesce(seq_tup_read, 0), coalesce(idx_scan, 0),
       coalesce(idx_tup_fetch, 0)
  from pg_stat_xact_user_tables
 where schemaname = 'public' and relname = 'chat_sessions'
"""

LOOKUPS: dict[str, tuple[Query, Any]] = {
    "load a turn": (
        store.turns.LOAD_CONTEXT,
        load_context_args,
    ),
    "export a session": (store.export._SESSION, lambda uid, sid: (uid, sid)),
    "session stats": ("select memchat.session_stats(%s, %s)", lambda uid, sid: (uid, sid)),
    "clear a session": (
        store.sessions._CLEAR_LOCK,
        lambda uid, sid: {"user_id": uid, "session_id": sid, "agent_name": "default"},
    ),
    "recall": (
        store.embeddings.RECALL,
        lambda uid, sid: store.embeddings.recall_params(
            uid,
            store.RecallQuery(
                session_id=sid,
                agent_name="default",
                window=10,
                embedding=store.Embedding("m", [0.1] * 512),
                k=3,
                min_score=0.3,
                duplicate_score=0.95,
                text="hello",
            ),
        ),
    ),
}


def reads(conn: psycopg.Connection, claims: dict[str, Any], query: Query, params: Any) -> tuple:
    """What one lookup read from chat_sessions, in a transaction of its own."""
    with conn.transaction(force_rollback=True):
        before = conn.execute(_READS).fetchone() or (0, 0, 0, 0)
        become(conn, claims)
        conn.execute(query, params)
        conn.execute("reset role")
        after = conn.execute(_READS).fetchone() or (0, 0, 0, 0)
    return tuple(b - a for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("lookup", list(LOOKUPS))
def test_someone_elses_id_reads_what_an_unknown_id_reads(
    conn: psycopg.Connection, world: World, lookup: str
) -> None:
    query, params = LOOKUPS[lookup]
    claims = dict(world.b.claims)
    # Once each first: a session's first call may plan its statements (recall
    # runs generic plans, supabase/schemas/functions/partitions.sql), and the plans are
    # the same whichever id comes; what is compared is the lookup itself.
    b = world.b.user_id
    reads(conn, claims, query, params(b, uuid.uuid4()))
    reads(conn, claims, query, params(b, world.a_session))
    someone_elses = reads(conn, claims, query, params(b, world.a_session))
    nobodys = reads(conn, claims, query, params(b, uuid.uuid4()))
    assert someone_elses == nobodys
    assert someone_elses[:2] == (0, 0)  # never a sequential scan
