"""DELETE /me: erase everything the caller has stored."""

from __future__ import annotations

from fastapi import APIRouter

from memchat import store
from memchat.api.deps import CurrentUser, State
from memchat.api.schemas import error_responses
from memchat.api.schemas.account import AccountDeleted, DeletedCounts

router = APIRouter(tags=["account"])


@router.delete("/me", response_model=AccountDeleted, responses=error_responses(429))
async def delete_me(caller: CurrentUser, state: State) -> AccountDeleted:
    """Delete all of the caller's sessions, messages, active pointers and notes at once."""
    counts = await store.delete_user_data(state.db, caller)
    return AccountDeleted(deleted=DeletedCounts(**counts))
