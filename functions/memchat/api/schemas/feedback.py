"""Feedback on answers, and the stats."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memchat.api.schemas import MessageId, StoredText, json_integer


class FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message_id: MessageId
    rating: Literal[-1, 0, 1] = Field(description="-1 bad, 0 neutral, 1 good.")
    comment: StoredText | None = Field(
        default=None, max_length=2000, description="Optional, at most 2000 characters."
    )

    _integers = field_validator("message_id", "rating", mode="before")(staticmethod(json_integer))


class FeedbackOut(BaseModel):
    message_id: int
    session_id: str
    agent_name: str
    rating: int
    comment: str | None
    created_at: str
    updated_at: str


class FeedbackDeleted(BaseModel):
    message_id: int
    deleted: bool = Field(description="false: there was no feedback on this answer.")


class SessionCounts(BaseModel):
    total: int
    active: int = Field(description="Not cleared and not expired.")
    cleared: int


class TokenCounts(BaseModel):
    prompt: int
    completion: int


class FeedbackCounts(BaseModel):
    positive: int
    negative: int
    neutral: int
    with_comment: int


class StorageCounts(BaseModel):
    stored_messages: int = Field(
        description="Messages the caller's live sessions hold, all agents (expired ones hold none)."
    )
    max_stored_messages: int = Field(
        description="The most they may hold (USER_MAX_STORED_MESSAGES, or the database's lower"
        " limit): a write past it is refused, 413 `quota_exceeded`."
    )


class StatsOut(BaseModel):
    agent_name: str | None = Field(description="The agent asked for; null: all agents.")
    sessions: SessionCounts
    messages: int = Field(description="Messages stored now (all kinds, tool rounds too).")
    turns: int = Field(description="Turns answered (kept when a session is cleared).")
    tokens: TokenCounts = Field(description="Billed by the model (kept when cleared).")
    feedback: FeedbackCounts
    first_activity_at: str | None
    last_activity_at: str | None
    avg_messages_per_session: float
    storage: StorageCounts = Field(description="The caller's quota, whatever agent_name says.")


class SessionStatsOut(BaseModel):
    session_id: str
    agent_name: str
    status: Literal["active", "cleared", "expired"]
    messages: int
    turns: int
    tokens: TokenCounts
    feedback: FeedbackCounts
    first_activity_at: str
    last_activity_at: str
    duration_seconds: float = Field(description="From the first to the last activity.")
