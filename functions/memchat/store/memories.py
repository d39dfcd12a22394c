"""Durable memory (memchat.memories): written by the embedding backfill,
listed, searched and deleted by its user, searched by recall once its
session is gone (supabase/schemas/functions/memories.sql)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from memchat.store.db import Database
from memchat.store.fragments import vector_literal
from memchat.store.records import Caller, Memory, Unembedded
from memchat.throttle import Bucket

_SAVE = (
    "select memchat.memories_save(%s::uuid[], %s, %s::bigint[], %s::integer[], %s::text[],"
    " %s::text[], %s::text[])"
)
_IMPORT = "select memchat.import_memories(%s, %s::jsonb, %s)"
_UNEMBEDDED = "select memchat.memory_embedding_source(%s, %s)"
_SAVE_EMBEDDINGS = "select memchat.memory_embedding_save(%s::bigint[], %s::uuid[], %s, %s::text[])"

# A memory as the API shows it: while its session lives it expires with it,
# MEMORY_RETENTION_DAYS (%(days)s) past the session's expiry.
_FIELDS = sql.SQL("""
jsonb_build_object(
  'id', m.id, 'agent_name', m.agent_name, 'text', m.text, 'kind', m.kind,
  'session_id', m.session_id, 'message_id', m.message_id, 'ordinal', m.ordinal,
  'created_at', m.created_at,
  'expires_at', coalesce(m.expires_at,
                         (select s.expires_at from public.chat_sessions s
                           where s.id = m.session_id and s.user_id = m.user_id)
                         + make_interval(days => %(days)s)))
""")
_LIST = sql.SQL("""
select coalesce(jsonb_agg(x.memory order by x.created_at desc, x.message_id desc,
                          x.ordinal desc), '[]'::jsonb)
  from (select m.created_at, m.message_id, m.ordinal, {fields} as memory
          from memchat.memories m
         where m.user_id = %(user_id)s
           and (%(agent_name)s::text is null or m.agent_name = %(agent_name)s)
           and (%(before_at)s::timestamptz is null
                or (m.created_at, m.message_id, m.ordinal)
                   < (%(before_at)s::timestamptz, %(before_message)s::bigint,
                      %(before_ordinal)s::integer))
         order by m.created_at desc, m.message_id desc, m.ordinal desc
         limit %(limit)s) x
""").format(fields=_FIELDS)
# A search in two statements: the matches' ids and scores first, in a
# statement that reads no table itself (on Citus a function reading a
# distributed table cannot run inside one that does), then the memories.
_MATCHES = """
select coalesce(array_agg(f.id order by f.ordinality), '{}'),
       coalesce(array_agg(f.score order by f.ordinality), '{}')
  from memchat.search_memories(%(agent_name)s, %(query)s::extensions.vector, %(model)s,
                               %(text)s, %(limit)s, %(min_score)s, false)
       with ordinality f
"""
_SEARCH = sql.SQL("""
select coalesce(jsonb_agg({fields} || jsonb_build_object('score', f.score)
                          order by f.ordinality), '[]'::jsonb)
  from unnest(%(ids)s::bigint[], %(scores)s::double precision[]) with ordinality
       f(id, score, ordinality)
  join memchat.memories m on m.id = f.id and m.user_id = %(user_id)s
""").format(fields=_FIELDS)
# The caller's memories of the ids given deleted, each marked forgotten, and
# with each the memories of its message that hold it or that it holds (a
# sentence and its whole message: neither keeps what the user removed).
# Counts the memories of the ids given.
FORGET = """
with chosen as (
  select m.id, m.user_id, m.message_id, m.kind, m.text from memchat.memories m
   where m.user_id = %(user_id)s and m.id = any(%(ids)s::bigint[])
), gone as (
  delete from memchat.memories m
   using chosen c
   where m.user_id = %(user_id)s and m.user_id = c.user_id
     and m.message_id = c.message_id and m.kind = c.kind
     and (strpos(m.text, c.text) > 0 or strpos(c.text, m.text) > 0)
  returning m.id, m.user_id, m.message_id, m.ordinal
), marked as (
  insert into memchat.forgotten_memories (message_id, ordinal, user_id)
  select g.message_id, g.ordinal, g.user_id from gone g
  on conflict do nothing
)
select count(*) from gone g where g.id in (select c.id from chosen c)
"""


async def save_memories(
    db: Database,
    model: str,
    memories: Sequence[tuple[Unembedded, int, str, list[float] | None]],
) -> int:
    """Store (message, ordinal, text, vector) memories of leased sessions'
    messages, embedded by `model` (vector None: the whole message, its
    stored embedding), as the backfill's worker: the user's kind "fact",
    the assistant's "assistant". Returns how many were stored."""
    if not memories:
        return 0
    args = (
        [m.lease for m, _, _, _ in memories],
        model,
        [m.id for m, _, _, _ in memories],
        [ordinal for _, ordinal, _, _ in memories],
        ["fact" if m.asked else "assistant" for m, _, _, _ in memories],
        [text for _, _, text, _ in memories],
        [None if vector is None else vector_literal(vector) for _, _, _, vector in memories],
    )
    return int(await db.value(None, _SAVE, args) or 0)


@dataclass(frozen=True)
class MemoryImport:
    """A durable memory an import brings (its session gone)."""

    agent_name: str
    kind: str  # "fact" | "assistant" | "summary"
    text: str
    session_id: uuid.UUID
    created_at: datetime
    expires_at: datetime | None  # None: MEMORY_RETENTION_DAYS from now


@dataclass(frozen=True)
class UnembeddedMemory:
    id: int
    user_id: uuid.UUID
    text: str


async def import_memories(
    db: Database, caller: Caller, memories: Sequence[MemoryImport], *, retention_days: int
) -> int:
    """Store the caller's imported durable memories (memchat.import_memories:
    those the caller has already skipped, none past `retention_days` from
    now, none with 0); the backfill embeds them. Returns how many were stored."""
    if not memories or retention_days <= 0:
        return 0
    given = [
        {
            "agent_name": m.agent_name,
            "kind": m.kind,
            "text": m.text,
            "session_id": str(m.session_id),
            "created_at": m.created_at.isoformat(),
            "expires_at": m.expires_at.isoformat() if m.expires_at else None,
        }
        for m in memories
    ]
    params = (caller.user_id, json.dumps(given, ensure_ascii=False), retention_days)
    return int(await db.value(caller.claims, _IMPORT, params) or 0)


async def unembedded_memories(db: Database, *, after: int, limit: int) -> list[UnembeddedMemory]:
    """The backfill's next memories without an embedding, in id order after
    `after`, at most `limit` (as the worker)."""
    found = await db.value(None, _UNEMBEDDED, (after, limit))
    return [UnembeddedMemory(int(m["id"]), uuid.UUID(m["user_id"]), m["text"]) for m in found or []]


async def save_memory_embeddings(
    db: Database, model: str, memories: Sequence[UnembeddedMemory], vectors: Sequence[list[float]]
) -> int:
    """Store each memory's embedding of `model` (those still without one)."""
    args = (
        [m.id for m in memories],
        [m.user_id for m in memories],
        model,
        [vector_literal(v) for v in vectors],
    )
    return int(await db.value(None, _SAVE_EMBEDDINGS, args) or 0)


# ------------------------------------------------- the owner's `reembed --memories`

# Live sessions' messages with text, after message %(after)s, oldest first.
_LIVE_MESSAGES = """
select h.id, h.message->'data'->>'content', memchat.asked(h.message)
  from public.chat_message_history h
  join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
 where h.id > %(after)s and memchat.embeddable(h.message)
   and s.status = 'active' and s.expires_at > now()
 order by h.id
 limit %(limit)s
"""
# Memories of those messages that they lack, but those their user forgot
# (one stored is left as it is): one that is its
# whole message takes the message's embedding of %s when it has one; the
# others wait for the backfill's (memchat.memory_embedding_source).
_REMEMBER_MESSAGES = """
insert into memchat.memories
    (user_id, agent_name, kind, text, session_id, message_id, ordinal, created_at, model,
     embedding)
select h.user_id, s.agent_name, x.kind, x.text, h.session_id, h.id, x.ordinal, h.created_at,
       e.model, e.embedding
  from unnest(%s::bigint[], %s::integer[], %s::text[], %s::text[], %s::boolean[])
       as x(id, ordinal, kind, text, whole)
  join public.chat_message_history h on h.id = x.id
  join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
  left join memchat.message_embeddings e
    on x.whole and e.message_id = h.id and e.user_id = h.user_id and e.model = %s
 where not exists (select 1 from memchat.forgotten_memories f
                    where f.message_id = h.id and f.ordinal = x.ordinal and f.user_id = h.user_id)
on conflict (user_id, message_id, ordinal) do nothing
"""
# The live sessions' summaries that are no memory yet (written before
# durable memory; memchat.summary_remember writes the later ones), dated by
# the last message each covers, to be embedded by the backfill.
_REMEMBER_SUMMARIES = """
insert into memchat.memories
    (user_id, agent_name, kind, text, session_id, message_id, ordinal, created_at)
select s.user_id, s.agent_name, 'summary', left(s.summary, 4000), s.id,
       s.summary_covers_until, -1, h.created_at
  from public.chat_sessions s
  join public.chat_message_history h on h.id = s.summary_covers_until and h.user_id = s.user_id
 where s.summary ~ '[^[:space:]]' and s.status = 'active' and s.expires_at > now()
   and not exists (select 1 from memchat.memories m
                    where m.user_id = s.user_id and m.session_id = s.id and m.kind = 'summary')
   and not exists (select 1 from memchat.forgotten_memories f
                    where f.message_id = s.summary_covers_until and f.ordinal = -1
                      and f.user_id = s.user_id)
on conflict (user_id, message_id, ordinal) do nothing
"""


@dataclass(frozen=True)
class StoredMessage:
    """A live message with text (`live_messages`)."""

    id: int
    text: str
    asked: bool  # the user's (kind "fact"), else the assistant's


def live_messages(conn: psycopg.Connection[Any], *, after: int, limit: int) -> list[StoredMessage]:
    """Up to `limit` messages of live sessions with text, after message
    `after`, oldest first, as the owner."""
    rows = conn.execute(_LIVE_MESSAGES, {"after": after, "limit": limit}).fetchall()
    return [StoredMessage(int(i), str(text), bool(asked)) for i, text, asked in rows]


def remember_messages(
    conn: psycopg.Connection[Any],
    model: str,
    memories: Sequence[tuple[StoredMessage, int, str, bool]],
) -> int:
    """Store (message, ordinal, text, whole) memories their messages lack
    (none their user forgot), as the owner: one that is its `whole` message
    takes the message's embedding of `model`, if any; the others are
    embedded by the backfill. Returns how many were stored."""
    if not memories:
        return 0
    args = (
        [m.id for m, _, _, _ in memories],
        [ordinal for _, ordinal, _, _ in memories],
        ["fact" if m.asked else "assistant" for m, _, _, _ in memories],
        [text for _, _, text, _ in memories],
        [whole for _, _, _, whole in memories],
        model,
    )
    with conn.transaction():
        return conn.execute(_REMEMBER_MESSAGES, args).rowcount


def remember_summaries(conn: psycopg.Connection[Any]) -> int:
    """Store the live sessions' summaries that are no memory yet (the
    backfill embeds them), as the owner. Returns how many."""
    with conn.transaction():
        return conn.execute(_REMEMBER_SUMMARIES).rowcount


async def list_memories(
    db: Database,
    caller: Caller,
    *,
    agent_name: str | None,
    before: tuple[datetime, int, int] | None,
    limit: int,
    retention_days: int,
) -> list[Memory]:
    """The caller's memories (of one agent, or all), the latest stated first
    (a message's later ones first), after `before` (a page's last
    (created_at, message_id, ordinal)), at most `limit`."""
    params = {
        "agent_name": agent_name,
        "before_at": before[0] if before else None,
        "before_message": before[1] if before else None,
        "before_ordinal": before[2] if before else None,
        "limit": limit,
        "days": retention_days,
    }
    return await _memories(db, caller, _LIST, params)


async def search_memories(
    db: Database,
    caller: Caller,
    *,
    agent_name: str,
    text: str,
    query: list[float] | None,
    model: str,
    limit: int,
    min_score: float,
    retention_days: int,
    throttle: Bucket | None = None,
) -> list[Memory]:
    """The caller's memories of an agent that match `text` (its embedding
    `query` of `model`, or None: by words only), best first; taking a token
    of `throttle` first, in the same transaction, when given."""
    params: dict[str, Any] = {
        "agent_name": agent_name,
        "query": vector_literal(query) if query is not None else None,
        "model": model,
        "text": text,
        "limit": limit,
        "min_score": min_score,
        "days": retention_days,
        "user_id": caller.user_id,
    }
    async with db.pipeline(caller.claims, throttle=throttle) as conn:
        matches = await conn.execute(_MATCHES, params)
        row = await matches.fetchone()  # in the block: its own round trip
        assert row is not None
        found = await conn.execute(_SEARCH, {**params, "ids": row[0], "scores": row[1]})
    rows = await found.fetchone()
    return _as_memories(rows[0] if rows else None)


async def delete_memory(db: Database, caller: Caller, memory_id: int) -> int:
    """Delete one of the caller's memories (never written again by the
    backfill): 1, or 0 when the caller has none with that id."""
    params = {"user_id": caller.user_id, "ids": [memory_id]}
    return int(await db.value(caller.claims, FORGET, params, throttle=Bucket.WRITE) or 0)


async def _memories(
    db: Database,
    caller: Caller,
    query: sql.Composed,
    params: dict[str, Any],
    throttle: Bucket | None = None,
) -> list[Memory]:
    params = {**params, "user_id": caller.user_id}
    return _as_memories(await db.value(caller.claims, query, params, throttle=throttle))


def _as_memories(found: list[dict[str, Any]] | None) -> list[Memory]:
    return [Memory.from_json(item) for item in found or []]
