"""The FastAPI app: composes middleware, error handlers and routes."""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Request
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from memchat import __version__
from memchat.api import deps, errors
from memchat.api.routes import account, chat, clear, export, feedback, health, memory, sessions
from memchat.api.state import AppState
from memchat.config import Settings, get_settings

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("memchat.api")

MAX_BODY_BYTES = 1_000_000
TOO_LARGE = f"The request body is over {MAX_BODY_BYTES} bytes."
# With a 413 the server closes the connection instead of reading the rest of
# the body only to discard it.
CLOSE = {"Connection": "close"}


class BodyLimit:
    """Refuses a request body past `limit` bytes as it arrives.

    A body with a Content-Length over the limit is refused before it is read
    (request_context); a chunked one has none, so the bytes are counted as the
    app reads them, and the read that passes the limit fails with a 413 (a
    starlette HTTPException: FastAPI re-raises those from its body reading, so
    the error handlers answer it) instead of the whole body being buffered.
    Nothing reads past that point: later reads see the client as gone.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received = 0
        responded = False

        async def limited_receive() -> Message:
            nonlocal received
            if received > self.limit:
                return {"type": "http.disconnect"}  # read no further
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    if responded:  # too late for a 413: as if the client had gone
                        return {"type": "http.disconnect"}
                    raise HTTPException(413, TOO_LARGE, headers=CLOSE)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal responded
            responded = responded or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited_receive, watched_send)


class RequestContext:
    """Each request's id (X-Request-ID), its log line, and a 500 in the
    contract's shape for anything unexpected.

    Plain ASGI, not BaseHTTPMiddleware: a streamed response (SSE, exports)
    reaches the server's own `send` untouched, so its chunks are not relayed
    through another task and a client gone mid-stream is the response's
    business (a streamed chat turn still finishes and is stored). The log
    line comes when the response has ended, with its whole duration.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request_id = request.state.request_id = _request_id(request)
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        try:
            length = request.headers.get("content-length")
            if length and length.isdigit() and int(length) > MAX_BODY_BYTES:
                refusal = errors.error_response(request, 413, "payload_too_large", TOO_LARGE, CLOSE)
                await refusal(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            logger.info("client disconnected", extra={"request_id": request_id})
        except Exception as exc:
            if status:
                # Too late for an error response: the client has part of one.
                errors.error_body(request, exc)  # logged as the handlers would
            else:
                await errors.unexpected_error(request, exc)(scope, receive, send_with_id)
        finally:
            logger.info(
                "request",
                extra={
                    "request_id": request_id,
                    "method": request.method,
                    "path": request.url.path,
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                },
            )


def _request_id(request: Request) -> str:
    event = request.scope.get("aws.event") or {}
    from_gateway = (event.get("requestContext") or {}).get("requestId")
    supplied = request.headers.get("x-request-id", "")
    if from_gateway:
        return str(from_gateway)
    if supplied and len(supplied) <= 128 and supplied.isprintable():
        return supplied
    return uuid.uuid4().hex


def create_app(settings: Settings | None = None, state: AppState | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="memchat",
        version=__version__,
        description="Chat with persistent memory: sessions, long-term notes, export, erase.",
        dependencies=[Depends(deps.single_valued_query)],
    )
    app.state.memchat = state or AppState.build(settings)
    errors.install(app)
    # Inside request_context (added before it), so the route reads the body
    # through it directly and its 413 reaches the error handlers.
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    app.add_middleware(RequestContext)

    if settings.cors_allow_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Session-ID", "X-Request-ID"],
            expose_headers=["X-Session-ID", "X-Request-ID", "Content-Disposition"],
        )

    # Only the route groups this process serves (ROUTE_GROUPS); /health always.
    app.include_router(health.router)
    if settings.serves("chat"):
        app.include_router(chat.router)
    if settings.serves("sessions"):
        app.include_router(clear.router)
    if settings.serves("export"):
        app.include_router(export.router)
    if settings.serves("sessions"):
        app.include_router(sessions.router)
        app.include_router(feedback.router)
        app.include_router(memory.router)
        app.include_router(account.router)
    return app
