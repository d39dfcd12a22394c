"""The store's records: what its functions take and return.

Plain frozen dataclasses (Turn, built up by the chat turn, is not frozen),
built from the JSON the database returns (`from_json`), with no behaviour
beyond that. The use cases and the HTTP edge work with these, never with
rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from memchat.auth import Caller

__all__ = ["Caller"]  # the verified user, as every store function takes it (memchat.auth)


@dataclass(frozen=True)
class SessionInfo:
    id: uuid.UUID
    agent_name: str
    title: str | None
    status: str
    message_count: int
    created_at: datetime
    last_active_at: datetime
    expires_at: datetime
    # The rolling summary (usecases/summarize.py): text, the last message it
    # covers, when it was made.
    summary: str | None = None
    summary_covers_until: int | None = None
    summary_updated_at: datetime | None = None
    # From record_turn only: the ids of the messages the turn stored, in
    # order (the user's first, the final answer last).
    message_ids: tuple[int, ...] = field(default=(), compare=False)

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> SessionInfo:
        updated = row.get("summary_updated_at")
        return cls(
            id=uuid.UUID(row["id"]),
            agent_name=row["agent_name"],
            title=row.get("title"),
            status=row["status"],
            message_count=row["message_count"],
            created_at=datetime.fromisoformat(row["created_at"]),
            last_active_at=datetime.fromisoformat(row["last_active_at"]),
            expires_at=datetime.fromisoformat(row["expires_at"]),
            summary=row.get("summary"),
            summary_covers_until=row.get("summary_covers_until"),
            summary_updated_at=datetime.fromisoformat(updated) if updated else None,
            message_ids=tuple(row.get("message_ids") or ()),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "agent_name": self.agent_name,
            "title": self.title,
            "status": self.status,
            "message_count": self.message_count,
            "created_at": self.created_at.isoformat(),
            "last_active_at": self.last_active_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "summary": self.summary,
            "summary_covers_until": self.summary_covers_until,
            "summary_updated_at": (
                self.summary_updated_at.isoformat() if self.summary_updated_at else None
            ),
        }


@dataclass(frozen=True)
class Notes:
    agent_name: str
    notes: str
    version: int  # 0: no notes stored yet
    updated_at: datetime | None

    @classmethod
    def from_json(cls, agent_name: str, row: Mapping[str, Any] | None) -> Notes:
        """The notes as the database returns them; no row: none stored yet."""
        if not row:
            return cls(agent_name, "", 0, None)
        return cls(
            agent_name, row["notes"], row["version"], datetime.fromisoformat(row["updated_at"])
        )


@dataclass(frozen=True)
class Memory:
    """A durable memory (memchat.memories) as its user sees it."""

    id: int
    agent_name: str
    text: str
    kind: str  # "fact": the user's; "assistant": the assistant's
    session_id: uuid.UUID
    message_id: int
    created_at: datetime
    expires_at: datetime | None  # None: its session is gone and nothing was set (never)
    score: float | None = None  # a search's similarity to its text
    ordinal: int = 0  # its place among its message's memories

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Memory:
        expires = row.get("expires_at")
        return cls(
            id=int(row["id"]),
            agent_name=row["agent_name"],
            text=row["text"],
            kind=row["kind"],
            session_id=uuid.UUID(row["session_id"]),
            message_id=int(row["message_id"]),
            created_at=datetime.fromisoformat(row["created_at"]),
            expires_at=datetime.fromisoformat(expires) if expires else None,
            score=row.get("score"),
            ordinal=int(row.get("ordinal") or 0),
        )


@dataclass(frozen=True)
class Replay:
    """The stored answer of an earlier turn with the same client_message_id."""

    message: dict[str, Any]
    message_id: int  # the stored answer's id
    user_message_id: int  # the stored user message's id


@dataclass(frozen=True)
class Limits:
    """The database's limits (memchat.limits), read with every turn's context."""

    max_message_chars: int
    max_notes_chars: int
    max_session_ttl: timedelta
    # The messages the user may store (the lower of the database's limit and
    # USER_MAX_STORED_MESSAGES) and how many their live sessions hold now.
    max_stored_messages: int = 2**63 - 1
    stored_messages: int = 0


@dataclass(frozen=True)
class Summary:
    """A session's rolling summary, as a turn may show it (no hole before the window)."""

    text: str
    covers_until: int


@dataclass(frozen=True)
class Context:
    """What a turn starts from, read in one round trip."""

    session: SessionInfo | None  # None: a new session will be created
    notes: Notes | None
    messages: list[dict[str, Any]]  # oldest first
    replay: Replay | None
    claimed: bool = False  # the client_message_id is ours until the turn is recorded
    limits: Limits | None = None  # None for a replay
    summary: Summary | None = None  # None: no usable summary


@dataclass(frozen=True)
class Embedding:
    """A text's embedding and the model that made it: memchat.recall compares
    only embeddings of one model."""

    model: str
    vector: list[float]


@dataclass(frozen=True)
class Period:
    """A span of time recall favours, [start, end) (None: open on that side):
    what a time expression in a message ("last week") names."""

    start: datetime | None
    end: datetime | None


@dataclass(frozen=True)
class RecallQuery:
    """One recall (memchat.recall), as usecases/recall/query.py builds it:
    the keys nearest to `embedding` (its model's only), fused with the
    rounds holding the words of `text` (None: by meaning only) and, with a
    `period`, the nearest within it; live sessions of `agent_name`, outside
    the last `window` messages of `session_id`; at least `min_score`
    similar; an exchange `duplicate_score` or more similar to a better one
    left out (the same memory said twice)."""

    embedding: Embedding
    agent_name: str
    k: int
    min_score: float
    duplicate_score: float
    session_id: uuid.UUID | None = None
    window: int = 0
    text: str | None = None
    period: Period | None = None


@dataclass
class Turn:
    """Everything one chat turn writes, in one transaction."""

    session_id: uuid.UUID
    agent_name: str
    messages: list[dict[str, Any]]  # LangChain dicts, in order, user message first
    title: str | None
    ttl: timedelta
    client_message_id: str | None = None
    notes: str | None = None  # new notes, when the model changed them
    notes_version: int = 0  # the version the notes were read at
    # The caller named no session and had none active: if a concurrent first
    # turn made one active meanwhile, this turn joins it.
    new_session: bool = False
    # The user message's embedding, stored with it (None: none could be made).
    embedding: Embedding | None = None
    # Queue the session for its summary once this many of its messages are
    # outside the summary (the window + SUMMARY_TRIGGER_MESSAGES); None: never.
    summary_due_after: int | None = None
    # Memories the model forgot at the user's request (memchat.memories ids),
    # deleted with the turn, in its transaction.
    forget_memory_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class NotesVersion:
    version: int
    notes: str
    created_at: datetime


@dataclass(frozen=True)
class Cleared:
    cleared_session_id: uuid.UUID
    deleted_messages: int
    new_session: SessionInfo


@dataclass(frozen=True)
class Neighbour:
    """The exchange before or after a recalled one in its session."""

    message_id: int
    question: str
    answer: str | None

    @classmethod
    def from_json(cls, row: Mapping[str, Any] | None) -> Neighbour | None:
        if not row:
            return None
        return cls(int(row["message_id"]), row.get("question") or "", row.get("answer"))


@dataclass(frozen=True)
class Hit:
    """An earlier user message recalled, with the answer it got, and the
    exchanges next to it in its session: `before` (None when it opens its
    session) and `after` (None when it ends it, or the next is in the
    turn's window); either None too when the prompt's budget left it out."""

    message_id: int
    session_id: uuid.UUID
    created_at: datetime
    score: float  # the cosine similarity of its nearest key to the query
    title: str | None
    question: str
    answer: str | None
    before: Neighbour | None = None
    after: Neighbour | None = None
    # A durable memory's (memchat.memories), its transcript gone: `question`
    # is what the user stated, or `answer` what the assistant did (or the
    # session's summary: memory_kind "summary").
    memory_id: int | None = None
    memory_kind: str | None = None

    @classmethod
    def from_memory_json(cls, row: Mapping[str, Any]) -> Hit:
        said_by_user = row["kind"] == "fact"
        return cls(
            message_id=int(row["message_id"]),
            session_id=uuid.UUID(row["session_id"]),
            created_at=datetime.fromisoformat(row["created_at"]),
            score=float(row["score"]),
            title=None,
            question=row["text"] if said_by_user else "",
            answer=None if said_by_user else row["text"],
            memory_id=int(row["memory_id"]),
            memory_kind=row["kind"],
        )

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Hit:
        return cls(
            message_id=int(row["message_id"]),
            session_id=uuid.UUID(row["session_id"]),
            created_at=datetime.fromisoformat(row["created_at"]),
            score=float(row["score"]),
            title=row.get("title"),
            question=row.get("question") or "",
            answer=row.get("answer"),
            before=Neighbour.from_json(row.get("before")),
            after=Neighbour.from_json(row.get("after")),
        )


@dataclass(frozen=True)
class Feedback:
    message_id: int
    session_id: uuid.UUID
    agent_name: str
    rating: int
    comment: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Feedback:
        return cls(
            message_id=int(row["message_id"]),
            session_id=uuid.UUID(row["session_id"]),
            agent_name=row["agent_name"],
            rating=int(row["rating"]),
            comment=row["comment"],
            created_at=datetime.fromisoformat(row["created_at"]),
            updated_at=datetime.fromisoformat(row["updated_at"]),
        )


@dataclass(frozen=True)
class DueSummary:
    """A queue item the worker leased: which session, how often it failed so far."""

    lease: uuid.UUID
    session_id: uuid.UUID
    attempts: int  # failures in a row so far


@dataclass(frozen=True)
class SourceMessage:
    id: int
    role: str  # "user" | "assistant"
    text: str


@dataclass(frozen=True)
class SummarySource:
    """What one refresh summarizes: the summary so far, the messages after it."""

    lease: uuid.UUID
    summary: str | None
    covers_until: int | None
    messages: list[SourceMessage]
    boundary: int  # the last message id the refresh covers


@dataclass(frozen=True)
class DueEmbeddings:
    """An embedding queue item the backfill leased: which session, how often
    it failed so far."""

    lease: uuid.UUID
    session_id: uuid.UUID
    attempts: int  # failures in a row so far


@dataclass(frozen=True)
class EmbeddingBacklog:
    """A user's messages without an embedding in their queued live sessions."""

    pending: int  # the backfill will embed them
    failed: int  # their session was given up on (until it is queued again)

    @property
    def recall_ready(self) -> bool:
        """Whether recall can find every one of the user's queued messages."""
        return self.pending == 0 and self.failed == 0


@dataclass(frozen=True)
class Unembedded:
    """A stored message (the user's or the assistant's) that needs an
    embedding or its fact keys, in a leased session."""

    lease: uuid.UUID
    id: int
    text: str
    embedded: bool = False  # it has its embedding: only its fact keys are missing
    asked: bool = True  # the user's (fact keys are a user message's); else an answer
