"""The store: every SQL statement memchat runs, in one place.

User-facing operations take the caller's verified claims and run as
`memchat_user` in one transaction (see `memchat.db`), so row-level security
decides what each statement sees. Chat turns cost two round trips: one to
load the context, one to record the turn.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.types.json import Jsonb

from memchat import messages
from memchat.db import REQUEST_ROLE, Database, connect_kwargs, refusal
from memchat.errors import (
    Conflict,
    IdempotencyConflict,
    IdempotencyInFlight,
    InvalidInput,
    PayloadTooLarge,
    RateLimited,
    SessionNotFound,
    Unauthorized,
)
from memchat.throttle import OFF, Bucket, Rate

# Raised by the migrations' SQL functions and triggers.
NOTES_CONFLICT_SQLSTATE = "MC409"
TOO_LARGE_SQLSTATE = "MC413"
NOT_ALLOWED_SQLSTATE = "MC422"

# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class Caller:
    """A verified user: the id and the claims the database sees."""

    user_id: uuid.UUID
    claims: Mapping[str, Any]


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
    # Turns answered, and the tokens the model billed for them (kept when the
    # session is cleared; they restart when it expires).
    turn_count: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
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
            turn_count=row.get("turn_count") or 0,
            prompt_tokens=row.get("prompt_tokens") or 0,
            completion_tokens=row.get("completion_tokens") or 0,
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


@dataclass(frozen=True)
class Summary:
    """A session's rolling summary, as a turn may show it (no hole before the window)."""

    text: str
    covers_until: int


@dataclass(frozen=True)
class Context:
    """What a turn starts from, read in one round trip."""

    session: SessionInfo | None  # None: a new session will be created
    expired: bool  # the session exists but expired: it starts empty
    notes: Notes | None
    messages: list[dict[str, Any]]  # oldest first
    replay: Replay | None
    claimed: bool = False  # the client_message_id is ours until the turn is recorded
    limits: Limits | None = None  # None for a replay
    summary: Summary | None = None  # None: no usable summary


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
    embedding: list[float] | None = None
    # Queue the session for its summary once this many of its messages are
    # outside the summary (the window + SUMMARY_TRIGGER_MESSAGES); None: never.
    summary_due_after: int | None = None
    extras: dict[str, Any] = field(default_factory=dict)


class NotesConflict(Conflict):
    code = "notes_conflict"
    detail = "The long-term notes changed meanwhile; read them again and retry."


class DuplicateClientMessage(Conflict):
    """A concurrent request with the same client_message_id won the race."""


def _translate(exc: psycopg.Error) -> Exception:
    if exc.sqlstate == NOTES_CONFLICT_SQLSTATE:
        return NotesConflict()
    if exc.sqlstate == TOO_LARGE_SQLSTATE:
        return PayloadTooLarge("A value is larger than the database allows; shorten it.")
    if exc.sqlstate == NOT_ALLOWED_SQLSTATE or isinstance(exc, pg_errors.CheckViolation):
        return InvalidInput()
    if isinstance(exc, pg_errors.ForeignKeyViolation):
        return Unauthorized("This account no longer exists.")
    return refusal(exc) or exc


# ------------------------------------------------------------ chat turns

# Both halves of a turn are SQL functions (migration *_turn_functions.sql):
# PL/pgSQL caches their plans per server connection, pooler-safe.
LOAD_CONTEXT = "select memchat.load_context(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


async def load_context(
    db: Database,
    caller: Caller,
    *,
    session_id: uuid.UUID | None,
    agent_name: str,
    window: int,
    read_notes: bool = True,
    client_message_id: str | None = None,
    message: str | None = None,
    throttle: Rate = OFF,
    claim_seconds: float = 60.0,
    read_max: int = 0,
) -> Context:
    """Resolve the session and read notes + the last `window` messages, and
    the session's summary with the messages it does not cover yet when up to
    `read_max` messages reach back to it (then the window is longer than
    `window`; else the summary is left out).

    With `throttle` on, the turn takes a token from the caller's chat bucket.
    With `client_message_id`, a stored turn with that key is returned as
    `replay`; otherwise the key is claimed for `claim_seconds` (until
    `record_turn` or `release_claim`).

    Raises IdempotencyConflict when the key was used with another `message`,
    IdempotencyInFlight while another request answers the same key, RateLimited
    when the caller is out of tokens.
    """
    args = (
        session_id,
        agent_name,
        window,
        read_notes,
        client_message_id,
        message,
        throttle.per_minute,
        throttle.burst,
        claim_seconds,
        read_max,
    )
    try:
        async with db.pipeline(caller.claims) as conn:
            cur = conn.cursor()
            await cur.execute(LOAD_CONTEXT, args)
    except psycopg.Error as exc:
        # A deleted user's throttle row fails its foreign key: 401.
        raise _translate(exc) from exc
    row = await cur.fetchone()
    assert row is not None
    result = row[0]
    if result.get("idempotency") == "in_flight":
        raise IdempotencyInFlight()
    if result.get("idempotency") == "conflict":
        raise IdempotencyConflict()
    if "throttled" in result:
        raise RateLimited(float(result["throttled"]))
    session = result["session"]
    info = SessionInfo.from_json(session) if session else None
    replay = result["replay"]
    if replay:
        return Context(
            info,
            False,
            None,
            [],
            Replay(replay["message"], replay["message_id"], replay["user_message_id"]),
        )
    resolved_agent = info.agent_name if info else agent_name
    limits = result["limits"]
    summary = result.get("summary")
    return Context(
        session=info,
        expired=bool(session and session["expired"]),
        notes=_notes_from_json(resolved_agent, result["notes"]) if read_notes else None,
        messages=result["messages"],
        replay=None,
        claimed=result["claimed"],
        limits=Limits(
            max_message_chars=limits["max_message_chars"],
            max_notes_chars=limits["max_notes_chars"],
            max_session_ttl=timedelta(seconds=float(limits["max_session_ttl_seconds"])),
        ),
        summary=Summary(summary["text"], int(summary["covers_until"])) if summary else None,
    )


_RELEASE_CLAIM = (
    "delete from memchat.turn_claims where user_id = (select auth.uid()) and client_message_id = %s"
)


async def release_claim(db: Database, caller: Caller, client_message_id: str) -> None:
    """Give up a turn's claim on its client_message_id (the turn failed)."""
    async with db.pipeline(caller.claims) as conn:
        await conn.execute(_RELEASE_CLAIM, (client_message_id,))


def _notes_from_json(agent_name: str, row: Mapping[str, Any] | None) -> Notes:
    if not row:
        return Notes(agent_name, "", 0, None)
    return Notes(
        agent_name, row["notes"], row["version"], datetime.fromisoformat(row["updated_at"])
    )


RECORD_TURN = (
    "select memchat.record_turn(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::extensions.vector, %s)"
)

_POINT_ACTIVE = """
insert into public.user_agent_active_sessions as a
    (user_id, agent_name, active_session_id, last_active_at)
select s.user_id, s.agent_name, s.id, now()
  from public.chat_sessions s
 where s.user_id = (select auth.uid()) and s.id = %(session_id)s
on conflict (user_id, agent_name) do update set
    active_session_id = excluded.active_session_id,
    last_active_at = excluded.last_active_at
"""

_SAVE_NOTES = "select memchat.save_notes(%s, %s, %s)"


async def record_turn(db: Database, caller: Caller, turn: Turn) -> SessionInfo:
    """Store a whole turn atomically; sessions are locked so turns never interleave.

    Returns the session the turn went into: `turn.session_id`, or with
    `turn.new_session` the session a concurrent first turn made active.
    Raises NotesConflict when the notes changed since they were read (nothing
    is stored; re-read and retry), DuplicateClientMessage when a concurrent
    request with the same client_message_id was stored first, PayloadTooLarge
    or InvalidInput when a database limit refuses it.
    """
    args = (
        turn.session_id,
        turn.agent_name,
        turn.title,
        Jsonb(turn.messages),
        turn.ttl,
        turn.client_message_id,
        turn.notes,
        turn.notes_version,
        turn.new_session,
        vector_literal(turn.embedding),
        turn.summary_due_after,
    )
    try:
        async with db.pipeline(caller.claims) as conn:
            session_cur = conn.cursor()
            await session_cur.execute(RECORD_TURN, args)
    except pg_errors.UniqueViolation as exc:
        if exc.diag.constraint_name == "chat_message_history_client_message_idx":
            raise DuplicateClientMessage() from exc
        raise
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    row = await session_cur.fetchone()
    assert row is not None
    return SessionInfo.from_json(row[0])


def vector_literal(vector: list[float] | None) -> str | None:
    """A vector as pgvector's text form; the SQL casts it (`%s::extensions.vector`)."""
    if vector is None:
        return None
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


# ---------------------------------------------------------------- recall

# Similar earlier messages at or above this similarity to a better hit are
# the same memory said twice: only the better one is recalled.
COLLAPSE_SIMILARITY = 0.9

RECALL = "select memchat.recall(%s, %s, %s, %s::extensions.vector, %s, %s, %s)"


@dataclass(frozen=True)
class Hit:
    """An earlier user message recalled by meaning, with the answer it got."""

    message_id: int
    session_id: uuid.UUID
    created_at: datetime
    score: float
    title: str | None
    question: str
    answer: str | None

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
        )


def recall_args(
    *,
    session_id: uuid.UUID | None,
    agent_name: str,
    window: int,
    query: list[float],
    k: int,
    min_score: float,
) -> tuple[Any, ...]:
    return (
        session_id,
        agent_name,
        window,
        vector_literal(query),
        k,
        min_score,
        COLLAPSE_SIMILARITY,
    )


def hits_from_json(rows: list[Mapping[str, Any]]) -> list[Hit]:
    return [Hit.from_json(row) for row in rows]


async def recall(
    db: Database,
    caller: Caller,
    *,
    session_id: uuid.UUID | None,
    agent_name: str,
    window: int,
    query: list[float],
    k: int,
    min_score: float,
) -> list[Hit]:
    """The caller's earlier user messages of `agent_name` most like `query`, best
    first (memchat.recall: live sessions, outside the window of `session_id`,
    near-duplicates collapsed), each with the answer it got."""
    args = recall_args(
        session_id=session_id,
        agent_name=agent_name,
        window=window,
        query=query,
        k=k,
        min_score=min_score,
    )
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(RECALL, args)
    row = await cur.fetchone()
    assert row is not None
    return hits_from_json(row[0])


_EMBEDDING_DIMENSIONS = "select memchat.embedding_dimensions()"


def embedding_dimensions(conninfo: str) -> int:
    """The size of the stored embedding column (checked against the settings at start)."""
    with psycopg.connect(conninfo, **connect_kwargs()) as conn, conn.transaction():
        conn.execute("select set_config('role', %s, true)", (REQUEST_ROLE,))
        row = conn.execute(_EMBEDDING_DIMENSIONS).fetchone()
    assert row is not None
    return int(row[0])


async def stored_embedding_dimensions(db: Database, caller: Caller) -> int:
    """embedding_dimensions, inside a request (when it could not be checked at start)."""
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_EMBEDDING_DIMENSIONS)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


# ------------------------------------------------------ long-term notes

_READ_NOTES = """
select jsonb_build_object('notes', m.notes, 'version', m.version, 'updated_at', m.updated_at)
  from public.agent_long_term_memory m
 where m.user_id = (select auth.uid()) and m.agent_name = %s
"""


async def read_notes(db: Database, caller: Caller, agent_name: str) -> Notes:
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_READ_NOTES, (agent_name,))
    row = await cur.fetchone()
    return _notes_from_json(agent_name, row[0] if row else None)


async def save_notes(
    db: Database,
    caller: Caller,
    agent_name: str,
    notes: str,
    expected_version: int | None = None,
) -> Notes:
    """Replace the notes; with `expected_version`, only if still at that version."""
    _, saved = await _write_notes(
        db, caller, agent_name, _SAVE_NOTES, (agent_name, notes, expected_version)
    )
    return saved


async def _write_notes(
    db: Database, caller: Caller, agent_name: str, statement: str, params: tuple[Any, ...]
) -> tuple[Any, Notes]:
    """Run a notes-writing function (a write: throttled) and read the notes
    back in the same round trip: (the function's result, the notes now)."""
    try:
        async with db.pipeline(caller.claims, throttle=Bucket.WRITE) as conn:
            written = conn.cursor()
            await written.execute(statement, params)
            cur = conn.cursor()
            await cur.execute(_READ_NOTES, (agent_name,))
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    result = await written.fetchone()
    row = await cur.fetchone()
    return (result[0] if result else None), _notes_from_json(agent_name, row[0] if row else None)


async def delete_notes(db: Database, caller: Caller, agent_name: str) -> bool:
    """Forget the agent's notes about the caller, and their earlier versions."""
    async with db.pipeline(caller.claims, throttle=Bucket.WRITE) as conn:
        cur = conn.cursor()
        await cur.execute(
            "delete from public.agent_long_term_memory"
            " where user_id = (select auth.uid()) and agent_name = %s",
            (agent_name,),
        )
    return cur.rowcount > 0


@dataclass(frozen=True)
class NotesVersion:
    version: int
    notes: str
    created_at: datetime


_NOTES_VERSIONS = """
select v.version, v.notes, v.created_at from memchat.notes_versions v
 where v.user_id = (select auth.uid()) and v.agent_name = %s
 order by v.version desc
"""


async def notes_versions(db: Database, caller: Caller, agent_name: str) -> list[NotesVersion]:
    """The kept versions of the caller's notes for an agent, newest (the current) first."""
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_NOTES_VERSIONS, (agent_name,))
    return [NotesVersion(r[0], r[1], r[2]) for r in await cur.fetchall()]


_RESTORE_NOTES = "select memchat.restore_notes(%s, %s, %s)"


async def restore_notes(
    db: Database,
    caller: Caller,
    agent_name: str,
    version: int,
    expected_version: int | None = None,
) -> Notes | None:
    """Set the notes back to a kept version's text (as a new version); with
    `expected_version`, only if still at that version. None when that version
    is not kept."""
    version, restored = await _write_notes(
        db, caller, agent_name, _RESTORE_NOTES, (agent_name, version, expected_version)
    )
    return restored if version is not None else None


# ------------------------------------------------------------- sessions

# A session row as JSON (SessionInfo.from_json picks the fields it shows).
_SESSION_JSON = "to_jsonb(s)"

# The session a clear-session request names: the given id, else the active
# one. The first statement locks it and records its id for the transaction,
# so the later statements act on that session even if the active pointer
# moves meanwhile (each statement of a read-committed transaction re-reads).
_CLEAR_LOCK = """
select s.id, set_config('memchat.clear_target', s.id::text, true)
  from public.chat_sessions s
 where s.user_id = (select auth.uid())
   and s.id = coalesce(%(session_id)s::uuid,
       (select a.active_session_id from public.user_agent_active_sessions a
         where a.user_id = (select auth.uid()) and a.agent_name = %(agent_name)s))
   for update
"""
_TARGET = sql.SQL("nullif(current_setting('memchat.clear_target', true), '')::uuid")

_CLEAR_MESSAGES = sql.SQL(
    "with d as (delete from public.chat_message_history h"
    " where h.user_id = (select auth.uid()) and h.session_id = {target}"
    " returning 1) select count(*) from d"
).format(target=_TARGET)
_CLEAR_MARK = sql.SQL(
    "update public.chat_sessions set status = 'cleared', message_count = 0,"
    " title = null, summary = null, summary_covers_until = null,"
    " summary_covers_count = 0, summary_updated_at = null"
    " where user_id = (select auth.uid()) and id = {target}"
).format(target=_TARGET)
_CLEAR_QUEUE = sql.SQL(
    "delete from memchat.summary_queue"
    " where user_id = (select auth.uid()) and session_id = {target}"
).format(target=_TARGET)
_CLEAR_NEW_SESSION = sql.SQL(
    "insert into public.chat_sessions as s (id, user_id, agent_name, expires_at)"
    " select %(new_id)s, %(user_id)s, t.agent_name, memchat.session_expiry(%(ttl)s)"
    " from public.chat_sessions t where t.user_id = %(user_id)s and t.id = {target}"
    " returning {session}"
).format(target=_TARGET, session=sql.SQL(_SESSION_JSON))


@dataclass(frozen=True)
class Cleared:
    cleared_session_id: uuid.UUID
    deleted_messages: int
    new_session: SessionInfo


async def clear_session(
    db: Database,
    caller: Caller,
    *,
    session_id: uuid.UUID | None,
    agent_name: str,
    ttl: timedelta,
) -> Cleared:
    """Forget a session's messages now and make a fresh session the active one."""
    params = {
        "session_id": session_id,
        "agent_name": agent_name,
        "new_id": uuid.uuid4(),
        "user_id": caller.user_id,
        "ttl": ttl,
    }
    async with db.pipeline(caller.claims, throttle=Bucket.WRITE) as conn:
        target = conn.cursor()
        await target.execute(_CLEAR_LOCK, params)
        deleted = conn.cursor()
        await deleted.execute(_CLEAR_MESSAGES, params)
        await conn.execute(_CLEAR_MARK, params)
        await conn.execute(_CLEAR_QUEUE, params)
        created = conn.cursor()
        await created.execute(_CLEAR_NEW_SESSION, params)
        await conn.execute(_POINT_ACTIVE, {"session_id": params["new_id"]})
    found = await target.fetchone()
    if found is None:
        raise SessionNotFound(
            "No such session for this user."
            if session_id
            else f"There is no active session for agent {agent_name!r}."
        )
    count_row = await deleted.fetchone()
    new_row = await created.fetchone()
    assert count_row is not None and new_row is not None
    return Cleared(found[0], count_row[0], SessionInfo.from_json(new_row[0]))


_LIST_SESSIONS = sql.SQL(
    "select {session} from public.chat_sessions s"
    " where s.user_id = (select auth.uid())"
    "   and (%(agent_name)s::text is null or s.agent_name = %(agent_name)s::text)"
    "   and (%(before_at)s::timestamptz is null"
    "        or (s.last_active_at, s.id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))"
    " order by s.last_active_at desc, s.id desc limit %(limit)s"
).format(session=sql.SQL(_SESSION_JSON))

_ACTIVE_SESSION = sql.SQL(
    "select {session} from public.user_agent_active_sessions a"
    " join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id"
    " where a.user_id = (select auth.uid()) and a.agent_name = %s"
    "   and s.status = 'active' and s.expires_at > now()"
).format(session=sql.SQL(_SESSION_JSON))


async def list_sessions(
    db: Database,
    caller: Caller,
    *,
    agent_name: str | None,
    limit: int,
    before: tuple[datetime, uuid.UUID] | None = None,
) -> list[SessionInfo]:
    """The caller's sessions, most recently active first (keyset pagination)."""
    params = {
        "agent_name": agent_name,
        "limit": limit,
        "before_at": before[0] if before else None,
        "before_id": before[1] if before else None,
    }
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_LIST_SESSIONS, params)
    return [SessionInfo.from_json(r[0]) for r in await cur.fetchall()]


async def active_session(db: Database, caller: Caller, agent_name: str) -> SessionInfo | None:
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_ACTIVE_SESSION, (agent_name,))
    row = await cur.fetchone()
    return SessionInfo.from_json(row[0]) if row else None


# --------------------------------------------------------------- export

# One message as export JSON, built by the database so export streams text.
_MESSAGE_EXPORT_JSON = """(jsonb_build_object(
    'id', h.id,
    'role', case h.message->>'type' when 'human' then 'user' when 'ai' then 'assistant'
                 else h.message->>'type' end,
    'content', coalesce(h.message->'data'->'content', '""'::jsonb),
    'created_at', h.created_at,
    'metadata', jsonb_strip_nulls(jsonb_build_object(
        'tool_calls', nullif(h.message->'data'->'tool_calls', '[]'::jsonb),
        'tool_call_id', h.message->'data'->'tool_call_id',
        'name', h.message->'data'->'name',
        'usage', h.message->'data'->'usage_metadata',
        'model', h.message->'data'->'response_metadata'->'model_name',
        'client_message_id', h.client_message_id)))
    || case when f.message_id is null then '{}'::jsonb else jsonb_build_object(
        'feedback', jsonb_build_object(
            'rating', f.rating, 'comment', f.comment,
            'created_at', f.created_at, 'updated_at', f.updated_at)) end)::text"""

EXPORT_BATCH = 2000

_EXPORT_SESSION = sql.SQL(
    "select {session} from public.chat_sessions s"
    " where s.user_id = (select auth.uid()) and s.id = %s"
).format(session=sql.SQL(_SESSION_JSON))

_EXPORT_MESSAGES = sql.SQL(
    "select h.id, {message} from public.chat_message_history h"
    " left join memchat.message_feedback f on f.message_id = h.id"
    " where h.user_id = (select auth.uid()) and h.session_id = %s and h.id > %s"
    " order by h.id limit %s"
).format(message=sql.SQL(_MESSAGE_EXPORT_JSON))

_EXPORT_SESSIONS = sql.SQL(
    "select {session}, s.created_at, s.id from public.chat_sessions s"
    " where s.user_id = (select auth.uid())"
    "   and (%(after_at)s::timestamptz is null"
    "        or (s.created_at, s.id) > (%(after_at)s::timestamptz, %(after_id)s::uuid))"
    " order by s.created_at, s.id limit %(limit)s"
).format(session=sql.SQL(_SESSION_JSON))


async def export_session_info(
    conn: psycopg.AsyncConnection[Any], session_id: uuid.UUID
) -> SessionInfo | None:
    cur = await conn.execute(_EXPORT_SESSION, (session_id,))
    row = await cur.fetchone()
    return SessionInfo.from_json(row[0]) if row else None


async def export_messages(
    conn: psycopg.AsyncConnection[Any], session_id: uuid.UUID, batch: int = EXPORT_BATCH
) -> AsyncIterator[list[str]]:
    """A session's messages as export JSON text, oldest first, in batches."""
    after = 0
    while True:
        cur = await conn.execute(_EXPORT_MESSAGES, (session_id, after, batch))
        rows = await cur.fetchall()
        if not rows:
            return
        yield [r[1] for r in rows]
        if len(rows) < batch:
            return
        after = rows[-1][0]


async def export_sessions(
    conn: psycopg.AsyncConnection[Any], batch: int = 500
) -> AsyncIterator[list[SessionInfo]]:
    """All of the caller's sessions, oldest first, in batches."""
    after: tuple[datetime, uuid.UUID] | None = None
    while True:
        cur = await conn.execute(
            _EXPORT_SESSIONS,
            {
                "after_at": after[0] if after else None,
                "after_id": after[1] if after else None,
                "limit": batch,
            },
        )
        rows = await cur.fetchall()
        if not rows:
            return
        yield [SessionInfo.from_json(r[0]) for r in rows]
        if len(rows) < batch:
            return
        after = (rows[-1][1], rows[-1][2])


async def export_account_extras(
    conn: psycopg.AsyncConnection[Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The caller's active-session pointers and long-term notes."""
    cur = await conn.execute(
        "select coalesce(jsonb_agg(jsonb_build_object("
        "  'agent_name', a.agent_name, 'active_session_id', a.active_session_id,"
        "  'last_active_at', a.last_active_at, 'created_at', a.created_at)"
        "  order by a.agent_name), '[]'::jsonb)"
        " from public.user_agent_active_sessions a where a.user_id = (select auth.uid())"
    )
    pointers = await cur.fetchone()
    cur = await conn.execute(
        "select coalesce(jsonb_agg(jsonb_build_object("
        "  'agent_name', m.agent_name, 'notes', m.notes, 'version', m.version,"
        "  'created_at', m.created_at, 'updated_at', m.updated_at,"
        "  'earlier_versions', (select coalesce(jsonb_agg(jsonb_build_object("
        "     'version', v.version, 'notes', v.notes, 'created_at', v.created_at)"
        "     order by v.version desc), '[]'::jsonb) from memchat.notes_versions v"
        "   where v.user_id = m.user_id and v.agent_name = m.agent_name"
        "     and v.version < m.version))"
        "  order by m.agent_name), '[]'::jsonb)"
        " from public.agent_long_term_memory m where m.user_id = (select auth.uid())"
    )
    notes = await cur.fetchone()
    assert pointers is not None and notes is not None
    return pointers[0], notes[0]


# -------------------------------------------------------------- account


async def delete_user_data(db: Database, caller: Caller) -> dict[str, int]:
    """Delete everything the caller has, in one transaction; returns the counts."""
    tables = {
        "messages": "chat_message_history",
        "active_sessions": "user_agent_active_sessions",
        "sessions": "chat_sessions",
        "long_term_memory": "agent_long_term_memory",
    }
    cursors = {}
    async with db.pipeline(caller.claims, throttle=Bucket.ERASE) as conn:
        for key, table in tables.items():
            cursors[key] = conn.cursor()
            await cursors[key].execute(
                sql.SQL(
                    "with d as (delete from public.{} where user_id = (select auth.uid())"
                    " returning 1) select count(*) from d"
                ).format(sql.Identifier(table))
            )
        # Not content, but keyed by the user: any turn claims. The throttles
        # stay (memchat.throttle): deleting must not reset them.
        await conn.execute("delete from memchat.turn_claims where user_id = (select auth.uid())")
    counts = {}
    for key, cur in cursors.items():
        row = await cur.fetchone()
        counts[key] = row[0] if row else 0
    return counts


async def database_ok(db: Database) -> bool:
    async with db.pipeline(None) as conn:
        cur = conn.cursor()
        await cur.execute("select 1")
    return (await cur.fetchone()) == (1,)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


# ------------------------------------------------------------ summaries
# The worker (usecases/summarize.py) logs in as `memchat_worker`, which may
# only call the memchat.summary_* functions (migration *_hardening.sql): a
# claim leases due queue items, and every later call names its item by that
# lease, so the worker can read and write only the sessions the queue hands
# it, and only while its lease lives.

_CLAIM_DUE = "select memchat.summary_claim(%(limit)s, %(lease)s)"
_SUMMARY_LAG = "select memchat.summary_lag()"
_SUMMARY_SOURCE = "select memchat.summary_source(%s, %s, %s)"
_SAVE_SUMMARY = "select memchat.summary_save(%s, %s, %s, %s)"
_SUMMARY_DONE = "select memchat.summary_done(%s, %s)"
_SUMMARY_FAILED = "select memchat.summary_failed(%s, %s)"


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


async def _worker_call(db: Database, query: str, params: Any) -> Any:
    async with db.pipeline(None) as conn:
        cur = conn.cursor()
        await cur.execute(query, params)
    row = await cur.fetchone()
    return row[0] if row else None


async def claim_due_summaries(
    db: Database, *, limit: int, lease_seconds: float
) -> list[DueSummary]:
    """Lease up to `limit` due items for `lease_seconds` (FOR UPDATE SKIP LOCKED
    in one short transaction: another worker skips them; a turn never waits
    longer than this statement)."""
    found = await _worker_call(db, _CLAIM_DUE, {"limit": limit, "lease": lease_seconds})
    return [
        DueSummary(uuid.UUID(i["lease"]), uuid.UUID(i["session_id"]), int(i["attempts"]))
        for i in found or []
    ]


async def summary_lag(db: Database) -> float | None:
    """Seconds the oldest due item has been waiting (None: none is due)."""
    lag = await _worker_call(db, _SUMMARY_LAG, ())
    return float(lag) if lag is not None else None


async def summary_failed(db: Database, item: DueSummary, *, retry_in: float | None) -> None:
    """Record a failed refresh: retry after `retry_in` seconds (None: give up
    until the session's next turn queues it again)."""
    await _worker_call(db, _SUMMARY_FAILED, (item.lease, retry_in))


async def summary_source(
    db: Database, item: DueSummary, *, window: int, chunk: int
) -> SummarySource | None:
    """A leased item's summary so far and up to `chunk` messages after it that
    have left a `window`-message window (None: nothing left to summarize, or
    the lease is gone)."""
    found = await _worker_call(db, _SUMMARY_SOURCE, (item.lease, window, chunk))
    if not found:
        return None
    return SummarySource(
        lease=item.lease,
        summary=found["summary"],
        covers_until=found["covers_until"],
        messages=[
            SourceMessage(
                m["id"], messages.ROLE_BY_TYPE.get(m["type"], "assistant"), m["content"] or ""
            )
            for m in found["messages"]
        ],
        boundary=int(found["boundary"]),
    )


async def save_summary(db: Database, source: SummarySource, text: str) -> bool:
    """Store `text` as the summary up to `source.boundary`, if the session
    still has the summary it was made from (no clear, no other worker in
    between) and the lease lives. Returns whether it was stored."""
    args = (source.lease, text, source.boundary, source.covers_until)
    return bool(await _worker_call(db, _SAVE_SUMMARY, args))


async def summary_done(db: Database, item: DueSummary, *, due_after: int) -> None:
    """The end of an item's pass: it stays queued while `due_after` or more of
    its session's messages are outside its summary, else leaves the queue."""
    await _worker_call(db, _SUMMARY_DONE, (item.lease, due_after))


# -------------------------------------------------------------- cleanup
# Runs as the cleanup's own login role, `memchat_cleanup`, whose policies
# show it expired sessions only, and of messages their ids (no content).
# Synchronous: a scheduled batch job.

# Locks a batch of expired sessions, skipping any a live turn holds; the
# lock re-reads expires_at, so a session a turn has just extended drops out.
# The locked (id, user_id) keys go on as two arrays so the delete is a
# primary-key lookup per session whatever the table's size. Messages go by
# the FK cascade, and their embeddings and feedback with them by a
# statement-level trigger (migration *_set_based_cascades.sql), which also
# adds up how many messages went (memchat.deleted_messages, for the
# transaction): the cleanup never reads a message to count it.
_EXPIRE_BATCH = """
with doomed as (
    select s.id, s.user_id from public.chat_sessions s
     where s.expires_at <= now()
     order by s.expires_at
     limit %(batch)s
     for update skip locked
), keys as (
    select k.id, k.user_id
      from unnest((select coalesce(array_agg(d.id), '{}') from doomed d)::uuid[],
                  (select coalesce(array_agg(d.user_id), '{}') from doomed d)::uuid[])
           as k(id, user_id)
), gone as (
    delete from public.chat_sessions s using keys k
     where s.id = k.id and s.user_id = k.user_id returning 1
)
select count(*) from gone
"""
_DELETED_MESSAGES = (
    "select coalesce(nullif(current_setting('memchat.deleted_messages', true), ''), '0')::bigint"
)

_COUNT_EXPIRED = """
select count(*), coalesce(sum((select count(*) from public.chat_message_history h
                                where h.session_id = s.id and h.user_id = s.user_id)), 0)::bigint
  from public.chat_sessions s where s.expires_at <= now()
"""


def expire_sessions_batch(conn: psycopg.Connection[Any], batch: int) -> tuple[int, int]:
    """Delete up to `batch` expired sessions with their messages, in one transaction.

    Returns (deleted_sessions, deleted_messages).
    """
    with conn.transaction():
        # Never queue behind a user's own writes for long; the next run resumes.
        conn.execute("set local lock_timeout = '5s'")
        sessions = conn.execute(_EXPIRE_BATCH, {"batch": batch}).fetchone()
        messages = conn.execute(_DELETED_MESSAGES).fetchone()
    assert sessions is not None and messages is not None
    return int(sessions[0]), int(messages[0])


_PURGE_CLAIMS = "delete from memchat.turn_claims where expires_at <= now()"


def purge_expired_claims(conn: psycopg.Connection[Any]) -> int:
    """Delete turn claims left by turns that never finished (a crashed instance)."""
    with conn.transaction():
        return conn.execute(_PURGE_CLAIMS).rowcount


_PURGE_RATE_BUCKETS = (
    "delete from memchat.rate_buckets where refilled_at < now() - interval '1 day'"
)


def purge_idle_rate_buckets(conn: psycopg.Connection[Any]) -> int:
    """Delete throttle buckets untouched for a day: full again for any sane
    rate, so a new request re-creates them as they would be."""
    with conn.transaction():
        return conn.execute(_PURGE_RATE_BUCKETS).rowcount


def count_expired(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(sessions, messages) a cleanup run would delete now."""
    row = conn.execute(_COUNT_EXPIRED).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# ------------------------------------------------------- feedback, stats

# The caller's own final answers only: RLS hides other users' messages, and
# a user message, a tool result or a tool-calling round is not an answer.
_ANSWER = """h.message->>'type' = 'ai'
   and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0"""

_FEEDBACK_JSON = """jsonb_build_object(
    'message_id', f.message_id, 'session_id', f.session_id, 'agent_name', f.agent_name,
    'rating', f.rating, 'comment', f.comment,
    'created_at', f.created_at, 'updated_at', f.updated_at)"""

_SET_FEEDBACK = sql.SQL(
    "insert into memchat.message_feedback as f"
    "   (message_id, user_id, session_id, agent_name, rating, comment)"
    " select h.id, h.user_id, h.session_id, s.agent_name, %(rating)s, %(comment)s"
    "   from public.chat_message_history h"
    "   join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id"
    "  where h.id = %(message_id)s and {answer}"
    " on conflict (message_id) do update"
    "    set rating = excluded.rating, comment = excluded.comment, updated_at = now()"
    " returning {feedback}"
).format(answer=sql.SQL(_ANSWER), feedback=sql.SQL(_FEEDBACK_JSON))

_DELETE_FEEDBACK = sql.SQL(
    "with gone as (delete from memchat.message_feedback f"
    "               where f.message_id = %(message_id)s returning 1)"
    " select exists (select 1 from public.chat_message_history h"
    "                 where h.id = %(message_id)s and {answer}),"
    "        exists (select 1 from gone)"
).format(answer=sql.SQL(_ANSWER))


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


async def set_feedback(
    db: Database, caller: Caller, message_id: int, rating: int, comment: str | None
) -> Feedback | None:
    """Rate one of the caller's answers (replacing an earlier rating); None
    when `message_id` is not one of the caller's final answers."""
    params = {"message_id": message_id, "rating": rating, "comment": comment}
    try:
        async with db.pipeline(caller.claims, throttle=Bucket.WRITE) as conn:
            cur = conn.cursor()
            await cur.execute(_SET_FEEDBACK, params)
    except pg_errors.ForeignKeyViolation:
        return None  # the answer was deleted (cleared) meanwhile
    except psycopg.Error as exc:
        raise _translate(exc) from exc
    row = await cur.fetchone()
    return Feedback.from_json(row[0]) if row else None


async def delete_feedback(db: Database, caller: Caller, message_id: int) -> bool | None:
    """Remove the caller's rating of an answer: whether there was one, or None
    when `message_id` is not one of the caller's final answers."""
    async with db.pipeline(caller.claims, throttle=Bucket.WRITE) as conn:
        cur = conn.cursor()
        await cur.execute(_DELETE_FEEDBACK, {"message_id": message_id})
    row = await cur.fetchone()
    assert row is not None
    is_answer, deleted = row
    return bool(deleted) if is_answer else None


async def chat_stats(db: Database, caller: Caller, agent_name: str | None) -> dict[str, Any]:
    """The caller's stats (memchat.chat_stats): one statement over their
    sessions' counters and their feedback, never their messages."""
    async with db.pipeline(caller.claims, throttle=Bucket.READ) as conn:
        cur = conn.cursor()
        await cur.execute("select memchat.chat_stats(%s)", (agent_name,))
    row = await cur.fetchone()
    assert row is not None
    stats: dict[str, Any] = row[0]
    return stats


async def session_stats(
    db: Database, caller: Caller, session_id: uuid.UUID
) -> dict[str, Any] | None:
    """One of the caller's sessions' stats; None if it is not theirs."""
    async with db.pipeline(caller.claims, throttle=Bucket.READ) as conn:
        cur = conn.cursor()
        await cur.execute("select memchat.session_stats(%s)", (session_id,))
    row = await cur.fetchone()
    return row[0] if row and row[0] is not None else None
