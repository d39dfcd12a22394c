"""Feedback on answers and the caller's stats.

POST /chat/feedback and DELETE /chat/feedback/{message_id}: a rating (-1, 0,
1) and an optional comment on one of the caller's answers, one per answer.
GET /chat/stats and GET /chat/stats/{session_id}: the caller's counts, each
one statement over session counters and feedback (never their messages).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path

from memchat import store
from memchat.api.deps import AnyAgentQuery, CurrentUser, State
from memchat.api.schemas import (
    INT8_MAX,
    FeedbackBody,
    FeedbackDeleted,
    FeedbackOut,
    SessionStatsOut,
    StatsOut,
    UuidText,
    error_responses,
    parse_session_id,
)
from memchat.errors import MessageNotFound, SessionNotFound

router = APIRouter(tags=["feedback and stats"])

NOT_AN_ANSWER = "message_id is not one of your answers (an assistant message you were sent)."
_NOT_FOUND = {404: "Not one of the caller's answers (`message_not_found`)"}
_POST_ERRORS = {**_NOT_FOUND, 413: "Body over 1 MB (`payload_too_large`)"}


@router.post(
    "/chat/feedback",
    response_model=FeedbackOut,
    responses=error_responses(400, 404, 413, 422, 429, descriptions=_POST_ERRORS),
)
async def give_feedback(body: FeedbackBody, caller: CurrentUser, state: State) -> FeedbackOut:
    """Rate an answer (its `message_id` from the chat response or the export);
    a second rating of the same answer replaces the first."""
    feedback = await store.set_feedback(
        state.db, caller, body.message_id, body.rating, body.comment
    )
    if feedback is None:
        raise MessageNotFound(NOT_AN_ANSWER)
    return FeedbackOut(
        message_id=feedback.message_id,
        session_id=str(feedback.session_id),
        agent_name=feedback.agent_name,
        rating=feedback.rating,
        comment=feedback.comment,
        created_at=feedback.created_at.isoformat(),
        updated_at=feedback.updated_at.isoformat(),
    )


@router.delete(
    "/chat/feedback/{message_id}",
    response_model=FeedbackDeleted,
    responses=error_responses(404, 422, 429, descriptions=_NOT_FOUND),
)
async def delete_feedback(
    message_id: Annotated[int, Path(ge=1, le=INT8_MAX)], caller: CurrentUser, state: State
) -> FeedbackDeleted:
    """Remove the caller's rating of an answer."""
    deleted = await store.delete_feedback(state.db, caller, message_id)
    if deleted is None:
        raise MessageNotFound(NOT_AN_ANSWER)
    return FeedbackDeleted(message_id=message_id, deleted=deleted)


@router.get("/chat/stats", response_model=StatsOut, responses=error_responses(422, 429))
async def stats(
    caller: CurrentUser,
    state: State,
    agent_name: AnyAgentQuery = None,
) -> StatsOut:
    """The caller's sessions, messages, turns, tokens and feedback (all agents
    when agent_name is not given)."""
    return StatsOut(**_isoformat(await store.chat_stats(state.db, caller, agent_name)))


@router.get(
    "/chat/stats/{session_id}",
    response_model=SessionStatsOut,
    responses=error_responses(400, 404, 422, 429),
)
async def session_stats(session_id: UuidText, caller: CurrentUser, state: State) -> SessionStatsOut:
    """The same for one of the caller's sessions, and how long it has lasted."""
    parsed = parse_session_id(session_id)
    assert parsed is not None
    found = await store.session_stats(state.db, caller, parsed)
    if found is None:
        raise SessionNotFound()
    return SessionStatsOut(**_isoformat(found))


_TIMES = ("first_activity_at", "last_activity_at")


def _isoformat(stats: dict[str, Any]) -> dict[str, Any]:
    """Timestamps written as every other endpoint writes them (Python's
    isoformat: PostgreSQL's JSON drops trailing zeros of the microseconds)."""
    return {
        key: datetime.fromisoformat(value).isoformat() if key in _TIMES and value else value
        for key, value in stats.items()
    }
