"""The HTTP functions' shared set-up, done once per Lambda instance.

Everything at module scope runs in the init phase: secrets are fetched,
settings validated (a misconfigured function fails here with a message that
names the variable), the app built. Warm invocations reuse its database
connection, the token verifier's keys and the model client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mangum import Mangum

from memchat import observability, secrets
from memchat.api.main import create_app

if TYPE_CHECKING:
    from mangum.types import LambdaContext

# Exports are NDJSON or Markdown as well as JSON: send them as text, not base64.
TEXT_MIME_TYPES = ["text/", "application/json", "application/x-ndjson"]

settings = secrets.load_settings()
observability.configure(settings.log_level)
app = create_app(settings)
app.state.memchat.chat.on_turn = observability.record_turn
adapter = Mangum(app, lifespan="off", text_mime_types=TEXT_MIME_TYPES)


@observability.http_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return adapter(event, context)
