"""The FastAPI app: composes middleware, error handlers and routes."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response

from memchat import __version__
from memchat.api import errors
from memchat.api.routes import account, chat, clear, export, health, memory, sessions
from memchat.api.state import AppState
from memchat.config import Settings, get_settings

logger = logging.getLogger("memchat.api")

MAX_BODY_BYTES = 1_000_000


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
    )
    app.state.memchat = state or AppState.build(settings)
    errors.install(app)

    @app.middleware("http")
    async def request_context(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        request.state.request_id = _request_id(request)
        started = time.perf_counter()
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > MAX_BODY_BYTES:
            response: Response = errors.error_response(
                request,
                413,
                "payload_too_large",
                f"The request body is over {MAX_BODY_BYTES} bytes.",
            )
        else:
            try:
                response = await call_next(request)
            except Exception as exc:
                response = errors.unexpected_error(request, exc)
        response.headers["X-Request-ID"] = request.state.request_id
        logger.info(
            "request",
            extra={
                "request_id": request.state.request_id,
                "method": request.method,
                "path": request.url.path,
                "status": response.status_code,
                "duration_ms": round((time.perf_counter() - started) * 1000, 2),
            },
        )
        return response

    if settings.cors_allow_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Session-ID", "X-Request-ID"],
            expose_headers=["X-Session-ID", "X-Request-ID", "Content-Disposition"],
        )

    app.include_router(health.router)
    app.include_router(chat.router)
    app.include_router(clear.router)
    app.include_router(export.router)
    app.include_router(sessions.router)
    app.include_router(memory.router)
    app.include_router(account.router)
    return app
