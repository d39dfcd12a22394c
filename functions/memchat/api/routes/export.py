"""GET /chat/export/{session_id} and GET /export: downloads, streamed."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse

from memchat.api.deps import CurrentUser, State
from memchat.api.schemas import UuidText, error_responses, parse_session_id
from memchat.usecases.export import Export, ExportFormat, export_account, export_session

router = APIRouter(tags=["export"])

FormatQuery = Annotated[
    ExportFormat, Query(alias="format", description="json (default), ndjson or markdown.")
]

_DOWNLOAD: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The export, streamed as a download",
        "content": {f.media_type: {} for f in ExportFormat},
    }
}


@router.get(
    "/chat/export/{session_id}",
    response_class=StreamingResponse,
    responses={**_DOWNLOAD, **error_responses(400, 404, 422, 429)},
)
async def export_one_session(
    session_id: Annotated[UuidText, Path(description="The session's id.")],
    caller: CurrentUser,
    state: State,
    fmt: FormatQuery = ExportFormat.JSON,
) -> StreamingResponse:
    """One session with all its messages, oldest first."""
    parsed = parse_session_id(session_id)
    assert parsed is not None
    return _download(await export_session(state.db, caller, parsed, fmt))


@router.get(
    "/export",
    response_class=StreamingResponse,
    responses={**_DOWNLOAD, **error_responses(422, 429)},
)
async def export_everything(
    caller: CurrentUser, state: State, fmt: FormatQuery = ExportFormat.JSON
) -> StreamingResponse:
    """Everything the caller has: sessions with messages, active sessions, notes."""
    return _download(await export_account(state.db, caller, fmt))


def _download(export: Export) -> StreamingResponse:
    return StreamingResponse(
        export.chunks,
        media_type=export.media_type,
        headers={
            "Content-Disposition": f'attachment; filename="{export.filename}"',
            "Cache-Control": "no-store",
        },
    )
