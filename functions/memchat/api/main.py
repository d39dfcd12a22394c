"""The FastAPI app: composes middleware (api/middleware.py), error handlers,
and the routes (some imported on their first request: api/on_demand.py)."""

from __future__ import annotations

from fastapi import FastAPI

from memchat import __version__
from memchat.api import errors
from memchat.api.middleware import BodyLimit, BodyLimits, RequestContext
from memchat.api.on_demand import LoadRoutes, RoutesOnDemand
from memchat.api.state import AppState
from memchat.config import Settings


def create_app(settings: Settings, state: AppState) -> FastAPI:
    """The FastAPI app over `state` (memchat.bootstrap builds both)."""
    app = FastAPI(
        title="memchat",
        version=__version__,
        description="Chat with persistent memory: sessions, long-term notes, export, erase.",
        # /docs is docs.install's (Swagger UI's files served here, no CDN); no ReDoc.
        docs_url=None,
        redoc_url=None,
    )
    from memchat.api import docs

    docs.install(app)
    app.state.memchat = state
    errors.install(app)
    on_demand = RoutesOnDemand(app)
    limits = BodyLimits()
    if settings.serves("sessions"):
        from memchat.api.routes import imports

        # A history import's body is larger than any other request's: its own cap.
        limits = BodyLimits({route: settings.import_max_bytes for route in imports.LARGE_BODIES})
    # Inside request_context (added before it), so the route reads the body
    # through it directly and its 413 reaches the error handlers.
    app.add_middleware(BodyLimit, limits=limits)

    app.add_middleware(RequestContext, body_limits=limits)

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
    # Only their modules are imported: a cold start pays for no other group's.
    from memchat.api.routes import health

    app.include_router(health.router)
    if settings.serves("chat"):
        from memchat.api.routes import chat

        app.include_router(chat.router)
        # Served here too, each imported on its first request (RoutesOnDemand).
        on_demand.add("/memory/search", "memchat.api.routes.search")
        on_demand.add("/memories", "memchat.api.routes.memories")  # durable memory
        on_demand.add("/v1", "memchat.api.routes.completions")  # OpenAI-compatible
        on_demand.add("/mcp", "memchat.api.routes.mcp")  # memory as MCP tools
    if settings.serves("sessions"):
        from memchat.api.routes import clear

        app.include_router(clear.router)
    if settings.serves("export"):
        from memchat.api.routes import export

        app.include_router(export.router)
    if settings.serves("sessions"):
        from memchat.api.routes import account, feedback, imports, memory, sessions, stats

        app.include_router(sessions.router)
        app.include_router(imports.router)
        app.include_router(feedback.router)
        app.include_router(stats.router)
        app.include_router(memory.router)
        app.include_router(account.router)
    # Outermost (added last): the routes are there before anything looks for them.
    app.add_middleware(LoadRoutes, routes=on_demand)
    return app
