"""GET/PUT/DELETE /memory: the long-term notes, exactly as the agent reads them;
GET /memory/versions and POST /memory/restore: their kept versions, an undo."""

from __future__ import annotations

from fastapi import APIRouter

from memchat import store
from memchat.api.deps import AgentQuery, CurrentUser, State
from memchat.api.schemas import error_responses
from memchat.api.schemas.memory import (
    NotesBody,
    NotesDeleted,
    NotesOut,
    NotesVersionOut,
    NotesVersions,
    RestoreNotesBody,
)
from memchat.usecases.notes import replace_notes, restore_notes

router = APIRouter(tags=["memory"])

_PUT_ERRORS = error_responses(
    400,
    409,
    413,
    422,
    429,
    descriptions={
        400: "The body is not valid JSON (`invalid_json`)",
        409: "expected_version is not the current version (`notes_conflict`)",
        413: "Notes longer than LTM_MAX_CHARS, or body over 1 MB (`payload_too_large`)",
    },
)


@router.get("/memory", response_model=NotesOut, responses=error_responses(422))
async def read_memory(
    caller: CurrentUser, state: State, agent_name: AgentQuery = "default"
) -> NotesOut:
    """The agent's notes about the caller ("" and version 0 when there are none)."""
    return _out(await store.read_notes(state.db, caller, agent_name))


@router.put("/memory", response_model=NotesOut, responses=_PUT_ERRORS)
async def replace_memory(body: NotesBody, caller: CurrentUser, state: State) -> NotesOut:
    """Replace the notes; with expected_version, only if nobody changed them since."""
    notes = await replace_notes(
        state.db, state.settings, caller, body.agent_name, body.notes, body.expected_version
    )
    return _out(notes)


@router.delete("/memory", response_model=NotesDeleted, responses=error_responses(422, 429))
async def delete_memory(
    caller: CurrentUser, state: State, agent_name: AgentQuery = "default"
) -> NotesDeleted:
    """Forget the agent's notes about the caller, with their earlier versions:
    how many of each were deleted."""
    deleted, versions = await store.delete_notes(state.db, caller, agent_name)
    return NotesDeleted(deleted=deleted, versions_deleted=versions)


@router.get("/memory/versions", response_model=NotesVersions, responses=error_responses(422))
async def memory_versions(
    caller: CurrentUser, state: State, agent_name: AgentQuery = "default"
) -> NotesVersions:
    """The notes' kept versions (the last 20 by default), newest first: what
    to restore when the notes were changed by mistake (or by the model, talked
    into it)."""
    versions = await store.notes_versions(state.db, caller, agent_name)
    return NotesVersions(
        agent_name=agent_name,
        versions=[
            NotesVersionOut(
                version=v.version,
                notes=v.notes,
                created_at=v.created_at.isoformat(),
                current=i == 0,
            )
            for i, v in enumerate(versions)
        ],
    )


_RESTORE_ERRORS = error_responses(
    400,
    404,
    409,
    413,
    422,
    429,
    descriptions={
        404: "No such kept version (`not_found`)",
        409: "expected_version is not the current version (`notes_conflict`)",
    },
)


@router.post("/memory/restore", response_model=NotesOut, responses=_RESTORE_ERRORS)
async def restore_memory(body: RestoreNotesBody, caller: CurrentUser, state: State) -> NotesOut:
    """Set the notes back to a kept version's text, as a new version (so the
    restore can be undone too)."""
    notes = await restore_notes(
        state.db, caller, body.agent_name, body.version, body.expected_version
    )
    return _out(notes)


def _out(notes: store.Notes) -> NotesOut:
    return NotesOut(
        agent_name=notes.agent_name,
        notes=notes.notes,
        version=notes.version,
        updated_at=notes.updated_at.isoformat() if notes.updated_at else None,
    )
