"""GET /: a small browser chat page, and its icon (served by `memchat dev`
only, never deployed); on that server a 401 says where a token comes from."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from memchat.api import errors
from memchat.errors import Unauthorized

router = APIRouter()

# What a 401 from the local server adds: there is no Supabase to sign in to.
LOCAL_HINT = "get a new one with `memchat token`"


def _static(name: str) -> str:
    return (files("memchat") / "static" / name).read_text(encoding="utf-8")


@router.get("/", include_in_schema=False)
async def chat_page() -> HTMLResponse:
    return HTMLResponse(_static("chat.html"))


@router.get("/favicon.ico", include_in_schema=False)
@router.get("/favicon.svg", include_in_schema=False)
async def favicon() -> Response:
    """The page's icon (browsers ask for /favicon.ico whatever the page says)."""
    return Response(
        _static("favicon.svg"),
        media_type="image/svg+xml",
        headers={"Cache-Control": "max-age=86400"},
    )


def local_detail(detail: str) -> str:
    """A 401's detail on the local server: "sign in again" (there is nothing
    to sign in to) becomes `memchat token`; any other detail says it too."""
    if "sign in again" in detail:
        return detail.replace("sign in again", LOCAL_HINT)
    return f"{detail.rstrip('.')}; locally, {LOCAL_HINT}."


async def _local_unauthorized(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Unauthorized)
    body = errors.error_body(request, exc)
    body["detail"] = local_detail(body["detail"])
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


def install(app: FastAPI) -> None:
    """The page and its icon on `app` (the dev server's), and its 401s
    pointing at `memchat token`."""
    app.include_router(router)
    app.add_exception_handler(Unauthorized, _local_unauthorized)
