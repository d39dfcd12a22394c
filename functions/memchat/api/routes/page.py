"""GET /: a small browser chat page (served by `memchat dev` only, never deployed)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()


@router.get("/", include_in_schema=False)
async def chat_page() -> HTMLResponse:
    return HTMLResponse((files("memchat") / "static" / "chat.html").read_text(encoding="utf-8"))
