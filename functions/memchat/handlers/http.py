"""The API Gateway functions' entry point, set up once per Lambda instance.

Everything at module scope runs in the init phase: `build_app()` fetches the
secrets, validates the settings (a misconfigured function fails here with a
message that names the variable) and builds the app. Warm invocations reuse
its database connection, the token verifier's keys and the model client.

With Lambda SnapStart the init phase runs once per published version and
new instances start from its snapshot: the hooks registered here warm the
app before the snapshot and re-make its connections and clients after each
restore (`memchat.handlers.instance`, docs/snapstart.md). Without it they
never run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mangum import Mangum

from memchat import observability
from memchat.handlers.instance import build_app, install_snapstart_hooks

if TYPE_CHECKING:
    from mangum.types import LambdaContext

# Text responses go out as text, not base64 (the export formats included, though
# the exports themselves are served by memchat.handlers.stream).
TEXT_MIME_TYPES = ["text/", "application/json", "application/x-ndjson"]

app = build_app()
adapter = Mangum(app, lifespan="off", text_mime_types=TEXT_MIME_TYPES)
install_snapstart_hooks(app)


@observability.http_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return adapter(event, context)
