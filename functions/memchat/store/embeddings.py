"""Embeddings: recall by similarity to a new message, and the stored column's size."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import psycopg

from memchat.store.db import REQUEST_ROLE, Database
from memchat.store.fragments import vector_literal
from memchat.store.records import Caller, Hit

# Similar earlier messages at or above this similarity to a better hit are
# the same memory said twice: only the better one is recalled.
COLLAPSE_SIMILARITY = 0.9

RECALL = "select memchat.recall(%s, %s, %s, %s::extensions.vector, %s, %s, %s)"
_EMBEDDING_DIMENSIONS = "select memchat.embedding_dimensions()"


def recall_args(
    *,
    session_id: uuid.UUID | None,
    agent_name: str,
    window: int,
    query: list[float],
    k: int,
    min_score: float,
) -> tuple[Any, ...]:
    """The parameters of RECALL."""
    return (
        session_id,
        agent_name,
        window,
        vector_literal(query),
        k,
        min_score,
        COLLAPSE_SIMILARITY,
    )


def hits_from_json(rows: list[Mapping[str, Any]]) -> list[Hit]:
    return [Hit.from_json(row) for row in rows]


async def recall(
    db: Database,
    caller: Caller,
    *,
    session_id: uuid.UUID | None,
    agent_name: str,
    window: int,
    query: list[float],
    k: int,
    min_score: float,
) -> list[Hit]:
    """The caller's earlier user messages of `agent_name` most like `query`, best
    first (memchat.recall: live sessions, outside the window of `session_id`,
    near-duplicates collapsed), each with the answer it got."""
    args = recall_args(
        session_id=session_id,
        agent_name=agent_name,
        window=window,
        query=query,
        k=k,
        min_score=min_score,
    )
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(RECALL, args)
    row = await cur.fetchone()
    assert row is not None
    return hits_from_json(row[0])


def embedding_dimensions(conn: psycopg.Connection[Any]) -> int:
    """The size of the stored embedding column (checked against the settings at start)."""
    with conn.transaction():
        conn.execute("select set_config('role', %s, true)", (REQUEST_ROLE,))
        row = conn.execute(_EMBEDDING_DIMENSIONS).fetchone()
    assert row is not None
    return int(row[0])


async def stored_embedding_dimensions(db: Database, caller: Caller) -> int:
    """embedding_dimensions, inside a request (when it could not be checked at start)."""
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_EMBEDDING_DIMENSIONS)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])
