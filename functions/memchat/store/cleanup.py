"""The TTL cleanup's statements, as its own login role `memchat_cleanup`.

Its policies show it expired sessions only (and, for a dry run's count,
their messages' ids, never content). Synchronous: a scheduled batch job
that holds one connection for its run (and one more for its latency probe).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from memchat.store.distribute import on_citus

# Locks a batch of expired sessions, skipping any a live turn holds; the
# lock re-reads expires_at, so a session a turn has just extended drops out.
# The locked (id, user_id) keys go on as two arrays so the delete is a
# primary-key lookup per session whatever the table's size. Messages go by
# the FK cascade, and their embeddings and feedback with them by a
# statement-level trigger (supabase/schemas/triggers.sql), which also
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
# On Citus, which runs FOR UPDATE on one shard only: the batch read without
# a lock, then each of its users' sessions locked and deleted in a
# statement routed to that user's shard, skipping those a live turn holds
# (the lock re-reads expires_at, as above). The messages deleted are counted
# by their sessions' counters: the statement trigger that adds them up does
# not run there (supabase/citus/triggers.sql), nor may the cleanup read a
# message there (supabase/citus/policies.sql).
_DOOMED = """
select d.user_id, array_agg(d.id)
  from (select s.id, s.user_id from public.chat_sessions s
         where s.expires_at <= now()
         order by s.expires_at
         limit %(batch)s) d
 group by d.user_id
"""
_EXPIRE_USERS = """
with doomed as (
    select s.id from public.chat_sessions s
     where s.user_id = %(user_id)s and s.id = any(%(ids)s::uuid[]) and s.expires_at <= now()
       for update skip locked
)
delete from public.chat_sessions s using doomed d
 where s.user_id = %(user_id)s and s.id = d.id
returning s.message_count
"""
_COUNT_EXPIRED_BY_COUNTERS = """
select count(*), coalesce(sum(s.message_count), 0)::bigint
  from public.chat_sessions s where s.expires_at <= now()
"""
_DELETED_MESSAGES = (
    "select coalesce(nullif(current_setting('memchat.deleted_messages', true), ''), '0')::bigint"
)

_COUNT_EXPIRED = """
select count(*), coalesce(sum((select count(*) from public.chat_message_history h
                                where h.session_id = s.id and h.user_id = s.user_id)), 0)::bigint
  from public.chat_sessions s where s.expires_at <= now()
"""


# The deleted sessions' memories are kept this many days past each one's
# expiry (trigger chat_sessions_memories: supabase/schemas/functions/memories.sql).
# SET LOCAL: on Citus it reaches the workers, where the trigger runs.
_RETENTION = sql.SQL("set local memchat.memory_retention_days = {}")


def expire_sessions_batch(
    conn: psycopg.Connection[Any], batch: int, retention_days: int
) -> tuple[int, int]:
    """Delete up to `batch` expired sessions with their messages, in one
    transaction; their memories are kept `retention_days` past each one's
    expiry.

    Returns (deleted_sessions, deleted_messages).
    """
    with conn.transaction():
        # Never queue behind a user's own writes for long; the next run resumes.
        conn.execute("set local lock_timeout = '5s'")
        conn.execute(_RETENTION.format(sql.Literal(str(retention_days))))
        if on_citus(conn):
            return _expire_doomed(conn, batch)
        sessions = conn.execute(_EXPIRE_BATCH, {"batch": batch}).fetchone()
        messages = conn.execute(_DELETED_MESSAGES).fetchone()
    assert sessions is not None and messages is not None
    return int(sessions[0]), int(messages[0])


def _expire_doomed(conn: psycopg.Connection[Any], batch: int) -> tuple[int, int]:
    """expire_sessions_batch's deletes on Citus (_DOOMED, _EXPIRE_USERS)."""
    sessions = messages = 0
    for user_id, ids in conn.execute(_DOOMED, {"batch": batch}).fetchall():
        counts = conn.execute(_EXPIRE_USERS, {"user_id": user_id, "ids": ids}).fetchall()
        sessions += len(counts)
        messages += sum(int(row[0]) for row in counts)
    return sessions, messages


# Memories past their retention, oldest first, a batch at a time (no row
# lock first: the cleanup may not update them; a user deleting one of them
# meanwhile is waited for, within the lock timeout).
_EXPIRE_MEMORIES = """
delete from memchat.memories m
 using (select d.user_id, d.id from memchat.memories d
         where d.expires_at <= now()
         order by d.expires_at
         limit %(batch)s) doomed
 where m.user_id = doomed.user_id and m.id = doomed.id
"""


def expire_memories_batch(conn: psycopg.Connection[Any], batch: int) -> int:
    """Delete up to `batch` memories past their retention, in one transaction."""
    with conn.transaction():
        conn.execute("set local lock_timeout = '5s'")
        return conn.execute(_EXPIRE_MEMORIES, {"batch": batch}).rowcount


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
    """(sessions, messages) a cleanup run would delete now (on Citus, the
    messages by their sessions' counters, as it deletes them)."""
    row = conn.execute(_COUNT_EXPIRED_BY_COUNTERS if on_citus(conn) else _COUNT_EXPIRED).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def probe(conn: psycopg.Connection[Any]) -> None:
    """One round trip that reads nothing: the latency probe's measure."""
    conn.execute("select 1")


def next_xid(conn: psycopg.Connection[Any]) -> int:
    """One past the latest transaction id to finish (without taking one)."""
    row = conn.execute("select pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    return int(row[0]) if row else 0
