"""The embedding backfill's queue: sessions whose user messages need embeddings.

Three callers (supabase/schemas/functions/embeddings.sql):

- the API, for a user (`db, caller`): `queue_embeddings` after an import
  queues the caller's own sessions, `embedding_backlog` says how many of
  the caller's messages still wait and how many the backfill gave up on
  (both 0: recall can find them), both as `memchat_user` under RLS;
- the worker (usecases/backfill.py; `db`, logged in as `memchat_worker`),
  which may only call the memchat.embedding_* functions: a claim leases due
  items, and every later call names its lease, so the worker reads and
  writes only the sessions the queue hands it, only while its lease lives;
- `memchat db reembed` (`conn`, the owner): queue every session with a
  message lacking an embedding of a model, and count those messages.

Which messages get an embedding (user messages with text) and which still
need one of a model are SQL functions (memchat.embeddable,
memchat.unembedded_messages), used by all of these; the text embedded for
each is memchat.usecases.recall.meaning.embedding_text.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from memchat.store.db import Database
from memchat.store.fragments import vector_literal
from memchat.store.records import Caller, DueEmbeddings, Embedding, EmbeddingBacklog, Unembedded

_QUEUE = "select memchat.queue_embeddings(%s::uuid[])"
_BACKLOG = "select pending, failed from memchat.embedding_backlog()"
_CLAIM = "select memchat.embedding_claim(%s, %s)"
_SOURCE = "select memchat.embedding_source(%s, %s, %s, %s)"
_SAVE = "select memchat.embedding_save(%s::uuid[], %s, %s::bigint[], %s::text[])"
_FACTS = (
    "select memchat.facts_save(%s::uuid[], %s::bigint[], %s, %s::bigint[], %s::integer[],"
    " %s::text[])"
)
_STATISTICS = "select memchat.embedding_statistics()"
_DONE = "select memchat.embedding_done(%s, %s)"
_FAILED = "select memchat.embedding_failed(%s, %s)"

# The live sessions (the cleanup deletes the others' messages), as the owner;
# then those of them with a message lacking an embedding of %(model)s, in a
# statement that reads no table itself (on Citus a function reading a
# distributed table cannot run inside one that does).
_LIVE = """
select coalesce(array_agg(s.id), '{}'), coalesce(array_agg(s.user_id), '{}')
  from public.chat_sessions s
 where s.status = 'active' and s.expires_at > now()"""
_LACKING = sql.SQL("""
  from unnest(%(sessions)s::uuid[], %(users)s::uuid[]) s(id, user_id)
 cross join lateral memchat.unembedded_messages(s.user_id, s.id, %(model)s) u""")
# Queued, or ready now if they were: a lease left by a stopped run, a backoff
# or a give-up no longer holds them back (`excluded`'s next_attempt_at is
# its default, now(): Citus refuses now() itself in DO UPDATE).
_QUEUE_LACKING = sql.SQL("""
insert into memchat.embedding_queue as q (session_id, user_id)
select distinct s.id, s.user_id {lacking}
on conflict (session_id, user_id) do update
   set attempts = 0, next_attempt_at = excluded.next_attempt_at, lease = null""").format(
    lacking=_LACKING
)
_COUNT_LACKING = sql.SQL("select count(*) {lacking}").format(lacking=_LACKING)


def _lacking_params(conn: psycopg.Connection[Any], model: str) -> dict[str, Any]:
    row = conn.execute(_LIVE).fetchone()
    assert row is not None
    return {"sessions": row[0], "users": row[1], "model": model}


# ------------------------------------------------------------------ the API


async def queue_embeddings(db: Database, caller: Caller, session_ids: Sequence[uuid.UUID]) -> int:
    """Queue the caller's sessions among `session_ids` for the backfill (an
    import's); others' and unknown ids are ignored, a session already queued
    stays as it is. Returns how many of them are the caller's."""
    return int(await db.value(caller.claims, _QUEUE, (list(session_ids),)))


async def embedding_backlog(db: Database, caller: Caller) -> EmbeddingBacklog:
    """The caller's messages without an embedding in its queued live
    sessions: those the backfill will embed (pending) and those of sessions
    it gave up on (failed, until the session is queued again). Both 0: recall
    can find every one."""
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_BACKLOG)
    row = await cur.fetchone()
    assert row is not None
    return EmbeddingBacklog(pending=int(row[0]), failed=int(row[1]))


async def embeddings_pending(db: Database, caller: Caller) -> int:
    """How many of the caller's messages wait for the backfill (`embedding_backlog`'s
    pending): 0 once none waits (though some may have failed)."""
    return (await embedding_backlog(db, caller)).pending


# ---------------------------------------------------------------- the worker


async def claim_embeddings(
    db: Database, *, limit: int, lease_seconds: float
) -> list[DueEmbeddings]:
    """Lease up to `limit` due items for `lease_seconds` (FOR UPDATE SKIP LOCKED
    in one short transaction: another worker skips them)."""
    found = await db.value(None, _CLAIM, (limit, lease_seconds))
    return [
        DueEmbeddings(uuid.UUID(i["lease"]), uuid.UUID(i["session_id"]), int(i["attempts"]))
        for i in found or []
    ]


async def unembedded(
    db: Database, item: DueEmbeddings, *, model: str, after: int, limit: int
) -> list[Unembedded]:
    """Up to `limit` messages of a leased item's session that need an embedding
    of `model`, after message `after`, oldest first ([]: none left, or the
    lease is gone)."""
    found = await db.value(None, _SOURCE, (item.lease, model, after, limit))
    return [
        Unembedded(
            item.lease, int(m["id"]), m["text"], bool(m.get("embedded")), bool(m.get("asked"))
        )
        for m in found or []
    ]


async def save_embeddings(
    db: Database, messages: Sequence[Unembedded], embeddings: Sequence[Embedding]
) -> int:
    """Store each message's embedding (all of one model), while its lease lives.
    An embedding of another model is replaced, one of the same kept. Returns
    how many were stored."""
    models = {e.model for e in embeddings}
    if not messages:
        return 0
    (model,) = models  # one request's: one model
    args = (
        [m.lease for m in messages],
        model,
        [m.id for m in messages],
        [vector_literal(e.vector) for e in embeddings],
    )
    return int(await db.value(None, _SAVE, args))


async def save_facts(
    db: Database,
    messages: Sequence[Unembedded],
    model: str,
    facts: Sequence[tuple[Unembedded, int, list[float]]],
) -> int:
    """Store the fact keys of `messages` (each with its embedding of `model`
    stored): `facts` holds (message, ordinal, vector), none for a message
    without facts; keys stored before for them are replaced. Returns how
    many messages were marked done."""
    if not messages:
        return 0
    args = (
        [m.lease for m in messages],
        [m.id for m in messages],
        model,
        [m.id for m, _, _ in facts],
        [ordinal for _, ordinal, _ in facts],
        [vector_literal(vector) for _, _, vector in facts],
    )
    return int(await db.value(None, _FACTS, args))


async def embedding_statistics(db: Database) -> int:
    """Analyse the young recall-key partitions that hold at least 1,000 keys
    and were never analysed, or twice as many as their statistics count
    (under 5,000; supabase/schemas/functions/partitions.sql), whoever grew them.
    Returns how many."""
    return int(await db.value(None, _STATISTICS, ()))


async def embeddings_done(db: Database, item: DueEmbeddings, *, model: str) -> bool:
    """The end of an item's pass: it leaves the queue when nothing in its
    session needs an embedding of `model` any more (True), else stays, ready
    now (False; also when the lease is gone)."""
    return bool(await db.value(None, _DONE, (item.lease, model)))


async def embeddings_failed(db: Database, item: DueEmbeddings, *, retry_in: float | None) -> None:
    """Record a failed pass: retry after `retry_in` seconds (None: give up until
    the session is queued again)."""
    await db.value(None, _FAILED, (item.lease, retry_in))


# ----------------------------------------------------------- the owner's reembed


def queue_unembedded(conn: psycopg.Connection[Any], model: str) -> int:
    """Queue every live session with a message lacking an embedding of `model`,
    ready now. Returns how many sessions that is."""
    return conn.execute(_QUEUE_LACKING, _lacking_params(conn, model)).rowcount


def count_unembedded(conn: psycopg.Connection[Any], model: str) -> int:
    """How many messages of live sessions lack an embedding of `model`."""
    row = conn.execute(_COUNT_LACKING, _lacking_params(conn, model)).fetchone()
    return int(row[0]) if row else 0
