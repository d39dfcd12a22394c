"""The API Gateway functions' entry point, set up once per Lambda instance.

Everything at module scope runs in the init phase: memchat.bootstrap builds
the app (its secrets fetched, its settings validated: a misconfigured
function fails here, naming the variable). Warm invocations reuse its
database connection, the token verifier's keys and the model client. With
Lambda SnapStart the hooks registered here warm the app before the snapshot
and re-make its connections after each restore (memchat.snapstart).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mangum import Mangum

from memchat import bootstrap, observability, snapstart

if TYPE_CHECKING:
    from mangum.types import LambdaContext

# Text responses go out as text, not base64.
TEXT_MIME_TYPES = ["text/", "application/json", "application/x-ndjson"]

app = bootstrap.lambda_app()
adapter = Mangum(app, lifespan="off", text_mime_types=TEXT_MIME_TYPES)
snapstart.install(app)


@observability.http_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return adapter(event, context)
