"""Sessions as a user manages them: clearing one starts a fresh one."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from memchat import store

if TYPE_CHECKING:
    from memchat.config import Settings


async def clear_session(
    db: store.Database,
    settings: Settings,
    caller: store.Caller,
    session_id: uuid.UUID | None,
    agent_name: str,
) -> store.Cleared:
    """Delete a session's messages now (None: the agent's active session) and
    make a fresh session, expiring after SESSION_TTL_HOURS, the active one."""
    return await store.clear_session(
        db,
        caller,
        session_id=session_id,
        agent_name=agent_name,
        ttl=timedelta(hours=settings.session_ttl_hours),
    )
