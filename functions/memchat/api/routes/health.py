"""GET /health: liveness and database reachability (no auth)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from memchat import store
from memchat.api.deps import State
from memchat.errors import DatabaseUnavailable

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(state: State) -> JSONResponse:
    """`{"status": "ok", "database": "ok"}`, or 503 when the database is unreachable."""
    try:
        ok = await store.database_ok(state.db)
    except DatabaseUnavailable:
        ok = False
    if ok:
        return JSONResponse({"status": "ok", "database": "ok"})
    return JSONResponse({"status": "degraded", "database": "unreachable"}, status_code=503)
