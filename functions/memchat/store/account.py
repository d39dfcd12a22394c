"""The account: everything a user has, deleted at once (DELETE /me)."""

from __future__ import annotations

from psycopg import sql

from memchat.store.db import Database
from memchat.store.records import Caller
from memchat.throttle import Bucket

# What DELETE /me counts, and the table it deletes from (the memories first:
# the sessions' delete would take those of live sessions uncounted).
_TABLES = {
    "memories": ("memchat", "memories"),
    "messages": ("public", "chat_message_history"),
    "active_sessions": ("public", "user_agent_active_sessions"),
    "sessions": ("public", "chat_sessions"),
    "long_term_memory": ("public", "agent_long_term_memory"),
}


async def delete_user_data(db: Database, caller: Caller) -> dict[str, int]:
    """Delete everything the caller has, in one transaction; returns the counts.

    Notes' versions, embeddings, feedback and queue rows go with what they
    belong to. Turn claims go too; the throttles stay (memchat.throttle):
    deleting must not reset them.
    """
    cursors = {}
    async with db.pipeline(caller.claims, throttle=Bucket.ERASE) as conn:
        for key, table in _TABLES.items():
            cursors[key] = conn.cursor()
            await cursors[key].execute(
                sql.SQL(
                    "with d as (delete from {} where user_id = %s returning 1)"
                    " select count(*) from d"
                ).format(sql.Identifier(*table)),
                (caller.user_id,),
            )
        await conn.execute("delete from memchat.turn_claims where user_id = %s", (caller.user_id,))
    counts = {}
    for key, cur in cursors.items():
        row = await cur.fetchone()
        counts[key] = row[0] if row else 0
    return counts
