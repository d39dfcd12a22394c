"""Feedback: a rating (and a comment) on one of the caller's final answers."""

from __future__ import annotations

import psycopg
from psycopg import sql

from memchat.store.db import Database, translate
from memchat.store.fragments import FINAL_ANSWER
from memchat.store.records import Caller, Feedback
from memchat.throttle import Bucket

# Only the caller's own final answers can be rated: RLS hides other users'
# messages, and a user message, a tool result or a tool-calling round is
# not an answer (FINAL_ANSWER).

_FEEDBACK_JSON = """jsonb_build_object(
    'message_id', f.message_id, 'session_id', f.session_id, 'agent_name', f.agent_name,
    'rating', f.rating, 'comment', f.comment,
    'created_at', f.created_at, 'updated_at', f.updated_at)"""

_SET_FEEDBACK = sql.SQL(
    "insert into memchat.message_feedback as f"
    "   (message_id, user_id, session_id, agent_name, rating, comment, updated_at)"
    " select h.id, h.user_id, h.session_id, s.agent_name, %(rating)s, %(comment)s, now()"
    "   from public.chat_message_history h"
    "   join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id"
    "  where h.user_id = %(user_id)s and h.id = %(message_id)s and {answer}"
    # excluded's, not now() itself: Citus refuses it in DO UPDATE (docs/deploy.md).
    " on conflict (message_id, user_id) do update"
    "    set rating = excluded.rating, comment = excluded.comment,"
    "        updated_at = excluded.updated_at"
    " returning {feedback}"
).format(answer=sql.SQL(FINAL_ANSWER), feedback=sql.SQL(_FEEDBACK_JSON))

_DELETE_FEEDBACK = sql.SQL(
    "with gone as (delete from memchat.message_feedback f"
    "               where f.user_id = %(user_id)s and f.message_id = %(message_id)s"
    "               returning 1)"
    " select exists (select 1 from public.chat_message_history h"
    "                 where h.user_id = %(user_id)s and h.id = %(message_id)s and {answer}),"
    "        exists (select 1 from gone)"
).format(answer=sql.SQL(FINAL_ANSWER))


async def set_feedback(
    db: Database, caller: Caller, message_id: int, rating: int, comment: str | None
) -> Feedback | None:
    """Rate one of the caller's answers (replacing an earlier rating); None
    when `message_id` is not one of the caller's final answers."""
    params = {
        "user_id": caller.user_id,
        "message_id": message_id,
        "rating": rating,
        "comment": comment,
    }
    try:
        async with db.pipeline(caller.claims, throttle=Bucket.WRITE) as conn:
            cur = conn.cursor()
            await cur.execute(_SET_FEEDBACK, params)
    except psycopg.errors.ForeignKeyViolation:
        return None  # the answer was deleted (cleared) meanwhile
    except psycopg.Error as exc:
        raise translate(exc) from exc
    row = await cur.fetchone()
    return Feedback.from_json(row[0]) if row else None


async def delete_feedback(db: Database, caller: Caller, message_id: int) -> bool | None:
    """Remove the caller's rating of an answer: whether there was one, or None
    when `message_id` is not one of the caller's final answers."""
    async with db.pipeline(caller.claims, throttle=Bucket.WRITE) as conn:
        cur = conn.cursor()
        await cur.execute(_DELETE_FEEDBACK, {"user_id": caller.user_id, "message_id": message_id})
    row = await cur.fetchone()
    assert row is not None
    is_answer, deleted = row
    return bool(deleted) if is_answer else None
