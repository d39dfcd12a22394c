"""Routes imported on their first request (RoutesOnDemand, LoadRoutes), so
a function's cold start pays only for the routes it serves first."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import ASGIApp, Receive, Scope, Send


class RoutesOnDemand:
    """Routes whose module is imported on the first request to their paths,
    not when the app is built: the chat function's cold start pays for
    POST /chat's routes and models only, and /v1, /memory/search and /mcp
    cost their first request their import instead (docs/benchmarks.md, "The
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
