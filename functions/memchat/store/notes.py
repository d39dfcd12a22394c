"""Long-term notes: one document per (user, agent), versioned, with kept history."""

from __future__ import annotations

from typing import Any

import psycopg

from memchat.store.db import Database, translate
from memchat.store.records import Caller, Notes, NotesVersion
from memchat.throttle import Bucket

_SAVE_NOTES = "select memchat.save_notes(%s, %s, %s, %s)"
_READ_NOTES = """
select jsonb_build_object('notes', m.notes, 'version', m.version, 'updated_at', m.updated_at)
  from public.agent_long_term_memory m
 where m.user_id = %s and m.agent_name = %s
"""


async def read_notes(db: Database, caller: Caller, agent_name: str) -> Notes:
    """The caller's notes for an agent (version 0 and "" while there are none)."""
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_READ_NOTES, (caller.user_id, agent_name))
    row = await cur.fetchone()
    return Notes.from_json(agent_name, row[0] if row else None)


async def save_notes(
    db: Database,
    caller: Caller,
    agent_name: str,
    notes: str,
    expected_version: int | None = None,
) -> Notes:
    """Replace the notes; with `expected_version`, only if still at that version."""
    _, saved = await _write_notes(
        db, caller, agent_name, _SAVE_NOTES, (caller.user_id, agent_name, notes, expected_version)
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
            await cur.execute(_READ_NOTES, (caller.user_id, agent_name))
    except psycopg.Error as exc:
        raise translate(exc) from exc
    result = await written.fetchone()
    row = await cur.fetchone()
    return (result[0] if result else None), Notes.from_json(agent_name, row[0] if row else None)


_DELETE_NOTES = """
with versions as (
  select count(*) as kept from memchat.notes_versions v
   where v.user_id = %(user_id)s and v.agent_name = %(agent_name)s),
gone as (
  delete from public.agent_long_term_memory m
   where m.user_id = %(user_id)s and m.agent_name = %(agent_name)s
  returning 1)
select (select count(*) from gone), (select kept from versions)
"""


async def delete_notes(db: Database, caller: Caller, agent_name: str) -> tuple[int, int]:
    """Forget the agent's notes about the caller, and their kept versions:
    (notes deleted, 0 or 1; versions deleted, the current one included)."""
    async with db.pipeline(caller.claims, throttle=Bucket.WRITE) as conn:
        cur = conn.cursor()
        await cur.execute(_DELETE_NOTES, {"user_id": caller.user_id, "agent_name": agent_name})
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1]) if row[0] else 0


_NOTES_VERSIONS = """
select v.version, v.notes, v.created_at from memchat.notes_versions v
 where v.user_id = %s and v.agent_name = %s
 order by v.version desc
"""


async def notes_versions(db: Database, caller: Caller, agent_name: str) -> list[NotesVersion]:
    """The kept versions of the caller's notes for an agent, newest (the current) first."""
    async with db.pipeline(caller.claims) as conn:
        cur = conn.cursor()
        await cur.execute(_NOTES_VERSIONS, (caller.user_id, agent_name))
    return [NotesVersion(r[0], r[1], r[2]) for r in await cur.fetchall()]


_RESTORE_NOTES = "select memchat.restore_notes(%s, %s, %s, %s)"


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
        db,
        caller,
        agent_name,
        _RESTORE_NOTES,
        (caller.user_id, agent_name, version, expected_version),
    )
    return restored if version is not None else None
