"""The FastAPI app: composes middleware, error handlers and routes."""

from __future__ import annotations

import importlib
import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from memchat import __version__, logs
from memchat.api import deps, errors
from memchat.api.state import AppState
from memchat.config import Settings
from memchat.errors import MemchatError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from starlette.routing import BaseRoute
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("memchat.api")

MAX_BODY_BYTES = 1_000_000
TOO_LARGE = f"The request body is over {MAX_BODY_BYTES} bytes."
# With a 413 the server closes the connection instead of reading the rest of
# the body only to discard it.
CLOSE = {"Connection": "close"}


class BodyLimits:
    """The most bytes a request's body may have: MAX_BODY_BYTES, unless its
    route (method, path) has a cap of its own (a history import's)."""

    def __init__(self, larger: Mapping[tuple[str, str], int] | None = None) -> None:
        self._larger = dict(larger or {})

    def of(self, scope: Scope) -> int:
        return self._larger.get((scope.get("method", ""), scope.get("path", "")), MAX_BODY_BYTES)

    @staticmethod
    def too_large(limit: int) -> str:
        return TOO_LARGE if limit == MAX_BODY_BYTES else f"The request body is over {limit} bytes."


class BodyLimit:
    """Refuses a request body past its limit (`limits`) as it arrives.

    A body with a Content-Length over the limit is refused before it is read
    (request_context); a chunked one has none, so the bytes are counted as the
    app reads them, and the read that passes the limit fails with a 413 (a
    starlette HTTPException: FastAPI re-raises those from its body reading, so
    the error handlers answer it) instead of the whole body being buffered.
    Nothing reads past that point: later reads see the client as gone.
    """

    def __init__(self, app: ASGIApp, limits: BodyLimits | None = None) -> None:
        self.app = app
        self.limits = limits or BodyLimits()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.of(scope)
        received = 0
        responded = False

        async def limited_receive() -> Message:
            nonlocal received
            if received > limit:
                return {"type": "http.disconnect"}  # read no further
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if responded:  # too late for a 413: as if the client had gone
                        return {"type": "http.disconnect"}
                    raise HTTPException(413, BodyLimits.too_large(limit), headers=CLOSE)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal responded
            responded = responded or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited_receive, watched_send)


class RequestContext:
    """Each request's id (X-Request-ID), its one access log line, and a 500
    in the contract's shape for anything unexpected.

    Before anything else (routing, authentication, the body) the query string
    is checked (deps.check_query: too many parameters, a repeated one) and a
    Content-Length over the limit refused: each in linear time, so a request
    that is refused costs little to refuse.

    Plain ASGI, not BaseHTTPMiddleware: a streamed response (SSE, exports)
    reaches the server's own `send` untouched, so its chunks are not relayed
    through another task and a client gone mid-stream is the response's
    business (a streamed chat turn still finishes and is stored). The log
    line (memchat.logs: method, route template, status, duration, request
    id, user id, the client's own request id) comes when the response has
    ended, with its whole duration; every record logged meanwhile carries
    the request id.
    """

    def __init__(self, app: ASGIApp, body_limits: BodyLimits | None = None) -> None:
        self.app = app
        self.body_limits = body_limits or BodyLimits()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request_id = request.state.request_id = _request_id(request)
        request.state.client_request_id = _client_request_id(request)
        started = time.perf_counter()
        status = 0
        client_gone = False

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        with logs.request_scope(request_id):
            try:
                refusal = _refusal(request, self.body_limits.of(scope))
                if refusal is not None:
                    await refusal(scope, receive, send_with_id)
                else:
                    await self.app(scope, receive, send_with_id)
            except ClientDisconnect:
                client_gone = True
            except Exception as exc:
                if status:
                    # Too late for an error response: the client has part of one.
                    errors.error_body(request, exc)  # logged as the handlers would
                else:
                    await errors.unexpected_error(request, exc)(scope, receive, send_with_id)
            finally:
                _log_request(request, status, time.perf_counter() - started, client_gone)


def _refusal(request: Request, body_limit: int) -> Response | None:
    """The answer to a request refused before the app sees it, if it is."""
    try:
        deps.check_query(request.scope.get("query_string", b""))
    except MemchatError as exc:
        return errors.error_response(request, exc.status, exc.code, exc.detail)
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > body_limit:
        detail = BodyLimits.too_large(body_limit)
        return errors.error_response(request, 413, "payload_too_large", detail, CLOSE)
    return None


class RoutesOnDemand:
    """Routes whose module is imported on the first request to their paths,
    not when the app is built: the chat function's cold start pays for
    POST /chat's routes and models only, and /v1, /memory/search and /mcp
    cost their first request about 30 ms instead (docs/benchmarks.md, "The
    chat handler's import against its stack").

    `add(prefix, module)`: the module's `router` serves `prefix` and the
    paths under it, and only those (tests/api/test_routes_on_demand.py holds
    each module to its prefix). The OpenAPI document includes them all first
    (`load_all`), so /openapi.json, the docs and SnapStart's warm-up see and
    build every route: built after errors.install, whose document it wraps.
    """

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._pending: dict[str, str] = {}
        document = app.openapi

        def openapi() -> dict[str, Any]:
            self.load_all()
            return document()

        app.openapi = openapi  # type: ignore[method-assign]

    def add(self, prefix: str, module: str) -> None:
        self._pending[prefix] = module

    @property
    def pending(self) -> dict[str, str]:
        """Prefix -> module of the routes not included yet."""
        return dict(self._pending)

    def load_for(self, path: str) -> None:
        """Includes the routes that may serve `path`, if they are not yet."""
        if not self._pending:  # every request once all are in
            return
        for prefix in [p for p in self._pending if path == p or path.startswith(p + "/")]:
            self._include(prefix)

    def load_all(self) -> None:
        for prefix in list(self._pending):
            self._include(prefix)

    def _include(self, prefix: str) -> None:
        # Synchronous from the lookup to the include: no other request of
        # this event loop runs in between, so a module is included once.
        module = importlib.import_module(self._pending.pop(prefix))
        self._app.include_router(module.router)
        self._app.openapi_schema = None  # built again, with these routes


class LoadRoutes:
    """Includes a request's routes on demand (RoutesOnDemand) before anything
    routes it or names its route; outermost, so a request refused early (a
    413) is logged with its route too."""

    def __init__(self, app: ASGIApp, routes: RoutesOnDemand) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.routes.load_for(scope.get("path", ""))
        await self.app(scope, receive, send)


UNMATCHED = "(unmatched)"  # the route of a request no route matched (a 404)
# A response that says the caller is not authenticated (the token failed, its
# keys could not be fetched, the account is gone): no user id in its line.
_AUTH_FAILED = frozenset({401, 403, 503})


def _log_request(request: Request, status: int, seconds: float, client_gone: bool) -> None:
    """The request's access line: never its path's values, query, body or token."""
    route = _route_of(request.scope)
    fields: dict[str, object] = {
        "method": request.method,
        "route": str(getattr(route, "path", None) or UNMATCHED),
        "status": status,
        "duration_ms": round(seconds * 1000, 2),
        "request_id": errors.request_id_of(request),
        "user_id": _verified_user(request, status),
    }
    client_request_id = getattr(request.state, "client_request_id", None)
    if client_request_id:
        fields["client_request_id"] = client_request_id
    if client_gone:
        fields["client_gone"] = True
    logger.info(logs.ACCESS, extra=fields)


def _route_of(scope: Scope) -> BaseRoute | None:
    """The route that served the request (the router records it), or that
    would have: a request refused before routing (413) still names its route."""
    served: BaseRoute | None = scope.get("route")
    if served is not None:
        return served
    partial = None
    for route in flat_routes(getattr(getattr(scope.get("app"), "router", None), "routes", ())):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route
        if match == Match.PARTIAL and partial is None:
            partial = route
    return partial


def flat_routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, those of included routers too (newer FastAPI keeps an
    included router as one entry; its routes have no prefix here)."""
    for route in routes:
        included = getattr(getattr(route, "original_router", None), "routes", None)
        if included is None:
            yield route
        else:
            yield from flat_routes(included)


def _verified_user(request: Request, status: int) -> str | None:
    """The caller's user id (the token's verified `sub`, kept by
    `deps.current_user`), unless the response says authentication failed."""
    if status in _AUTH_FAILED:
        return None
    user_id = getattr(request.state, deps.USER_ID_STATE, None)
    return str(user_id) if user_id is not None else None


def _request_id(request: Request) -> str:
    """memchat's id for the request: API Gateway's (Lambda's event carries
    it), else a new one. Never the client's X-Request-ID: an id the client
    picks could pose as another request's in the logs, or forge log lines."""
    event = request.scope.get("aws.event") or {}
    from_gateway = (event.get("requestContext") or {}).get("requestId")
    if from_gateway:
        return str(from_gateway)
    return uuid.uuid4().hex


# What a client's own X-Request-ID must look like to be logged at all (as
# `client_request_id`): short, and nothing a log line could be forged with.
CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def _client_request_id(request: Request) -> str | None:
    """The client's X-Request-ID, when it matches CLIENT_REQUEST_ID; else None."""
    supplied = request.headers.get("x-request-id", "")
    return supplied if CLIENT_REQUEST_ID.fullmatch(supplied) else None


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
