"""GET/PUT/DELETE /memory: the long-term notes, exactly as the agent reads them."""

from __future__ import annotations

from fastapi import APIRouter

from memchat import store
from memchat.api.deps import AgentQuery, CurrentUser, State
from memchat.api.schemas import ERROR_RESPONSES, NotesBody, NotesDeleted, NotesOut
from memchat.errors import PayloadTooLarge

router = APIRouter(tags=["memory"])

_PUT_ERRORS = {
    **ERROR_RESPONSES,
    409: ERROR_RESPONSES[400] | {"description": "expected_version is not the current version"},
    413: ERROR_RESPONSES[400] | {"description": "Notes longer than LTM_MAX_CHARS"},
}


@router.get("/memory", response_model=NotesOut, responses=ERROR_RESPONSES)
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


@router.delete("/memory", response_model=NotesDeleted, responses=ERROR_RESPONSES)
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
