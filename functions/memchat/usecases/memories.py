"""Durable memory as the user sees it: a page of memories, those matching a
text (recall's search over them), one forgotten. One place for GET and
DELETE /memories and the MCP tools list_memories and forget_memory."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from memchat import store
from memchat.errors import BadRequest, MemoryNotFound
from memchat.throttle import Bucket
from memchat.usecases.completions import storable
from memchat.usecases.recall.meaning import embedding_text

if TYPE_CHECKING:
    from memchat.config import Settings
    from memchat.store.db import Database
    from memchat.usecases.recall.service import Recall


async def memory_page(
    db: Database,
    settings: Settings,
    caller: store.Caller,
    *,
    agent_name: str | None,
    before: tuple[datetime, int, int] | None,
    limit: int,
) -> tuple[list[store.Memory], bool]:
    """The caller's memories (of one agent, or all), the latest stated
    first, after `before` (the last one's (created_at, message_id,
    ordinal)), at most
    `limit`; and whether more follow."""
    page = await store.list_memories(
        db,
        caller,
        agent_name=agent_name,
        before=before,
        limit=limit + 1,
        retention_days=settings.memory_retention_days,
    )
    return page[:limit], len(page) > limit


async def memories_matching(
    db: Database,
    recall: Recall,
    settings: Settings,
    caller: store.Caller,
    *,
    agent_name: str,
    text: str,
    limit: int,
) -> list[store.Memory]:
    """The caller's memories of `agent_name` best matching `text`, by meaning
    and words (by words alone when `text` cannot be embedded now)."""
    if not text.strip():
        raise BadRequest("q is blank.")
    storable("q", text)
    query = await recall.query_embedding(caller, embedding_text(text))
    return await store.search_memories(
        db,
        caller,
        agent_name=agent_name,
        text=text,
        query=query.vector if query else None,
        model=query.model if query else "",
        limit=limit,
        min_score=settings.memory_recall_min_score,
        retention_days=settings.memory_retention_days,
        throttle=Bucket.READ,
    )


async def forget_memory(db: Database, caller: store.Caller, memory_id: int) -> None:
    """Delete one of the caller's memories for good (MemoryNotFound: none)."""
    if not await store.delete_memory(db, caller, memory_id):
        raise MemoryNotFound(f"You have no memory {memory_id}.")


def memory_dict(memory: store.Memory) -> dict[str, Any]:
    """A memory as the API and the MCP tools show it."""
    return {
        "id": memory.id,
        "agent_name": memory.agent_name,
        "text": memory.text,
        "kind": memory.kind,
        "session_id": str(memory.session_id),
        "message_id": memory.message_id,
        "created_at": memory.created_at.isoformat(),
        "expires_at": memory.expires_at.isoformat() if memory.expires_at else None,
        "score": memory.score,
    }
