"""Lambda SnapStart (docs/snapstart.md): what an instance does before its
snapshot and after a restore. Lambda runs the init phase once, when
a version is published, snapshots the initialised microVM and starts every
new instance of that version from the snapshot instead of importing the
handler again. What the init phase leaves in memory is then shared by every
instance restored from it; so:

- **before the snapshot** (`before_snapshot`) the app is warmed, so that the
  first request after a restore finds the work done: the modules the request
  path imports on first use (PyJWT and `cryptography`, the openai SDK and its
  HTTP library, the embedding helpers), the tokenizer of OPENAI_MODEL, the
  OpenAPI document (every pydantic model's JSON schema), and a few requests
  through the app (one without a token, one with a malformed token: FastAPI's,
  pydantic's and the error handlers' first-call work; GET /health: the first
  database connection's). Then every connection is closed, so no socket is in
  the snapshot, and the heap is collected and frozen (`gc.freeze`), so that
  no collection after a restore walks what the snapshot holds. Nothing here
  fails the snapshot: a step that fails is logged (its exception's type
  only) and skipped.
- **after a restore** (`after_restore`) what must not be shared is made
  afresh: `random` is reseeded (it was seeded when imported, before the
  snapshot, and would draw the same numbers in every instance); the database
  connections, the model's SDK client (its connection pool) and the token
  verifier's cached key set (with its lifespan and cooldown timers) are
  dropped, and each is made again by the first request that needs it.

The hooks are registered with the Python runtime's `snapshot_restore_py`,
which exists only inside Lambda (python3.12 and later). Elsewhere this module
records them itself and `run_before_snapshot()` / `run_after_restore()` run
them as the runtime would (before the snapshot: the reverse order of
registration; after a restore: the order of registration): the tests do, and
so can a person checking what the hooks do (docs/snapstart.md). Without
SnapStart the hooks are registered and never run: nothing changes.

`install(app)` registers them for an app: `memchat.handlers.http` (the API
Gateway functions) does at import. The streaming functions' server runs
behind the Lambda Web Adapter, in a process of its own that the runtime's
hooks never reach; it serves the same two steps as HTTP hooks the adapter
calls (`warm_and_close`, `forget_connections`; memchat.api.streamed).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import Message

    from memchat.api.state import AppState
    from memchat.config import RouteGroup

logger = logging.getLogger(__name__)

Hook = tuple[Callable[..., object], tuple[Any, ...], dict[str, Any]]
RUNTIME_MODULE = "snapshot_restore_py"
# The X-Request-ID of the warm-up requests: their access lines carry it as
# client_request_id.
WARM_UP_REQUEST_ID = "snapstart-warm-up"

_before_snapshot: list[Hook] = []
_after_restore: list[Hook] = []


def _runtime() -> Any:
    """The runtime's hook registry (`snapshot_restore_py`), or None outside Lambda."""
    try:
        return importlib.import_module(RUNTIME_MODULE)
    except ImportError:
        return None


def register_before_snapshot(func: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    """Run `func(*args, **kwargs)` before Lambda takes the snapshot."""
    _before_snapshot.append((func, args, kwargs))
    runtime = _runtime()
    if runtime is not None:
        runtime.register_before_snapshot(func, *args, **kwargs)


def register_after_restore(func: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    """Run `func(*args, **kwargs)` when Lambda restores an instance from the snapshot."""
    _after_restore.append((func, args, kwargs))
    runtime = _runtime()
    if runtime is not None:
        runtime.register_after_restore(func, *args, **kwargs)


def run_before_snapshot() -> None:
    """Run the before-snapshot hooks as the runtime does: last registered first."""
    for func, args, kwargs in reversed(_before_snapshot):
        func(*args, **kwargs)


def run_after_restore() -> None:
    """Run the after-restore hooks as the runtime does: in the order registered."""
    for func, args, kwargs in _after_restore:
        func(*args, **kwargs)


def registered_hooks() -> tuple[list[Hook], list[Hook]]:
    """(before-snapshot hooks, after-restore hooks), in the order registered."""
    return list(_before_snapshot), list(_after_restore)


def install(app: FastAPI) -> None:
    """Register the SnapStart hooks for this app (once per process: at the handler's import)."""
    register_before_snapshot(before_snapshot, app)
    register_after_restore(after_restore, app)


def before_snapshot(app: FastAPI) -> None:
    """The runtime's before-snapshot hook: warm the app, then close its connections."""
    _run(warm_and_close(app))


def after_restore(app: FastAPI) -> None:
    """The runtime's after-restore hook: nothing shared from the snapshot is reused."""
    forget_connections(app)


async def warm_and_close(app: FastAPI) -> None:
    """Warm what a first request would pay for, then close every connection."""
    state: AppState = app.state.memchat
    try:
        _warm_imports(state)
        await _step("openapi", _openapi, app)
        await _warm_requests(app, state)
    finally:
        # Nothing connected may be in the snapshot (each step may have connected).
        await _step("close", state.close)
    # The warm-up's garbage collected, everything left frozen (gc.freeze): a
    # restored instance's collections walk only what its requests make, not
    # the warm-up's heap as well.
    gc.collect()
    gc.freeze()
    logger.info("warmed for the SnapStart snapshot: connections closed, heap frozen")


def forget_connections(app: FastAPI) -> None:
    """Re-seed `random`; drop the connections, HTTP clients and cached keys."""
    # Seeded from os.urandom when imported, i.e. before the snapshot.
    random.seed()
    state: AppState = app.state.memchat
    state.db.reset()
    state.verifier.reset()
    if state.model is not None:
        state.model.reset()
    logger.info("restored from a SnapStart snapshot: connections and clients reset")


def _warm_imports(state: AppState) -> None:
    """Import now what the request path imports on first use, and build the tokenizer."""
    from memchat import store

    modules = ["jwt"]  # the token check (memchat.auth imports it on first use)
    # The store's modules load on first use too (memchat.store).
    modules += [f"memchat.store.{name}" for name in sorted(store.SUBMODULES)]
    if state.model is not None:
        # The model client (memchat.model.client imports these on first use).
        modules += ["openai", "httpx2", "memchat.model.embeddings"]
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            logger.warning("warm-up skipped", extra={"step": name, "error": type(exc).__name__})
    if state.model is not None:
        from memchat.model.tokens import counter_for_model

        # Every turn counts tokens: build the tokenizer once, here.
        counter_for_model(state.settings.openai_model)


def _openapi(app: FastAPI) -> None:
    app.openapi()  # every route's pydantic JSON schemas, kept by the app


# Per route group, a route that needs a token (refused here: none is valid).
_AUTHENTICATED_ROUTES: dict[RouteGroup, tuple[str, str, bytes]] = {
    "chat": ("POST", "/chat", b'{"message": "warm-up"}'),
    "sessions": ("GET", "/sessions", b""),
    "export": ("GET", "/export", b""),
}


async def _warm_requests(app: FastAPI, state: AppState) -> None:
    """A few requests through the app that store nothing and need no user."""
    for group, (method, path, body) in _AUTHENTICATED_ROUTES.items():
        if state.settings.serves(group):
            await _step("no token", _request, app, method, path, body, None)
            await _step("malformed token", _request, app, method, path, body, "not-a-token")
            break
    # The first database connection (libpq, TLS); closed again by the caller.
    await _step("health", _request, app, "GET", "/health", b"", None)


async def _request(app: FastAPI, method: str, path: str, body: bytes, token: str | None) -> int:
    """One request through the ASGI app, in-process; its status."""
    headers = [(b"x-request-id", WARM_UP_REQUEST_ID.encode())]
    if body:
        headers += [(b"content-type", b"application/json")]
        headers += [(b"content-length", str(len(body)).encode())]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "https",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 0),
        "server": ("localhost", 443),
    }
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    status = 0

    async def receive() -> Message:
        return pending.pop() if pending else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    await app(scope, receive, send)
    return status


async def _step(name: str, func: Callable[..., object], *args: Any) -> None:
    """Run one warm-up step; a failure is logged (its type, never its message) and skipped."""
    try:
        result = func(*args)
        if isinstance(result, Awaitable):
            await result
    except Exception as exc:
        logger.warning("warm-up step failed", extra={"step": name, "error": type(exc).__name__})


def _run(coroutine: Awaitable[None]) -> None:
    """Run a coroutine from the runtime's (synchronous) hook, on a loop of its own:
    the thread's current loop, which mangum runs the requests on, is left as it is."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(coroutine)
    finally:
        loop.close()
