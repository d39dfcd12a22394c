"""GET /sessions and GET /sessions/active: the caller's conversations."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from memchat import store
from memchat.api.cursors import BAD_CURSOR, pack, unpack
from memchat.api.deps import AgentQuery, AnyAgentQuery, CurrentUser, State
from memchat.api.schemas import error_responses
from memchat.api.schemas.sessions import SessionOut, SessionPage
from memchat.errors import BadRequest, SessionNotFound

router = APIRouter(tags=["sessions"])


@router.get("/sessions", response_model=SessionPage, responses=error_responses(400, 422))
async def list_sessions(
    caller: CurrentUser,
    state: State,
    agent_name: AnyAgentQuery = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> SessionPage:
    """The caller's sessions, most recently active first, a page at a time."""
    sessions = await store.list_sessions(
        state.db,
        caller,
        agent_name=agent_name,
        limit=limit + 1,
        before=decode_cursor(cursor) if cursor else None,
    )
    page, more = sessions[:limit], len(sessions) > limit
    return SessionPage(
        sessions=[SessionOut.of(s) for s in page],
        next_cursor=encode_cursor(page[-1]) if more else None,
    )


@router.get("/sessions/active", response_model=SessionOut, responses=error_responses(404, 422))
async def active_session(
    caller: CurrentUser, state: State, agent_name: AgentQuery = "default"
) -> SessionOut:
    """The session a message without session_id continues; 404 when there is none."""
    info = await store.active_session(state.db, caller, agent_name)
    if info is None:
        raise SessionNotFound(f"There is no active session for agent {agent_name!r}.")
    return SessionOut.of(info)


def encode_cursor(last: store.SessionInfo) -> str:
    """The keyset position after `last`: (last_active_at, id), opaque to clients."""
    return pack([last.last_active_at.isoformat(), str(last.id)])


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        at, session_id = unpack(cursor)
        position = datetime.fromisoformat(at), uuid.UUID(session_id)
    except (ValueError, TypeError, AttributeError):
        raise BadRequest(BAD_CURSOR) from None
    if position[0].tzinfo is None:
        raise BadRequest(BAD_CURSOR)
    return position
