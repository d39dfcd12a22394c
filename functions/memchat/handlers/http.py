"""The HTTP functions' shared set-up, done once per Lambda instance.

Everything at module scope runs in the init phase: secrets are fetched,
settings validated (a misconfigured function fails here with a message that
names the variable), the app built. Warm invocations reuse its database
connection, the token verifier's keys and the model client.
"""

from __future__ import annotations

from mangum import Mangum

from memchat import observability, secrets
from memchat.api.main import create_app

# Exports are NDJSON or Markdown as well as JSON: send them as text, not base64.
TEXT_MIME_TYPES = ["text/", "application/json", "application/x-ndjson"]

settings = secrets.load_settings()
observability.configure(settings.log_level)
app = create_app(settings)
observability.watch_turns(app.state.memchat.chat)
adapter = Mangum(app, lifespan="off", text_mime_types=TEXT_MIME_TYPES)
handler = observability.http_handler(adapter)
