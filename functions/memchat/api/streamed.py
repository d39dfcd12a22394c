"""What a streaming function's server serves: its streamed routes, nothing else.

Through API Gateway and mangum a Lambda response is buffered whole (capped
at 6 MB, and at 30 s behind an HTTP API), so what must stream is served from
a function URL in RESPONSE_STREAM mode instead (memchat.handlers.stream):
the exports (route group `export`) and the Server-Sent Events of POST /chat
and POST /v1/chat/completions (`chat`). `StreamedRoutesOnly` wraps the app
so that only those routes (and /health, the adapter's readiness check) are
served there: every other route stays behind API Gateway, with its
throttling and access log, and answers the contract's JSON 404, naming the
base URL that serves it.

Lambda SnapStart: that server is the Lambda Web Adapter's child, out of
reach of the Python runtime's snapshot hooks, so the adapter relays them as
HTTP requests (template.yaml: AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH and
AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH): `POST /_snapstart/before-checkpoint`
warms the app and closes its connections, `POST /_snapstart/after-restore`
drops what must not be shared (memchat.snapstart). Both answer only the
adapter itself: a function-URL request, which the adapter stamps with
`x-amzn-request-context`, gets the 404 any unknown path gets.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path

from memchat.api import errors
from memchat.config import ConfigError

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import Receive, Scope, Send

Route = tuple[str, str]  # (method, path) in the app's route syntax

# What a streaming server serves per route group, in the order the 404 names them.
STREAMED_ROUTES: dict[str, tuple[Route, ...]] = {
    "export": (("GET", "/export"), ("GET", "/chat/export/{session_id}")),
    "chat": (("POST", "/chat"), ("POST", "/v1/chat/completions")),
}
# The base URL (stack output) each group's streamed routes are served from.
URL_NAMES = {"export": "the export URL", "chat": "the chat stream URL"}
# Where a route no streaming server here serves is: the API URL, unless it
# is another streaming server's (the exports are not on the API at all).
ELSEWHERE = {
    "export": "use the export URL",
    "chat": "use the API URL, or the chat stream URL for a streamed answer",
}
# The adapter's readiness check (template.yaml: AWS_LWA_READINESS_CHECK_PATH).
READINESS_PATH = "/health"
# The adapter's SnapStart hooks (template.yaml: AWS_LWA_SNAPSTART_BEFORE_CHECKPOINT_PATH,
# AWS_LWA_SNAPSTART_AFTER_RESTORE_PATH), POSTed by the adapter itself.
BEFORE_CHECKPOINT_PATH = "/_snapstart/before-checkpoint"
AFTER_RESTORE_PATH = "/_snapstart/after-restore"
# The header the adapter adds to every request it relays from the function URL.
RELAYED_HEADER = b"x-amzn-request-context"


def streamed_groups(route_groups: Iterable[str]) -> tuple[str, ...]:
    """The route groups, of those given, that a streaming server serves."""
    given = set(route_groups)
    return tuple(group for group in STREAMED_ROUTES if group in given)


def routes_for(route_groups: Iterable[str]) -> frozenset[Route]:
    """The routes a streaming server with these ROUTE_GROUPS serves (not /health)."""
    return frozenset(r for group in streamed_groups(route_groups) for r in STREAMED_ROUTES[group])


def _patterns(routes: Iterable[Route]) -> list[tuple[str, re.Pattern[str]]]:
    return [(method, compile_path(path)[0]) for method, path in sorted(routes)]


def _matches(patterns: list[tuple[str, re.Pattern[str]]], method: str, path: str) -> bool:
    method = "GET" if method == "HEAD" else method
    return any(m == method and pattern.match(path) for m, pattern in patterns)


def _listed(routes: Iterable[Route]) -> str:
    names = [f"{method} {path}" for method, path in routes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class StreamedRoutesOnly:
    """The app, for its groups' streamed routes and the readiness check only.

    Any other request gets the contract's JSON 404 without reaching the app,
    so the rest of the API cannot be called around API Gateway.
    """

    def __init__(self, app: FastAPI, route_groups: Iterable[str]) -> None:
        self.app = app
        self.groups = streamed_groups(route_groups)
        if not self.groups:
            raise ConfigError(
                "invalid configuration: ROUTE_GROUPS names nothing memchat.handlers.stream"
                f" serves: give it {' or '.join(STREAMED_ROUTES)}"
            )
        own = [route for group in self.groups for route in STREAMED_ROUTES[group]]
        self._served = _patterns([*own, ("GET", READINESS_PATH)])
        self._others = {
            group: _patterns(routes)
            for group, routes in STREAMED_ROUTES.items()
            if group not in self.groups
        }
        where = URL_NAMES[self.groups[0]] if len(self.groups) == 1 else "the stream URL"
        self._here = f"at {where} (only {_listed(own)})"

    def serves(self, method: str, path: str) -> bool:
        return _matches(self._served, method, path)

    def elsewhere(self, method: str, path: str) -> str:
        """Where to send a request this server does not serve."""
        for group, patterns in self._others.items():
            if _matches(patterns, method, path):
                return ELSEWHERE[group]
        return "use the API URL"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.serves(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        if _snapstart_hook(scope):
            await self._snapstart(scope["path"])
            await Response(status_code=204)(scope, receive, send)
            return
        request = Request(scope)
        request.state.request_id = uuid.uuid4().hex
        method, path = request.method, request.url.path
        response = errors.error_response(
            request,
            404,
            "not_found",
            f"There is no endpoint {method} {path} {self._here}: {self.elsewhere(method, path)}.",
            headers={"X-Request-ID": request.state.request_id},
        )
        await response(scope, receive, send)

    async def _snapstart(self, path: str) -> None:
        from memchat import snapstart

        if path == BEFORE_CHECKPOINT_PATH:
            await snapstart.warm_and_close(self.app)
        else:
            snapstart.forget_connections(self.app)


def _snapstart_hook(scope: Scope) -> bool:
    """A SnapStart hook's request from the adapter (never one it relays)."""
    return (
        scope["method"] == "POST"
        and scope["path"] in (BEFORE_CHECKPOINT_PATH, AFTER_RESTORE_PATH)
        and all(name.lower() != RELAYED_HEADER for name, _ in scope["headers"])
    )
