"""The per-instance set-up both HTTP entry points share.

`build_app()` fetches the secrets this function's ROUTE_GROUPS need,
validates the settings (a misconfigured function fails here with a message
that names the variable; so does an EMBEDDING_DIMENSIONS the database's
embedding column does not have), configures the logs and builds the app with
only those route groups. It runs once per Lambda instance: at import in
`memchat.handlers.http` (mangum, behind API Gateway) and at start-up in
`memchat.handlers.stream` (uvicorn, behind the Lambda Web Adapter). Importing
this module does nothing by itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memchat import observability, secrets
from memchat.api.main import create_app

if TYPE_CHECKING:
    from fastapi import FastAPI


def build_app() -> FastAPI:
    settings = secrets.load_settings()
    observability.configure(settings.log_level)
    app = create_app(settings)
    if settings.serves("chat"):
        chat = app.state.memchat.chat
        chat.on_turn = observability.record_turn
        chat.recall.check_at_start()
        # Every turn counts tokens; the tokenizer takes ~50 ms to build, paid
        # here in the init phase rather than by the first user's turn.
        from memchat.model.tokens import counter_for_model

        counter_for_model(settings.openai_model)
    return app
