"""Request and response bodies of the contract (API.md)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from memchat.api.errors import UNPAIRED_SURROGATES
from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import BadRequest
from memchat.store import SessionInfo

AgentName = Field(default="default", pattern=AGENT_NAME_PATTERN, description="Agent name.")
# PostgreSQL's int4 (notes version): a larger number is a 422, not a database error.
INT4_MAX = 2**31 - 1


def _storable(value: object) -> object:
    # JSON's \u escapes can carry both, PostgreSQL text can hold neither:
    # refused here, as a 422 naming the field, not in the database (after the
    # model was paid for). Before pydantic's own str checks, which catch
    # surrogates only where a constraint makes them look at the text.
    if isinstance(value, str):
        if "\x00" in value:
            raise PydanticCustomError("unstorable_text", "must not contain NUL (U+0000) characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise PydanticCustomError("unstorable_text", UNPAIRED_SURROGATES) from None
    return value


# What _storable allows, said in the schema too (clients and the fuzzer read it).
STORABLE_PATTERN = "^[^\\u0000\\ud800-\\udfff]*$"

StoredText = Annotated[
    str, BeforeValidator(_storable), Field(json_schema_extra={"pattern": STORABLE_PATTERN})
]
"""Free text from a client that is stored or sent on: refuses NUL and lone surrogates."""

_UUID_SCHEMA = {"type": "string", "format": "uuid"}
UuidText = Annotated[str, WithJsonSchema(_UUID_SCHEMA)]
"""A UUID in the schema, a string to the validator: `parse_session_id` checks it,
so a malformed id is the contract's 400 (not a 422) and any case is accepted."""
UuidHeader = Annotated[str | None, WithJsonSchema(_UUID_SCHEMA)]
"""UuidText for an optional header: absent is None, but never null on the wire."""


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

    message: StoredText = Field(min_length=1, description="The user's message.")
    session_id: UuidText | None = Field(default=None, description="UUID; also X-Session-ID.")
    agent_name: str = AgentName
    use_memory: bool = True
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
        description="Answer as Server-Sent Events (as `Accept: text/event-stream`).",
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


Responses = dict[int | str, dict[str, Any]]

_RETRY_AFTER = {
    "description": "Seconds to wait before retrying.",
    "schema": {"type": "integer", "minimum": 1},
}
# Every error status an endpoint can answer, with the contract's codes.
_ERRORS: dict[int, dict[str, Any]] = {
    400: {"description": "Malformed id, cursor or JSON, or conflicting input (`bad_request`)"},
    401: {
        "description": "Missing or invalid access token (`unauthorized`)",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string", "enum": ["Bearer"]}}},
    },
    404: {"description": "Not found (`not_found`, `session_not_found`, `message_not_found`)"},
    409: {
        "description": "The resource changed meanwhile (`conflict`)",
        "headers": {"Retry-After": _RETRY_AFTER},
    },
    413: {"description": "Request body over 1 MB, or text over its limit (`payload_too_large`)"},
    422: {"description": "A field failed validation (`validation_error`)"},
    429: {
        "description": "Throttled: too many requests of this kind (`rate_limited`)",
        "headers": {"Retry-After": {**_RETRY_AFTER, "required": True}},
    },
    502: {"description": "The model provider failed; nothing stored (`model_upstream_error`)"},
    503: {
        "description": "Database or sign-in keys unreachable"
        " (`database_unavailable`, `auth_unavailable`)",
        "headers": {"Retry-After": _RETRY_AFTER},
    },
    504: {"description": "The model took too long; nothing stored (`model_timeout`)"},
}


def error_responses(*statuses: int, descriptions: dict[int, str] | None = None) -> Responses:
    """OpenAPI `responses` for an authenticated endpoint: the given error
    statuses plus the 401 and 503 every such endpoint can answer, each with
    the ErrorOut schema; `descriptions` says more where an endpoint can."""
    responses: Responses = {}
    for status in sorted({*statuses, 401, 503}):
        responses[status] = {"model": ErrorOut, **_ERRORS[status]}
        if descriptions and status in descriptions:
            responses[status]["description"] = descriptions[status]
    return responses


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    database: Literal["ok", "unreachable"]


# ------------------------------------------------- clear, sessions, memory, account


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


class DeletedCounts(BaseModel):
    messages: int
    sessions: int
    active_sessions: int
    long_term_memory: int


class AccountDeleted(BaseModel):
    deleted: DeletedCounts


# ------------------------------------------------------- feedback, stats

# PostgreSQL's bigint (message ids): a larger number is a 422, not a database error.
INT8_MAX = 2**63 - 1
MessageId = Annotated[int, Field(ge=1, le=INT8_MAX, description="An answer's message_id.")]


class FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message_id: MessageId
    rating: Literal[-1, 0, 1] = Field(description="-1 bad, 0 neutral, 1 good.")
    comment: StoredText | None = Field(
        default=None, max_length=2000, description="Optional, at most 2000 characters."
    )


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
