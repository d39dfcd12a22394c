"""POST /chat/clear-session: forget a conversation and start a fresh one."""

from __future__ import annotations

from fastapi import APIRouter

from memchat.api.deps import CurrentUser, State
from memchat.api.schemas import error_responses, parse_session_id
from memchat.api.schemas.sessions import ClearSessionBody, ClearSessionResponse
from memchat.usecases import sessions

router = APIRouter(tags=["chat"])


@router.post(
    "/chat/clear-session",
    response_model=ClearSessionResponse,
    responses=error_responses(400, 404, 413, 422, 429),
)
async def clear_session(
    body: ClearSessionBody, caller: CurrentUser, state: State
) -> ClearSessionResponse:
    """Delete a session's messages now; a fresh session becomes the agent's active one.

    With no session_id, the active session of agent_name is cleared.
    """
    cleared = await sessions.clear_session(
        state.db, state.settings, caller, parse_session_id(body.session_id), body.agent_name
    )
    return ClearSessionResponse(
        cleared_session_id=str(cleared.cleared_session_id),
        deleted_messages=cleared.deleted_messages,
        new_session_id=str(cleared.new_session.id),
    )
