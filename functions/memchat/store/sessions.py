"""Sessions: the caller's list, the active one, clearing one; the agents they use."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg import sql

from memchat.errors import SessionNotFound
from memchat.store.db import Database
from memchat.store.fragments import SESSION_JSON
from memchat.store.records import Caller, Cleared, SessionInfo
from memchat.throttle import Bucket

# Makes a session (of the caller's, by id) its agent's active one.
_POINT_ACTIVE = """
insert into public.user_agent_active_sessions as a
    (user_id, agent_name, active_session_id, last_active_at)
select s.user_id, s.agent_name, s.id, now()
  from public.chat_sessions s
 where s.user_id = %(user_id)s and s.id = %(session_id)s
on conflict (user_id, agent_name) do update set
    active_session_id = excluded.active_session_id,
    last_active_at = excluded.last_active_at
"""

# The session a clear-session request names, locked, its id recorded for
# the transaction (memchat.lock_clear_target); the later statements read it.
_CLEAR_LOCK = "select memchat.lock_clear_target(%(session_id)s, %(agent_name)s)"
_TARGET = sql.SQL("nullif(current_setting('memchat.clear_target', true), '')::uuid")

_CLEAR_MESSAGES = sql.SQL(
    "with d as (delete from public.chat_message_history h"
    " where h.user_id = %(user_id)s and h.session_id = {target}"
    " returning 1) select count(*) from d"
).format(target=_TARGET)
_CLEAR_MARK = sql.SQL(
    "update public.chat_sessions set status = 'cleared', message_count = 0,"
    " title = null, summary = null, summary_covers_until = null,"
    " summary_covers_count = 0, summary_updated_at = null"
    " where user_id = %(user_id)s and id = {target}"
).format(target=_TARGET)
_CLEAR_QUEUE = sql.SQL(
    "delete from memchat.summary_queue where user_id = %(user_id)s and session_id = {target}"
).format(target=_TARGET)
# The fresh session, of the cleared one's agent (as memchat.lock_clear_target
# recorded it): a statement of no table but the one it writes, which Citus
# runs on the coordinator, where the transaction's settings are.
_CLEAR_NEW_SESSION = sql.SQL(
    "insert into public.chat_sessions as s (id, user_id, agent_name, expires_at)"
    " select %(new_id)s, %(user_id)s, t.agent_name, memchat.session_expiry(%(ttl)s)"
    " from (select nullif(current_setting('memchat.clear_agent', true), '') as agent_name) t"
    " where t.agent_name is not null"
    " returning {session}"
).format(session=sql.SQL(SESSION_JSON))


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
        await conn.execute(
            _POINT_ACTIVE, {"user_id": caller.user_id, "session_id": params["new_id"]}
        )
    found = await target.fetchone()
    if found is None or found[0] is None:
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
    " where s.user_id = %(user_id)s"
    "   and (%(agent_name)s::text is null or s.agent_name = %(agent_name)s::text)"
    "   and (%(before_at)s::timestamptz is null"
    "        or (s.last_active_at, s.id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))"
    " order by s.last_active_at desc, s.id desc limit %(limit)s"
).format(session=sql.SQL(SESSION_JSON))

_ACTIVE_SESSION = sql.SQL(
    "select {session} from public.user_agent_active_sessions a"
    " join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id"
    " where a.user_id = %s and a.agent_name = %s"
    "   and s.status = 'active' and s.expires_at > now()"
).format(session=sql.SQL(SESSION_JSON))


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
        "user_id": caller.user_id,
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
    """The session a message without session_id continues (None: there is none)."""
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_ACTIVE_SESSION, (caller.user_id, agent_name))
    row = await cur.fetchone()
    return SessionInfo.from_json(row[0]) if row else None


_AGENT_NAMES = (
    "select s.agent_name from public.chat_sessions s where s.user_id = %(user_id)s"
    " union"
    " select m.agent_name from public.agent_long_term_memory m"
    " where m.user_id = %(user_id)s"
    " order by 1"
)


async def agent_names(db: Database, caller: Caller) -> list[str]:
    """The agents the caller has talked to or has notes for, by name."""
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_AGENT_NAMES, {"user_id": caller.user_id})
    return [str(row[0]) for row in await cur.fetchall()]


@dataclass(frozen=True)
class ChatHistory:
    """A resent chat as memchat stored it: the session holding its last
    answer (None: no live session of the agent holds it), and the stored
    question and answer of each of its exchanges found there, oldest first."""

    session_id: uuid.UUID | None
    messages: list[dict[str, Any]]


async def chat_of_history(
    db: Database,
    caller: Caller,
    agent_name: str,
    exchanges: Sequence[tuple[str | None, str]],
    limit: int,
) -> ChatHistory:
    """The session of a chat a client resends (`exchanges`: its (question,
    answer) pairs, oldest first; a question None when the answer has none
    before it), found by its last answer after the same question, and the
    last `limit` of its exchanges found in that session (memchat.chat_of_history)."""
    questions = [question for question, _ in exchanges]
    answers = [answer for _, answer in exchanges]
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(
            "select memchat.chat_of_history(%s, %s, %s, %s)",
            (agent_name, questions, answers, limit),
        )
    row = await cur.fetchone()
    assert row is not None
    found: dict[str, Any] = row[0]
    session_id = found["session_id"]
    return ChatHistory(uuid.UUID(session_id) if session_id else None, list(found["messages"]))
