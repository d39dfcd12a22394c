"""GET /health: liveness and database reachability (no auth)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from memchat import store
from memchat.api.deps import State
from memchat.api.schemas import HealthOut, error_responses
from memchat.errors import DatabaseUnavailable

router = APIRouter(tags=["health"])


@router.get(
    "/health",
    response_model=HealthOut,
    responses={
        400: error_responses()[400],
        503: {"model": HealthOut, "description": "The database is unreachable"},
    },
)
async def health(state: State) -> HealthOut | JSONResponse:
    """`{"status": "ok", "database": "ok"}`, or 503 when the database is unreachable."""
    try:
        ok = await store.database_ok(state.db)
    except DatabaseUnavailable:
        ok = False
    if ok:
        return HealthOut(status="ok", database="ok")
    degraded = HealthOut(status="degraded", database="unreachable")
    return JSONResponse(degraded.model_dump(), status_code=503)
