"""A chat turn's two round trips: load what it starts from, record what it stores
(and a third for a retry of a turn with the client's tools: `stored_turn`).

Both halves are SQL functions (supabase/schemas/functions/turns.sql and later):
PL/pgSQL caches their plans per server connection, pooler-safe.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from memchat.errors import (
    DuplicateClientMessage,
    IdempotencyConflict,
    IdempotencyInFlight,
    RateLimited,
)
from memchat.store.db import Database, constraint_of, translate
from memchat.store.fragments import vector_param
from memchat.store.memories import FORGET
from memchat.store.records import (
    Caller,
    Context,
    Limits,
    Notes,
    Replay,
    SessionInfo,
    Summary,
    Turn,
)
from memchat.throttle import OFF, Rate

# Each names its caller first: on Citus, the worker the call is delegated to.
LOAD_CONTEXT = "select memchat.load_context(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
RECORD_TURN = (
    "select memchat.record_turn("
    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::extensions.vector, %s, %s)"
)
_RELEASE_CLAIM = "delete from memchat.turn_claims where user_id = %s and client_message_id = %s"
# The message a client_message_id is stored on (a turn's first: the user
# message, or a continuation's first tool result) and the assistant message
# that ended its turn: the first after it that is not a round of only
# memchat's own tool calls (`own`), so an answer or a call of the client's tools.
_STORED_TURN = """
select u.id, u.message->>'type', a.id, a.message
  from public.chat_message_history u
  join lateral (
       select x.id, x.message from public.chat_message_history x
        where x.user_id = u.user_id and x.session_id = u.session_id and x.id > u.id
          and x.message->>'type' = 'ai'
          and (coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
               or exists (select 1 from jsonb_array_elements(x.message->'data'->'tool_calls') c
                           where not coalesce(c->>'name' = any(%(own)s), false)))
        order by x.id
        limit 1) a on true
 where u.user_id = %(user_id)s and u.session_id = %(session_id)s
   and u.client_message_id = %(client_message_id)s
"""


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
        caller.user_id,
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
    row = await _one_row(db, caller, LOAD_CONTEXT, args)
    assert row is not None
    result: dict[str, Any] = row[0]
    _refuse(result)
    return _context(result, agent_name, read_notes)


async def _one_row(
    db: Database, caller: Caller, statement: str, params: Any
) -> tuple[Any, ...] | None:
    """One statement for the caller (one round trip): its first row."""
    try:
        async with db.pipeline(caller.claims) as conn:
            cur = conn.cursor()
            await cur.execute(statement, params)
    except psycopg.Error as exc:
        raise translate(exc) from exc
    return await cur.fetchone()


def _refuse(result: dict[str, Any]) -> None:
    """Raise what load_context's answer refuses the turn for, if anything."""
    if result.get("idempotency") == "in_flight":
        raise IdempotencyInFlight()
    if result.get("idempotency") == "conflict":
        raise IdempotencyConflict()
    if "throttled" in result:
        raise RateLimited(float(result["throttled"]))


def _context(result: dict[str, Any], agent_name: str, read_notes: bool) -> Context:
    """load_context's answer as a Context: a replay, or what the turn starts from."""
    session = result["session"]
    info = SessionInfo.from_json(session) if session else None
    replay = result["replay"]
    if replay:
        return Context(
            session=info,
            notes=None,
            messages=[],
            replay=Replay(replay["message"], replay["message_id"], replay["user_message_id"]),
        )
    limits = result["limits"]
    summary = result.get("summary")
    resolved_agent = info.agent_name if info else agent_name
    return Context(
        session=info,
        notes=Notes.from_json(resolved_agent, result["notes"]) if read_notes else None,
        messages=result["messages"],
        replay=None,
        claimed=result["claimed"],
        limits=Limits(
            max_message_chars=limits["max_message_chars"],
            max_notes_chars=limits["max_notes_chars"],
            max_session_ttl=timedelta(seconds=float(limits["max_session_ttl_seconds"])),
            max_stored_messages=int(limits["max_stored_messages"]),
            stored_messages=int(result["stored_messages"]),
        ),
        summary=Summary(summary["text"], int(summary["covers_until"])) if summary else None,
    )


async def stored_turn(
    db: Database,
    caller: Caller,
    *,
    session_id: uuid.UUID,
    client_message_id: str,
    own_tools: Iterable[str],
) -> tuple[str, Replay] | None:
    """The turn stored with `client_message_id` in the session: the type of
    the message the key is on (`human`, or `tool` for a continuation's) and
    the assistant message that ended the turn, an answer or a call of the
    client's tools (a round of only `own_tools` calls went on); None when no
    turn has that key. `Replay.user_message_id` is the keyed message's id."""
    params = {
        "user_id": caller.user_id,
        "session_id": session_id,
        "client_message_id": client_message_id,
        "own": list(own_tools),
    }
    row = await _one_row(db, caller, _STORED_TURN, params)
    if row is None:
        return None
    keyed_id, keyed_type, message_id, message = row
    return str(keyed_type), Replay(message, int(message_id), int(keyed_id))


# The session's messages from its last user message on, newest first (at
# most %(limit)s: a longer turn cannot be continued).
_OPEN_TURN = """
select h.message from public.chat_message_history h
 where h.user_id = %(user_id)s and h.session_id = %(session_id)s
   and h.id >= (select x.id from public.chat_message_history x
                 where x.user_id = %(user_id)s and x.session_id = %(session_id)s
                   and x.message->>'type' = 'human'
                 order by x.id desc
                 limit 1)
 order by h.id desc
 limit %(limit)s
"""
OPEN_TURN_MAX_MESSAGES = 200


async def open_turn(db: Database, caller: Caller, session_id: uuid.UUID) -> list[dict[str, Any]]:
    """The session's last turn as stored (its user message first, then the
    model's rounds), when it may be continued: it ends with a call of the
    client's tools awaiting results. [] when the session has no such turn."""
    params = {"user_id": caller.user_id, "session_id": session_id, "limit": OPEN_TURN_MAX_MESSAGES}
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_OPEN_TURN, params)
    turn = [row[0] for row in reversed(await cur.fetchall())]
    if not turn or turn[0].get("type") != "human":
        return []
    calls = [m for m in turn if m.get("type") == "ai"]
    if not calls or not calls[-1].get("data", {}).get("tool_calls"):
        return []  # answered: its last assistant message is an answer
    return turn


async def release_claim(db: Database, caller: Caller, client_message_id: str) -> None:
    """Give up a turn's claim on its client_message_id (the turn failed)."""
    async with db.pipeline(caller.claims) as conn:
        await conn.execute(_RELEASE_CLAIM, (caller.user_id, client_message_id))


async def record_turn(db: Database, caller: Caller, turn: Turn) -> SessionInfo:
    """Store a whole turn atomically; sessions are locked so turns never interleave.

    Returns the session the turn went into: `turn.session_id`, or with
    `turn.new_session` the session a concurrent first turn made active.
    Raises NotesConflict when the notes changed since they were read (nothing
    is stored; re-read and retry), DuplicateClientMessage when a concurrent
    request with the same client_message_id was stored first, QuotaExceeded
    when it would take the user past their stored messages, PayloadTooLarge
    or InvalidInput when a database limit refuses it.
    """
    args = (
        caller.user_id,
        turn.session_id,
        turn.agent_name,
        turn.title,
        Jsonb(turn.messages),
        turn.ttl,
        turn.client_message_id,
        turn.notes,
        turn.notes_version,
        turn.new_session,
        vector_param(turn.embedding.vector if turn.embedding else None),
        turn.embedding.model if turn.embedding else None,
        turn.summary_due_after,
    )
    try:
        async with db.pipeline(caller.claims) as conn:
            session_cur = conn.cursor()
            await session_cur.execute(RECORD_TURN, args)
            if turn.forget_memory_ids:
                forget = {"user_id": caller.user_id, "ids": turn.forget_memory_ids}
                await conn.cursor().execute(FORGET, forget)
    except psycopg.errors.UniqueViolation as exc:
        if constraint_of(exc) == "chat_message_history_client_message_idx":
            raise DuplicateClientMessage() from exc
        raise
    except psycopg.Error as exc:
        raise translate(exc) from exc
    row = await session_cur.fetchone()
    assert row is not None
    return SessionInfo.from_json(row[0])
