"""GET /chat/stats and GET /chat/stats/{session_id}: the caller's counts, each
one statement over session counters and feedback (never their messages)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter

from memchat import store
from memchat.api.deps import AnyAgentQuery, CurrentUser, State
from memchat.api.schemas import UuidText, error_responses, parse_session_id
from memchat.api.schemas.feedback import SessionStatsOut, StatsOut
from memchat.errors import SessionNotFound

router = APIRouter(tags=["feedback and stats"])


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
