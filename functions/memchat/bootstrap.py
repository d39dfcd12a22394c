"""The composition root: the one place memchat's parts are put together.

Every entry point gets what it runs from here:

- `lambda_app()`: the API Gateway functions (memchat.handlers.http): the
  settings with this function's secrets fetched (a misconfigured function
  fails here, naming the variable), the logs, the app with only its
  ROUTE_GROUPS' routes, each turn observed for metrics;
- `stream_app()`: the streaming functions' server (memchat.handlers.stream):
  the same app, behind the streamed-routes-only guard (memchat.api.streamed);
- `dev_app(settings)`: `memchat dev`: the app and the chat page at /;
- `app(settings)`: the app for settings as they are (the tests);
- `summarizer(settings)`: the rolling summary worker;
- `embedder(settings)`: the embedding backfill (`memchat db reembed`);
- `worker(settings)`: both, sharing a connection and the model client, run
  one after the other (the SummaryFunction, `memchat summarize`, `memchat
  dev`'s background worker);
- `cleanup(settings)`: the TTL cleanup (its function, `memchat cleanup`).

The app's parts, for one process: `services(settings)` (the database, the
token verifier, and where chat is served the model client and the chat use
case). Nothing here does I/O but the settings' secrets and, where asked,
the check that the database's embeddings fit EMBEDDING_DIMENSIONS.

What the first request needs but building the app does not (PyJWT, the
openai SDK, the tokenizer) is left to first use, so a cold start pays only
for the stack (docs/benchmarks.md); with Lambda SnapStart it is all made
before the snapshot (memchat.snapstart).
"""

from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from fastapi import FastAPI

    from memchat.api.state import AppState
    from memchat.api.streamed import StreamedRoutesOnly
    from memchat.config import Settings
    from memchat.model.client import ModelClient
    from memchat.store.db import Database
    from memchat.usecases.backfill import Embedder
    from memchat.usecases.chat import ChatResult
    from memchat.usecases.cleanup import Cleanup
    from memchat.usecases.summarize import Summarizer

# FastAPI imports `pydantic.v1` as it creates each route, only to refuse
# pydantic v1 models; neither memchat nor anything it deploys has one. Marked
# absent (None in sys.modules: an import of it raises ModuleNotFoundError,
# which FastAPI takes as "no pydantic v1 here"), its import is left out of
# every cold start (docs/benchmarks.md). Only a module not loaded yet is marked.
UNUSED_MODULES = ("pydantic.v1",)


def services(settings: Settings) -> AppState:
    """What the app holds for its lifetime, for these settings."""
    from memchat.api.state import AppState
    from memchat.auth import TokenVerifier
    from memchat.model.client import ModelClient
    from memchat.store.db import Database, RequestLimits
    from memchat.usecases.chat import ChatService

    db = Database(
        settings.database_url, settings.db_max_connections, RequestLimits.from_settings(settings)
    )
    state = AppState(settings=settings, db=db, verifier=TokenVerifier(settings))
    if settings.serves("chat"):
        state.model = ModelClient.for_settings(settings)
        state.chat_service = ChatService(db=db, model=state.model, settings=settings)
    return state


def app(
    settings: Settings,
    *,
    on_turn: Callable[[ChatResult], None] | None = None,
    check_recall: bool = False,
) -> FastAPI:
    """The app for `settings`: `on_turn` hears every answered turn; with
    `check_recall`, a database whose embeddings do not fit
    EMBEDDING_DIMENSIONS refuses to start (ConfigError)."""
    from memchat.api.main import create_app

    state = services(settings)
    if state.chat_service is not None:
        state.chat_service.on_turn = on_turn
        if check_recall:
            state.chat_service.recall.check_at_start()
    return create_app(settings, state)


def lambda_app() -> FastAPI:
    """The app of a deployed HTTP function, once per instance (at import)."""
    # What the init phase makes (modules, classes, the app) lives as long as
    # the instance, so the collector is off while it is made: each automatic
    # collection would walk the whole growing heap to find almost nothing
    # (docs/benchmarks.md, "The chat handler's import against its stack").
    # Then it is frozen (gc.freeze: no collection at cold start), out of every
    # later collection's way; a full one then walks only what requests made
    # since (SnapStart's warm-up collects and freezes again, memchat.snapstart).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        from memchat import observability, secrets

        for name in UNUSED_MODULES:
            sys.modules.setdefault(name, None)  # type: ignore[arg-type]
        settings = secrets.load_settings()
        observability.configure(settings.log_level)
        built = app(settings, on_turn=observability.record_turn, check_recall=True)
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
    return built


def stream_app() -> StreamedRoutesOnly:
    """The app of a streaming function, behind the streamed-routes-only guard.

    No handler wraps its requests (uvicorn serves them), so each turn
    flushes its own metrics (one EMF log line per turn) and stdout, a pipe
    to the adapter that `print` (how Powertools writes them) would leave the
    line in. Every turn counts tokens: the tokenizer is built now, at
    start-up, which the adapter waits for, rather than by the first turn.
    """
    from memchat import observability
    from memchat.api.streamed import StreamedRoutesOnly

    served = lambda_app()
    settings: Settings = served.state.memchat.settings
    guarded = StreamedRoutesOnly(served, settings.route_groups)
    if settings.serves("chat"):
        chat = served.state.memchat.chat

        def on_turn(result: ChatResult) -> None:
            observability.record_turn(result)
            if observability.metrics.metric_set:
                observability.metrics.flush_metrics()
                sys.stdout.flush()

        chat.on_turn = on_turn
        from memchat.model.tokens import counter_for_model

        counter_for_model(settings.openai_model)
    return guarded


def dev_app(settings: Settings) -> FastAPI:
    """What `memchat dev` serves: the whole API for `settings`, its recall
    checked (ConfigError), and the chat page at /."""
    from memchat.api.routes import page

    served = app(settings, check_recall=True)
    page.install(served)
    return served


def summarizer(settings: Settings) -> Summarizer:
    """The rolling summary worker for `settings` (DATABASE_URL: the memchat_worker role's)."""
    from memchat.usecases.summarize import Summarizer

    db, model = _worker_parts(settings)
    return Summarizer(db=db, model=model, settings=settings)


def embedder(settings: Settings) -> Embedder:
    """The embedding backfill for `settings` (DATABASE_URL: the memchat_worker
    role's, or the owner's for `memchat db reembed`)."""
    from memchat.usecases.backfill import Embedder

    db, model = _worker_parts(settings)
    return Embedder(db=db, model=model, settings=settings)


def worker(settings: Settings) -> tuple[Summarizer, Embedder]:
    """The summary worker and the embedding backfill, to run one after the
    other, on one connection pool and one model client (closing either closes
    both)."""
    from memchat.usecases.backfill import Embedder
    from memchat.usecases.summarize import Summarizer

    db, model = _worker_parts(settings)
    return (
        Summarizer(db=db, model=model, settings=settings),
        Embedder(db=db, model=model, settings=settings),
    )


def _worker_parts(settings: Settings) -> tuple[Database, ModelClient]:
    from memchat.model.client import ModelClient
    from memchat.store.db import Database

    db = Database(settings.database_url, settings.db_max_connections)
    return db, ModelClient.for_settings(settings)


def cleanup(settings: Settings) -> Cleanup:
    """The TTL cleanup as configured: DATABASE_URL (the memchat_cleanup role's),
    CLEANUP_BATCH_SIZE, CLEANUP_PAUSE_FACTOR, MEMORY_RETENTION_DAYS."""
    from memchat.usecases.cleanup import Cleanup

    return Cleanup(
        settings.database_url,
        batch_size=settings.cleanup_batch_size,
        pause_factor=settings.cleanup_pause_factor,
        memory_retention_days=settings.memory_retention_days,
    )
