"""Exports: one session, or everything a user has, read in one snapshot.

`snapshot` opens a read-only REPEATABLE READ transaction for the caller
(after taking its throttle token) and hands out an ExportReader over it, so
an export streamed for minutes still shows one consistent state.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from memchat.store.db import Database
from memchat.store.fragments import MESSAGE_ROLE, SESSION_JSON
from memchat.store.records import Caller, SessionInfo
from memchat.throttle import Bucket

# One message as export JSON, built by the database so export streams text.
_MESSAGE_EXPORT_JSON = sql.SQL("""(jsonb_build_object(
    'id', h.id,
    'role', {role},
    'content', coalesce(h.message->'data'->'content', '""'::jsonb),
    'created_at', h.created_at,
    'metadata', jsonb_strip_nulls(jsonb_build_object(
        'tool_calls', nullif(h.message->'data'->'tool_calls', '[]'::jsonb),
        'tool_call_id', h.message->'data'->'tool_call_id',
        'name', h.message->'data'->'name',
        'usage', h.message->'data'->'usage_metadata',
        'model', h.message->'data'->'response_metadata'->'model_name',
        'client_message_id', h.client_message_id)))
    || case when f.message_id is null then '{{}}'::jsonb else jsonb_build_object(
        'feedback', jsonb_build_object(
            'rating', f.rating, 'comment', f.comment,
            'created_at', f.created_at, 'updated_at', f.updated_at)) end)::text""").format(
    role=sql.SQL(MESSAGE_ROLE)
)

MESSAGE_BATCH = 2000
SESSION_BATCH = 500

_SESSION = sql.SQL(
    "select {session} from public.chat_sessions s where s.user_id = %s and s.id = %s"
).format(session=sql.SQL(SESSION_JSON))

_MESSAGES = sql.SQL(
    "select h.id, {message} from public.chat_message_history h"
    " left join memchat.message_feedback f on f.message_id = h.id and f.user_id = h.user_id"
    " where h.user_id = %s and h.session_id = %s and h.id > %s"
    " order by h.id limit %s"
).format(message=_MESSAGE_EXPORT_JSON)

_SESSIONS = sql.SQL(
    "select {session}, s.created_at, s.id from public.chat_sessions s"
    " where s.user_id = %(user_id)s"
    "   and (%(after_at)s::timestamptz is null"
    "        or (s.created_at, s.id) > (%(after_at)s::timestamptz, %(after_id)s::uuid))"
    " order by s.created_at, s.id limit %(limit)s"
).format(session=sql.SQL(SESSION_JSON))

_ACTIVE_SESSIONS = """
select coalesce(jsonb_agg(jsonb_build_object(
         'agent_name', a.agent_name, 'active_session_id', a.active_session_id,
         'last_active_at', a.last_active_at, 'created_at', a.created_at)
         order by a.agent_name), '[]'::jsonb)
  from public.user_agent_active_sessions a where a.user_id = %s
"""

_NOTES = """
select coalesce(jsonb_agg(jsonb_build_object(
         'agent_name', m.agent_name, 'notes', m.notes, 'version', m.version,
         'created_at', m.created_at, 'updated_at', m.updated_at,
         'earlier_versions', (select coalesce(jsonb_agg(jsonb_build_object(
            'version', v.version, 'notes', v.notes, 'created_at', v.created_at)
            order by v.version desc), '[]'::jsonb) from memchat.notes_versions v
          where v.user_id = m.user_id and v.agent_name = m.agent_name
            and v.version < m.version))
         order by m.agent_name), '[]'::jsonb)
  from public.agent_long_term_memory m where m.user_id = %s
"""


# The caller's memories as export JSON text, the earliest stated first (a
# message's in order), a batch at a time after the last one's key
# (expires_at: null while the memory's session lives).
_MEMORIES = """
select jsonb_build_object(
         'id', m.id, 'agent_name', m.agent_name, 'kind', m.kind, 'text', m.text,
         'session_id', m.session_id, 'message_id', m.message_id,
         'created_at', m.created_at, 'expires_at', m.expires_at)::text,
       m.created_at, m.message_id, m.ordinal
  from memchat.memories m
 where m.user_id = %(user_id)s
   and (%(after_at)s::timestamptz is null
        or (m.created_at, m.message_id, m.ordinal)
           > (%(after_at)s::timestamptz, %(after_message)s::bigint, %(after_ordinal)s::integer))
 order by m.created_at, m.message_id, m.ordinal
 limit %(limit)s
"""


@asynccontextmanager
async def snapshot(
    db: Database, caller: Caller, *, whole_account: bool
) -> AsyncIterator[ExportReader]:
    """The caller's data as of now, for as long as the block runs. Takes a token
    from the caller's `export` bucket for the whole account, else from `read`."""
    bucket = Bucket.EXPORT if whole_account else Bucket.READ
    async with db.transaction(caller.claims, snapshot=True, throttle=bucket) as conn:
        yield ExportReader(conn, caller.user_id)


class ExportReader:
    """Reads of one export's snapshot (see `snapshot`), each naming its
    caller's user_id (on Citus, the shard it is routed to)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], user_id: uuid.UUID) -> None:
        self._conn = conn
        self._user_id = user_id

    async def session(self, session_id: uuid.UUID) -> SessionInfo | None:
        """One of the caller's sessions (None: the caller has none with that id)."""
        cur = await self._conn.execute(_SESSION, (self._user_id, session_id))
        row = await cur.fetchone()
        return SessionInfo.from_json(row[0]) if row else None

    async def messages(
        self, session_id: uuid.UUID, batch: int = MESSAGE_BATCH
    ) -> AsyncIterator[list[str]]:
        """A session's messages as export JSON text, oldest first, in batches."""
        async for texts in self._by_id(_MESSAGES, (self._user_id, session_id), batch):
            yield texts

    async def memories(self, batch: int = MESSAGE_BATCH) -> AsyncIterator[list[str]]:
        """The caller's memories as export JSON text, the earliest stated
        first, in batches."""
        after: tuple[datetime, int, int] | None = None
        while True:
            cur = await self._conn.execute(
                _MEMORIES,
                {
                    "user_id": self._user_id,
                    "after_at": after[0] if after else None,
                    "after_message": after[1] if after else None,
                    "after_ordinal": after[2] if after else None,
                    "limit": batch,
                },
            )
            rows = await cur.fetchall()
            if not rows:
                return
            yield [r[0] for r in rows]
            if len(rows) < batch:
                return
            after = (rows[-1][1], rows[-1][2], rows[-1][3])

    async def _by_id(
        self, query: Any, params: tuple[Any, ...], batch: int
    ) -> AsyncIterator[list[str]]:
        """The JSON texts `query` reads (its rows (id, text); its last two
        parameters: the id after which, how many), a batch at a time."""
        after = 0
        while True:
            cur = await self._conn.execute(query, (*params, after, batch))
            rows = await cur.fetchall()
            if not rows:
                return
            yield [r[1] for r in rows]
            if len(rows) < batch:
                return
            after = rows[-1][0]

    async def sessions(self, batch: int = SESSION_BATCH) -> AsyncIterator[list[SessionInfo]]:
        """All of the caller's sessions, oldest first, in batches."""
        after: tuple[datetime, uuid.UUID] | None = None
        while True:
            cur = await self._conn.execute(
                _SESSIONS,
                {
                    "user_id": self._user_id,
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

    async def account_extras(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The caller's active-session pointers, and long-term notes with their
        earlier versions."""
        cur = await self._conn.execute(_ACTIVE_SESSIONS, (self._user_id,))
        pointers = await cur.fetchone()
        cur = await self._conn.execute(_NOTES, (self._user_id,))
        notes = await cur.fetchone()
        assert pointers is not None and notes is not None
        return pointers[0], notes[0]
