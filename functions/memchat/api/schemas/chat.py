"""POST /chat: its body, its answer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memchat.api.schemas import AgentName, StoredText, UuidText, json_integer


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # No min_length: an empty message is refused as a blank one is (400, the
    # chat use case's rule), not as a 422.
    message: StoredText = Field(
        description="The user's message: some text (empty or only whitespace: 400)."
    )
    session_id: UuidText | None = Field(default=None, description="UUID; also X-Session-ID.")
    agent_name: str = AgentName
    use_memory: bool = Field(default=True, strict=True)
    max_history_messages: int | None = Field(default=None, ge=1, le=50)
    client_message_id: StoredText | None = Field(
        default=None, min_length=1, max_length=128, description="Idempotency key."
    )
    recall_k: int | None = Field(
        default=None,
        ge=0,
        le=10,
        description="Earlier exchanges to recall by meaning (0: none); default MEMORY_RECALL_K.",
    )
    stream: bool = Field(
        default=False,
        strict=True,
        description="Answer as Server-Sent Events (as `Accept: text/event-stream`).",
    )
    search_memory: bool | None = Field(
        default=None,
        strict=True,
        description="Offer the model the search_memory tool (its calls are in"
        " `memory.search_memory`); default SEARCH_MEMORY_TOOL.",
    )

    _integers = field_validator("max_history_messages", "recall_k", mode="before")(
        staticmethod(json_integer)
    )


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class RecalledExchange(BaseModel):
    session_id: str = Field(json_schema_extra={"format": "uuid"})
    message_id: int = Field(description="The recalled user message (its answer came with it).")
    score: float = Field(description="Cosine similarity to the new message.")
    created_at: str


class MemoryInfo(BaseModel):
    enabled: bool
    messages_in_context: int
    long_term_notes_used: bool
    long_term_notes_updated: bool
    context_truncated: bool
    retrieval_ms: float
    context_tokens: int = Field(
        description="Tokens memory added to the prompt (notes, recalled exchanges, window)."
    )
    recall_ms: float = Field(description="What the turn waited for recall after loading.")
    recall_status: Literal["ok", "disabled", "failed"]
    recalled: list[RecalledExchange]
    summary_used: bool = Field(description="The session's rolling summary was in the prompt.")
    summary_covers_until: int | None = Field(
        description="The last message the summary used covers (null: no summary used)."
    )
    search_memory: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The turn's search_memory calls, in order: `query`, `k`, `status`"
        " and the `message_ids` found (`error` for a call the tool refused); empty in"
        " a stream's `start` event.",
    )


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
    message_id: int | None = Field(
        description="The stored answer's id (for feedback; as in exports); null when"
        " nothing was stored (use_memory: false)."
    )
    user_message_id: int | None = Field(
        description="The stored user message's id; null when nothing was stored."
    )
