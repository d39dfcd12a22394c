"""The long-term notes as a user edits them: replace, and restore a kept version.

(The model edits them within a chat turn: usecases/conversation.py.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memchat import store
from memchat.errors import NotFound, PayloadTooLarge

if TYPE_CHECKING:
    from memchat.config import Settings


async def replace_notes(
    db: store.Database,
    settings: Settings,
    caller: store.Caller,
    agent_name: str,
    notes: str,
    expected_version: int | None,
) -> store.Notes:
    """Replace the notes (at most LTM_MAX_CHARS: 413); with `expected_version`,
    only if nobody changed them since (409 notes_conflict)."""
    limit = settings.ltm_max_chars
    if len(notes) > limit:
        raise PayloadTooLarge(f"notes are {len(notes)} characters; the limit is {limit}.")
    return await store.save_notes(db, caller, agent_name, notes, expected_version)


async def restore_notes(
    db: store.Database,
    caller: store.Caller,
    agent_name: str,
    version: int,
    expected_version: int | None,
) -> store.Notes:
    """Set the notes back to a kept version's text, as a new version (404 when
    that version is not kept)."""
    notes = await store.restore_notes(db, caller, agent_name, version, expected_version)
    if notes is None:
        raise NotFound(
            f"There is no kept version {version} of agent {agent_name!r}'s notes;"
            " GET /memory/versions lists them."
        )
    return notes
