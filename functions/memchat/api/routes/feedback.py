"""POST /chat/feedback and DELETE /chat/feedback/{message_id}: a rating (-1,
0, 1) and an optional comment on one of the caller's answers, one per answer."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from memchat import store
from memchat.api.deps import CurrentUser, State
from memchat.api.schemas import INT8_MAX, error_responses
from memchat.api.schemas.feedback import FeedbackBody, FeedbackDeleted, FeedbackOut
from memchat.errors import MessageNotFound

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
