"""The caller's stats: counts over their sessions' counters and feedback."""

from __future__ import annotations

import uuid
from typing import Any

from memchat.store.db import Database
from memchat.store.records import Caller
from memchat.throttle import Bucket


async def chat_stats(db: Database, caller: Caller, agent_name: str | None) -> dict[str, Any]:
    """The caller's stats (memchat.chat_stats): one statement over their
    sessions' counters and their feedback, never their messages."""
    async with db.pipeline(caller.claims, throttle=Bucket.READ) as conn:
        cur = conn.cursor()
        await cur.execute("select memchat.chat_stats(%s, %s)", (caller.user_id, agent_name))
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
        await cur.execute("select memchat.session_stats(%s, %s)", (caller.user_id, session_id))
    row = await cur.fetchone()
    return row[0] if row and row[0] is not None else None
