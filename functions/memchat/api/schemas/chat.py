"""POST /chat: its body, its answer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from memchat.api.schemas import AgentName, StoredText, UuidText, json_integer
from memchat.model.sampling import Sampling, stop_sequences


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
    suggest: bool | None = Field(
        default=None,
        strict=True,
        description="Suggested follow-up questions with the answer (`suggestions`);"
        " default SUGGESTIONS.",
    )

    # How the answer is sampled, as POST /v1/chat/completions takes it
    # (memchat.model.sampling): sent to the model with every call of the turn.
    max_tokens: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Capped at OPENAI_MAX_TOKENS."
    )
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: StoredText | list[StoredText] | None = Field(
        default=None, description="A stop sequence, or at most 4 of them."
    )
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)

    _integers = field_validator(
        "max_history_messages", "recall_k", "max_tokens", "seed", mode="before"
    )(staticmethod(json_integer))

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _numbers(cls, value: Any) -> Any:
        if isinstance(value, bool | str):
            raise PydanticCustomError("float_type", "Input should be a valid number")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_sequences(cls, value: str | list[str] | None) -> str | list[str] | None:
        stop_sequences(value)
        return value

    def sampling(self) -> Sampling:
        return Sampling(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=stop_sequences(self.stop),
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
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
    suggestions: list[str] | None = Field(
        default=None,
        description="Up to 3 follow-up questions the user might send next (`suggest`, or"
        " SUGGESTIONS), never stored; null when not asked for, and in a stream's `done`"
        " (a `suggestions` event follows it).",
    )
