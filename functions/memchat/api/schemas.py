"""Request and response bodies of the contract (API.md)."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import BadRequest
from memchat.store import SessionInfo

AgentName = Field(default="default", pattern=AGENT_NAME_PATTERN, description="Agent name.")


def parse_session_id(value: str | None, source: str = "session_id") -> uuid.UUID | None:
    """A session id as the contract accepts it (any-case UUID); 400 otherwise."""
    if value is None:
        return None
    try:
        return uuid.UUID(value.strip())
    except (ValueError, AttributeError):
        raise BadRequest(
            f"{source} must be a UUID, e.g. 123e4567-e89b-12d3-a456-426614174000."
        ) from None


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str = Field(min_length=1, description="The user's message.")
    session_id: str | None = Field(default=None, description="UUID; also X-Session-ID.")
    agent_name: str = AgentName
    use_memory: bool = True
    max_history_messages: int | None = Field(default=None, ge=1, le=50)
    client_message_id: str | None = Field(default=None, min_length=1, max_length=128)


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class MemoryInfo(BaseModel):
    enabled: bool
    messages_in_context: int
    long_term_notes_used: bool
    long_term_notes_updated: bool
    context_truncated: bool
    retrieval_ms: float


class SessionMeta(BaseModel):
    message_count: int
    created_at: str
    last_active_at: str
    expires_at: str


class ChatResponse(BaseModel):
    answer: str
    session_id: str
    agent_name: str
    model: str
    usage: Usage
    memory: MemoryInfo
    session: SessionMeta | None


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


class ErrorOut(BaseModel):
    error: str
    detail: str
    request_id: str


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": description}
    for status, description in {
        400: "Malformed id or conflicting input",
        401: "Missing or invalid access token",
        404: "Not found (also another user's session)",
        422: "Body validation failed",
        503: "Database unavailable",
    }.items()
}


# ------------------------------------------------- clear, sessions, memory, account


class ClearSessionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(
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


class NotesOut(BaseModel):
    agent_name: str
    notes: str
    version: int = Field(description="0 while no notes are stored; send as expected_version.")
    updated_at: str | None


class NotesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_name: str = AgentName
    notes: str = Field(description="The whole new text, at most LTM_MAX_CHARS.")
    expected_version: int | None = Field(
        default=None, ge=0, description="Only replace if the notes are still at this version."
    )

    @field_validator("notes")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        # PostgreSQL text cannot hold U+0000.
        if "\x00" in value:
            raise ValueError("must not contain the NUL character (U+0000)")
        return value


class NotesDeleted(BaseModel):
    deleted: bool


class DeletedCounts(BaseModel):
    messages: int
    sessions: int
    active_sessions: int
    long_term_memory: int


class AccountDeleted(BaseModel):
    deleted: DeletedCounts
