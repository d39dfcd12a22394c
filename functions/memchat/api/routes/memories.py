"""GET /memories and DELETE /memories/{id}: what durable memory keeps about
the caller (memchat.memories), a page at a time or searched, and one memory
deleted for good. Served with the chat routes: a search embeds `q` with their
embeddings client."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query

from memchat import store
from memchat.api.cursors import BAD_CURSOR, pack, unpack
from memchat.api.deps import AnyAgentQuery, CurrentUser, State
from memchat.api.schemas import INT8_MAX, STORABLE_PATTERN, error_responses
from memchat.api.schemas.memory import MemoryDeleted, MemoryOut, MemoryPage
from memchat.errors import BadRequest
from memchat.usecases.memories import forget_memory, memories_matching, memory_dict, memory_page

router = APIRouter(tags=["memory"])

_NOT_FOUND = {404: "Not one of the caller's memories (`memory_not_found`)"}


@router.get("/memories", response_model=MemoryPage, responses=error_responses(400, 422, 429))
async def list_memories(
    caller: CurrentUser,
    state: State,
    agent_name: AnyAgentQuery = None,
    q: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=16000,
            json_schema_extra={"pattern": STORABLE_PATTERN},
            description="Only those matching this, best first (recall's search: meaning and"
            " words); needs agent_name's agent (default 'default').",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> MemoryPage:
    """The caller's memories, newest first, a page at a time; with `q`, the
    best `limit` matching it."""
    if q is not None:
        if cursor is not None:
            raise BadRequest("cursor pages a listing; a search with q is one page.")
        found = await memories_matching(
            state.db,
            state.chat.recall,
            state.settings,
            caller,
            agent_name=agent_name or "default",
            text=q,
            limit=limit,
        )
        return MemoryPage(memories=[MemoryOut(**memory_dict(m)) for m in found], next_cursor=None)
    page, more = await memory_page(
        state.db,
        state.settings,
        caller,
        agent_name=agent_name,
        before=_decode(cursor) if cursor else None,
        limit=limit,
    )
    return MemoryPage(
        memories=[MemoryOut(**memory_dict(m)) for m in page],
        next_cursor=_encode(page[-1]) if more else None,
    )


@router.delete(
    "/memories/{memory_id}",
    response_model=MemoryDeleted,
    responses=error_responses(404, 422, 429, descriptions=_NOT_FOUND),
)
async def delete_memory(
    memory_id: Annotated[int, Path(ge=1, le=INT8_MAX)], caller: CurrentUser, state: State
) -> MemoryDeleted:
    """Delete one of the caller's memories; the backfill never makes it again."""
    await forget_memory(state.db, caller, memory_id)
    return MemoryDeleted(deleted=1)


def _encode(last: store.Memory) -> str:
    """The keyset position after `last`: (created_at, message_id, ordinal),
    opaque to clients."""
    return pack([last.created_at.isoformat(), last.message_id, last.ordinal])


def _decode(cursor: str) -> tuple[datetime, int, int]:
    try:
        at, message_id, ordinal = unpack(cursor)
        position = datetime.fromisoformat(at), int(message_id), int(ordinal)
    except (ValueError, TypeError, AttributeError):
        raise BadRequest(BAD_CURSOR) from None
    if (
        position[0].tzinfo is None
        or not 1 <= position[1] <= INT8_MAX
        or not 0 <= position[2] <= 32767
    ):
        raise BadRequest(BAD_CURSOR)
    return position
