"""History import: the caller's imported sessions, a batch per transaction.

`start_import` takes the request's token from the caller's `import` bucket
(before the body is even read: a refused request costs next to nothing) and
reads the database's limits that an import checks before it stores
anything; `import_sessions` stores one batch (memchat.import_sessions,
supabase/schemas/functions/limits.sql) in one round trip, all or nothing,
skipping every session the caller already has live; the request's first
batch also checks the caller's quota for the whole request.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from memchat.store.db import Database, translate
from memchat.store.records import Caller
from memchat.throttle import Bucket

_LIMITS = "select l.max_import_message_chars, l.max_message_bytes from memchat.limits l"
_IMPORT = "select memchat.import_sessions(%s, %s::jsonb, %s::jsonb, %s::jsonb, %s, %s::jsonb)"


@dataclass(frozen=True)
class ImportLimits:
    """The database's limits on what one stored message may be (memchat.limits)."""

    max_message_chars: int  # an imported message's text (max_import_message_chars)
    max_message_bytes: int  # any message, as the JSON text the database stores


@dataclass(frozen=True)
class FeedbackImport:
    rating: int
    comment: str | None = None
    created_at: datetime | None = None  # None: the import's time
    updated_at: datetime | None = None  # None: created_at


@dataclass(frozen=True)
class MessageImport:
    message: dict[str, Any]  # LangChain's shape (memchat.messages)
    created_at: datetime
    client_message_id: str | None = None
    feedback: FeedbackImport | None = None


@dataclass(frozen=True)
class SummaryImport:
    text: str
    covers: int  # the ordinal, from 1, of the session's last message it covers
    updated_at: datetime | None


@dataclass(frozen=True)
class SessionImport:
    id: uuid.UUID
    agent_name: str
    title: str | None
    status: str  # "active" | "cleared"
    created_at: datetime
    last_active_at: datetime
    messages: Sequence[MessageImport]
    summary: SummaryImport | None = None


@dataclass(frozen=True)
class NotesImport:
    agent_name: str
    notes: str
    created_at: datetime | None = None  # None: the import's time
    updated_at: datetime | None = None  # None: created_at


@dataclass(frozen=True)
class ImportedBatch:
    """What one batch stored: the rest the caller had already."""

    session_ids: frozenset[uuid.UUID] = field(default_factory=frozenset)
    notes: tuple[str, ...] = ()  # the agents whose notes were stored


async def start_import(db: Database, caller: Caller) -> ImportLimits:
    """Take an import's token from the caller's `import` bucket (RateLimited
    when there is none) and read the database's limits on the messages an
    import stores, in one round trip."""
    async with db.pipeline(caller.claims, throttle=Bucket.IMPORT) as conn:
        cur = conn.cursor()
        await cur.execute(_LIMITS)
    row = await cur.fetchone()
    assert row is not None
    return ImportLimits(max_message_chars=row[0], max_message_bytes=row[1])


async def import_sessions(
    db: Database,
    caller: Caller,
    sessions: Sequence[SessionImport],
    notes: Sequence[NotesImport] = (),
    *,
    ttl: timedelta,
    request: Sequence[SessionImport] | None = None,
) -> ImportedBatch:
    """Store a batch of the caller's sessions (each id once) and notes in one
    transaction; a session the caller has live, or notes of an agent the
    caller has notes for, are left as they are (an expired session with the
    same id is deleted first: it imports anew). Expiry: `ttl` from now.
    QuotaExceeded, nothing stored, when the batch would take the caller past
    their stored messages, or with `request` (every session of the request:
    its first batch) when the whole request would."""
    feedback = [
        _feedback_json(session.id, ordinal, message.feedback)
        for session in sessions
        for ordinal, message in enumerate(session.messages, start=1)
        if message.feedback is not None
    ]
    params = (
        caller.user_id,
        _dumps([_session_json(s) for s in sessions]),
        _dumps(feedback),
        _dumps([_notes_json(n) for n in notes]),
        ttl,
        None
        if request is None
        else _dumps([{"id": str(s.id), "messages": len(s.messages)} for s in request]),
    )
    try:
        async with db.pipeline(caller.claims) as conn:
            cur = conn.cursor()
            await cur.execute(_IMPORT, params)
    except psycopg.Error as exc:
        raise translate(exc) from exc
    row = await cur.fetchone()
    assert row is not None
    stored = row[0]
    return ImportedBatch(
        session_ids=frozenset(uuid.UUID(i) for i in stored["sessions"]),
        notes=tuple(stored["notes"]),
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _session_json(session: SessionImport) -> dict[str, Any]:
    summary = session.summary
    return {
        "id": str(session.id),
        "agent_name": session.agent_name,
        "title": session.title,
        "status": session.status,
        "created_at": session.created_at.isoformat(),
        "last_active_at": session.last_active_at.isoformat(),
        "summary": summary.text if summary else None,
        "summary_covers": summary.covers if summary else None,
        "summary_updated_at": _time(summary.updated_at) if summary else None,
        "messages": [
            {
                "message": m.message,
                "created_at": m.created_at.isoformat(),
                "client_message_id": m.client_message_id,
            }
            for m in session.messages
        ],
    }


def _feedback_json(session_id: uuid.UUID, ordinal: int, given: FeedbackImport) -> dict[str, Any]:
    return {
        "session_id": str(session_id),
        "ordinal": ordinal,
        "rating": given.rating,
        "comment": given.comment,
        "created_at": _time(given.created_at),
        "updated_at": _time(given.updated_at),
    }


def _notes_json(notes: NotesImport) -> dict[str, Any]:
    return {
        "agent_name": notes.agent_name,
        "notes": notes.notes,
        "created_at": _time(notes.created_at),
        "updated_at": _time(notes.updated_at),
    }
