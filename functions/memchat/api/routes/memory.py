"""GET/PUT/DELETE /memory: the long-term notes, exactly as the agent reads them."""

from __future__ import annotations

from fastapi import APIRouter

from memchat import store
from memchat.api.deps import AgentQuery, CurrentUser, State
from memchat.api.schemas import NotesBody, NotesDeleted, NotesOut, error_responses
from memchat.errors import PayloadTooLarge

router = APIRouter(tags=["memory"])

_PUT_ERRORS = error_responses(
    400,
    409,
    413,
    422,
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
    limit = state.settings.ltm_max_chars
    if len(body.notes) > limit:
        raise PayloadTooLarge(f"notes are {len(body.notes)} characters; the limit is {limit}.")
    notes = await store.save_notes(
        state.db, caller, body.agent_name, body.notes, body.expected_version
    )
    return _out(notes)


@router.delete("/memory", response_model=NotesDeleted, responses=error_responses(422))
async def delete_memory(
    caller: CurrentUser, state: State, agent_name: AgentQuery = "default"
) -> NotesDeleted:
    """Forget the agent's notes about the caller."""
    return NotesDeleted(deleted=await store.delete_notes(state.db, caller, agent_name))


def _out(notes: store.Notes) -> NotesOut:
    return NotesOut(
        agent_name=notes.agent_name,
        notes=notes.notes,
        version=notes.version,
        updated_at=notes.updated_at.isoformat() if notes.updated_at else None,
    )
