"""The long-term notes: read, replace, their versions, restore."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memchat.api.schemas import INT4_MAX, AgentName, StoredText, json_integer


class NotesOut(BaseModel):
    agent_name: str
    notes: str
    version: int = Field(description="0 while no notes are stored; send as expected_version.")
    updated_at: str | None


class NotesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_name: str = AgentName
    notes: StoredText = Field(description="The whole new text, at most LTM_MAX_CHARS.")
    expected_version: int | None = Field(
        default=None,
        ge=0,
        le=INT4_MAX,
        description="Only replace if the notes are still at this version.",
    )

    _integers = field_validator("expected_version", mode="before")(staticmethod(json_integer))


class NotesDeleted(BaseModel):
    deleted: int = Field(description="Notes deleted: 1, or 0 when there were none.")
    versions_deleted: int = Field(
        description="Their kept versions deleted with them (GET /memory/versions), the current"
        " one included."
    )


class NotesVersionOut(BaseModel):
    version: int
    notes: str
    created_at: str
    current: bool = Field(description="Whether this is the notes' text now.")


class NotesVersions(BaseModel):
    agent_name: str
    versions: list[NotesVersionOut] = Field(
        description="The kept versions, newest (the current one) first."
    )


class RestoreNotesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_name: str = AgentName
    version: int = Field(ge=1, le=INT4_MAX, description="The version whose text comes back.")
    expected_version: int | None = Field(
        default=None,
        ge=0,
        le=INT4_MAX,
        description="Only restore if the notes are still at this version.",
    )

    _integers = field_validator("version", "expected_version", mode="before")(
        staticmethod(json_integer)
    )


class NeighbourOut(BaseModel):
    message_id: int
    question: str = Field(description="Its user message (the first 1,000 characters).")
    answer: str | None = Field(description="The answer it got (the first 1,000 characters).")


class RecalledOut(BaseModel):
    kind: str = Field(
        default="exchange",
        description="exchange: a live exchange; memory: a durable memory whose session is gone"
        " (its text in question when the user stated it, in answer when the assistant did).",
    )
    memory_id: int | None = Field(default=None, description="A memory's id (GET /memories).")
    session_id: str = Field(json_schema_extra={"format": "uuid"})
    message_id: int = Field(description="The user message's id.")
    created_at: str = Field(description="When the message was written (an import keeps its time).")
    score: float = Field(description="Cosine similarity of the message to the query.")
    title: str | None = Field(description="The session's title.")
    question: str = Field(description="The user's message (its first 2,000 characters).")
    answer: str | None = Field(description="The answer it got (its first 2,000 characters).")
    before: NeighbourOut | None = Field(
        description="The exchange before it in its session (null: it opens the session)."
    )
    after: NeighbourOut | None = Field(
        description="The exchange after it in its session (null: it ends the session)."
    )


class MemorySearchOut(BaseModel):
    agent_name: str
    hits: list[RecalledOut] = Field(description="Best first; fewer than k when no more match.")
    recall_ms: float = Field(description="The search's own time, the query's embedding aside.")


class MemoryOut(BaseModel):
    id: int
    agent_name: str
    text: str = Field(description="What was stated, in the words of whoever said it.")
    kind: str = Field(
        description="fact: the user said it of themselves; assistant: the assistant did."
    )
    session_id: str = Field(
        json_schema_extra={"format": "uuid"}, description="The session it was stated in."
    )
    message_id: int = Field(description="The message that stated it (gone with its session).")
    created_at: str = Field(description="When it was stated.")
    expires_at: str | None = Field(
        description="When it will be deleted: MEMORY_RETENTION_DAYS past its session's expiry"
        " (which moves with every turn while the session lives)."
    )
    score: float | None = Field(
        default=None, description="With q: the cosine similarity of the memory to q."
    )


class MemoryPage(BaseModel):
    memories: list[MemoryOut] = Field(
        description="Newest first; with q, best first (one page: next_cursor is null)."
    )
    next_cursor: str | None


class MemoryDeleted(BaseModel):
    deleted: int = Field(description="1: the memory is gone, and will not be made again.")
