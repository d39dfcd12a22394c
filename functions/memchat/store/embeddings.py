"""Embeddings: recall by similarity to a new message, and the stored column's size
(read, and changed by `memchat db reembed --dimensions N`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from memchat.store.db import REQUEST_ROLE, Database
from memchat.store.fragments import vector_param
from memchat.store.records import Caller, Hit, RecallQuery
from memchat.throttle import Bucket

# memchat.recall's parameters by name: each named once, here.
# The live exchanges (memchat.recall) and, in the same pipeline, the durable
# memories whose session is gone (memchat.recall_memories): each call a
# statement of its own, so that on Citus each is delegated to the caller's
# worker (`memchat db distribute`).
RECALL = """
select memchat.recall(
  p_user_id => %(user_id)s,
  p_session_id => %(session_id)s, p_agent_name => %(agent_name)s, p_window => %(window)s,
  p_query => %(embedding)s::extensions.vector, p_model => %(model)s, p_text => %(text)s,
  p_k => %(k)s, p_min_score => %(min_score)s, p_collapse => %(duplicate_score)s,
  p_from => %(period_start)s, p_until => %(period_end)s)
"""
RECALL_MEMORIES = """
select memchat.recall_memories(%(user_id)s, %(agent_name)s, %(embedding)s::extensions.vector,
                               %(model)s, %(text)s, %(k)s, %(min_score)s)
"""
_EMBEDDING_DIMENSIONS = "select memchat.embedding_dimensions()"
# What no longer fits goes first, in the same transaction as the new type; the
# type change resets the column's storage, kept in the row (supabase/schemas/functions/recall.sql).
# The tables holding embeddings: the messages' and their fact keys'.
_VECTOR_TABLES = ("message_embeddings", "message_facts")
_DROP_OTHER_SIZES = sql.SQL("delete from memchat.{} where extensions.vector_dims(embedding) <> %s")
# A message's fact keys were made (supabase/schemas/functions/embeddings.sql) only while its
# embedding is there: the marker goes with it.
_DROP_MARKERS_WITHOUT_EMBEDDING = """
delete from memchat.message_facts_made m
 where not exists (select 1 from memchat.message_embeddings e
                    where e.message_id = m.message_id and e.user_id = m.user_id)"""
# Memories outlive their messages, so they cannot be embedded again from
# them: they keep their text (found by words) without an embedding.
_FORGET_OTHER_SIZES = (
    "update memchat.memories set embedding = null, model = null"
    " where extensions.vector_dims(embedding) <> %s"
)
_RESIZE = sql.SQL("alter table memchat.{} alter column embedding type extensions.vector({})")
_KEEP_IN_ROW = sql.SQL("alter table memchat.{} alter column embedding set storage main")
# The HNSW indexes (supabase/schemas/functions/recall.sql: over the keys as
# halfvec of the column's size, at most 4,000 dimensions) go before the type
# change and come back after it where they can, with the statement that reads
# them written for the new size (memchat.index_recall_keys).
_DROP_INDEX = sql.SQL("drop index if exists memchat.{}")
_VECTOR_INDEXES = ("message_embeddings_embedding_idx", "message_facts_embedding_idx")
_INDEX_RECALL_KEYS = "select memchat.index_recall_keys()"
_ADOPT_UNKNOWN = "update memchat.message_embeddings set model = %s where model is null"
_ANY_EMBEDDING = "select exists (select 1 from memchat.message_embeddings)"


def recall_params(user_id: uuid.UUID, query: RecallQuery) -> dict[str, Any]:
    """RECALL's and RECALL_MEMORIES' parameters for `query` by `user_id`."""
    period = query.period
    return {
        "user_id": user_id,
        "session_id": query.session_id,
        "agent_name": query.agent_name,
        "window": query.window,
        "embedding": vector_param(query.embedding.vector),
        "model": query.embedding.model,
        "text": query.text,
        "k": query.k,
        "min_score": query.min_score,
        "duplicate_score": query.duplicate_score,
        "period_start": period.start if period else None,
        "period_end": period.end if period else None,
    }


def hits_from_json(
    rows: list[Mapping[str, Any]], memories: list[Mapping[str, Any]], k: int
) -> list[Hit]:
    """The exchanges and the memories recalled, merged by score, each list's
    own order kept (the exchanges' fused ranking), at most k."""
    exchanges = [Hit.from_json(row) for row in rows]
    remembered = [Hit.from_memory_json(row) for row in memories]
    merged: list[Hit] = []
    while (exchanges or remembered) and len(merged) < k:
        if not remembered or (exchanges and exchanges[0].score >= remembered[0].score):
            merged.append(exchanges.pop(0))
        else:
            merged.append(remembered.pop(0))
    return merged


async def recall(
    db: Database, caller: Caller, query: RecallQuery, *, throttle: Bucket | None = None
) -> list[Hit]:
    """The caller's earlier user messages best matching `query`, best first,
    each with the answer it got and its neighbours (memchat.recall), and the
    durable memories of transcripts gone; taking a token of `throttle`
    first, in the same transaction, when given."""
    params = recall_params(caller.user_id, query)
    async with db.pipeline(caller.claims, throttle=throttle) as conn:
        exchanges = conn.cursor()
        await exchanges.execute(RECALL, params)
        memories = conn.cursor()
        await memories.execute(RECALL_MEMORIES, params)
    rows = await exchanges.fetchone()
    remembered = await memories.fetchone()
    assert rows is not None and remembered is not None
    return hits_from_json(rows[0], remembered[0], query.k)


def embedding_dimensions(conn: psycopg.Connection[Any], *, role: str | None = REQUEST_ROLE) -> int:
    """The size of the stored embedding column (checked against the settings at
    start), read as `role` (None: as the connecting role, e.g. the owner)."""
    with conn.transaction():
        if role is not None:
            conn.execute("select set_config('role', %s, true)", (role,))
        row = conn.execute(_EMBEDDING_DIMENSIONS).fetchone()
    assert row is not None
    return int(row[0])


async def stored_embedding_dimensions(db: Database, caller: Caller | None) -> int:
    """embedding_dimensions, inside a request (when it could not be checked at
    start), or as the connecting role (caller None: the backfill's worker)."""
    async with db.pipeline(caller.claims if caller else None) as conn:
        cur = conn.cursor()
        await cur.execute(_EMBEDDING_DIMENSIONS)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def resize_embeddings(conn: psycopg.Connection[Any], dimensions: int) -> int:
    """Make the stored column vector(`dimensions`), as the table's owner: the
    embeddings of another size are deleted first, in the same transaction
    (their messages stay; the backfill embeds them again; memories keep their
    text, without an embedding), and the HNSW
    indexes are made again where pgvector and the size allow them
    (memchat.index_recall_keys). Returns how many were deleted."""
    deleted = 0
    with conn.transaction():
        for index in _VECTOR_INDEXES:
            conn.execute(_DROP_INDEX.format(sql.Identifier(index)))
        for name in _VECTOR_TABLES:
            table = sql.Identifier(name)
            rows = conn.execute(_DROP_OTHER_SIZES.format(table), (dimensions,)).rowcount
            if name == "message_embeddings":
                deleted = rows
            conn.execute(_RESIZE.format(table, sql.Literal(dimensions)))
            conn.execute(_KEEP_IN_ROW.format(table))
        conn.execute(_FORGET_OTHER_SIZES, (dimensions,))
        conn.execute(_RESIZE.format(sql.Identifier("memories"), sql.Literal(dimensions)))
        conn.execute(_KEEP_IN_ROW.format(sql.Identifier("memories")))
        conn.execute(_DROP_MARKERS_WITHOUT_EMBEDDING)
        conn.execute(_INDEX_RECALL_KEYS)
    return deleted


def has_embeddings(conn: psycopg.Connection[Any]) -> bool:
    """Whether any embedding is stored (as the owner: everyone's)."""
    row = conn.execute(_ANY_EMBEDDING).fetchone()
    return bool(row and row[0])


def adopt_unknown_embeddings(conn: psycopg.Connection[Any], model: str) -> int:
    """Record `model` as the maker of the embeddings stored before models were
    recorded (as the owner): for an operator who knows it made them. Returns
    how many were marked."""
    return conn.execute(_ADOPT_UNKNOWN, (model,)).rowcount
