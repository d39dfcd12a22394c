"""POST /sessions/import: conversations from a file; GET /sessions/import/status:
whether recall sees them yet (and what one import may hold)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from memchat import store
from memchat.api import errors
from memchat.api.deps import AgentQuery, CurrentUser, State
from memchat.api.schemas import error_responses
from memchat.api.schemas.imports import (
    REQUEST_BODY,
    ImportLimitsOut,
    ImportOut,
    ImportStatusOut,
)
from memchat.errors import BadRequest, RateLimited
from memchat.usecases import history_import

router = APIRouter(tags=["sessions"])

IMPORT_PATH = "/sessions/import"
# The routes whose body may be IMPORT_MAX_BYTES, not 1 MB (api/middleware.py's BodyLimits).
LARGE_BODIES = (("POST", IMPORT_PATH),)


class InvalidJson(BadRequest):
    code = "invalid_json"
    detail = "The request body is not valid JSON."


_IMPORT_ERRORS = error_responses(
    400,
    413,
    422,
    429,
    descriptions={
        400: "The body is not valid JSON (`invalid_json`)",
        413: "Body over IMPORT_MAX_BYTES, more sessions than IMPORT_MAX_SESSIONS, a session"
        " over IMPORT_MAX_MESSAGES_PER_SESSION, or a message or notes over their limit"
        " (`payload_too_large`, naming it); more messages than the caller may store"
        " (`quota_exceeded`, USER_MAX_STORED_MESSAGES)",
        429: "Out of `import` tokens (`rate_limited`): refused before the body is read",
        422: "A malformed record (`validation_error`, naming it)",
    },
)


@router.post(
    IMPORT_PATH,
    response_model=ImportOut,
    responses=_IMPORT_ERRORS,
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def import_sessions(
    request: Request, caller: CurrentUser, state: State, agent_name: AgentQuery = "default"
) -> ImportOut:
    """Import conversations with their original times (sessions that name no
    agent: agent_name); sessions the caller has already are skipped, so the
    same request sent again stores nothing twice."""
    # The token first: a throttled request is refused before its body is read.
    try:
        limits = await store.start_import(state.db, caller)
    except RateLimited as exc:
        exc.body_unread = True
        raise
    body = await request.body()
    try:
        document = await history_import.read_body(body)
    except history_import.NotJson as exc:
        raise (
            InvalidJson(errors.not_utf8_detail(body)) if exc.not_utf8 else InvalidJson()
        ) from None
    result = await history_import.import_history(
        state.db, state.settings, caller, document, limits, agent_name
    )
    return ImportOut.of(result)


@router.get(f"{IMPORT_PATH}/status", response_model=ImportStatusOut, responses=error_responses())
async def import_status(caller: CurrentUser, state: State) -> ImportStatusOut:
    """How many of the caller's messages wait for an embedding (recall finds
    a message once it has one), how many the backfill gave up on, and what
    one import may hold."""
    backlog = await store.embedding_backlog(state.db, caller)
    return ImportStatusOut(
        embeddings_pending=backlog.pending,
        embeddings_failed=backlog.failed,
        recall_ready=backlog.recall_ready,
        limits=ImportLimitsOut.of(state.settings),
    )
