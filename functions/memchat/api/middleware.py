"""The app's middleware: each request's id, its access log line and a 500 in
the contract's shape for anything unexpected (RequestContext); the body's
size limit, per route (BodyLimit, BodyLimits)."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import Response
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from memchat import logs
from memchat.api import deps, errors
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
