"""The long-term notes: read, replace, their versions, restore."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from memchat.api.schemas import INT4_MAX, AgentName, StoredText


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


class NotesDeleted(BaseModel):
    deleted: bool


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
