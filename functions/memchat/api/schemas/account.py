"""DELETE /me: what was deleted."""

from __future__ import annotations

from pydantic import BaseModel


class DeletedCounts(BaseModel):
    messages: int
    sessions: int
    active_sessions: int
    long_term_memory: int
    memories: int


class AccountDeleted(BaseModel):
    deleted: DeletedCounts


# ------------------------------------------------------- feedback, stats
