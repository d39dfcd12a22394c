"""Sessions: the list, the active one, clearing one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from memchat.api.schemas import AgentName, UuidText

if TYPE_CHECKING:
    from memchat.store import SessionInfo


class SessionOut(BaseModel):
    id: str
    agent_name: str
    title: str | None
    status: str
    message_count: int
    created_at: str
    last_active_at: str
    expires_at: str

    @classmethod
    def of(cls, info: SessionInfo) -> SessionOut:
        return cls(**info.as_dict())


class ClearSessionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: UuidText | None = Field(
        default=None, description="UUID; null: the active session of agent_name."
    )
    agent_name: str = AgentName


class ClearSessionResponse(BaseModel):
    cleared_session_id: str
    deleted_messages: int
    new_session_id: str


class SessionPage(BaseModel):
    sessions: list[SessionOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")
