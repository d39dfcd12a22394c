"""ExportFunction: the export routes, streamed from a Lambda function URL.

Through API Gateway and mangum a Lambda response is buffered whole and capped
at 6 MB, which a large export passes (100,000 messages are about 35 MB). So
the exports are served from ExportFunction's function URL in RESPONSE_STREAM
mode instead: the AWS Lambda Web Adapter layer (template.yaml) runs the
package's `run.sh`, which execs `python -m memchat.handlers.stream`; this
module builds the app exactly as `memchat.handlers.http` does and serves it
with uvicorn on 127.0.0.1:$AWS_LWA_PORT (8080). The adapter waits until
GET /health answers, then turns each function-URL request into an HTTP
request to this server and streams the response back as it is written.

Only the export routes (and /health, the adapter's readiness check) are
served here: every other route stays behind API Gateway, with its
throttling and access log, and answers 404 on the function URL.

    AWS_LWA_PORT=8081 python -m memchat.handlers.stream   # the same, locally
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fastapi.routing import APIRoute

from memchat.handlers.instance import build_app

if TYPE_CHECKING:
    from fastapi import FastAPI

# What the function URL serves, as (method, path) in the app's route syntax.
EXPORT_ROUTES = frozenset({("GET", "/chat/export/{session_id}"), ("GET", "/export")})
# The adapter's readiness check (template.yaml: AWS_LWA_READINESS_CHECK_PATH).
READINESS_PATH = "/health"
HOST = "127.0.0.1"  # only the adapter, in the same sandbox, connects
DEFAULT_PORT = 8080  # the adapter's default AWS_LWA_PORT


def create_stream_app() -> FastAPI:
    """The app with only the export routes and the readiness check."""
    app = build_app()
    served = {*EXPORT_ROUTES, ("GET", READINESS_PATH)}
    app.router.routes = [
        route
        for route in app.router.routes
        if isinstance(route, APIRoute)
        and any((method, route.path) in served for method in route.methods)
    ]
    return app


def port() -> int:
    raw = os.environ.get("AWS_LWA_PORT", "").strip()
    return int(raw) if raw else DEFAULT_PORT


def main() -> None:
    import uvicorn

    uvicorn.run(
        create_stream_app(),
        host=HOST,
        port=port(),
        lifespan="off",  # the app holds no lifespan state; its state is built eagerly
        log_config=None,  # keep the JSON logging that build_app() configured
        access_log=False,  # the app logs one line per request itself
    )


if __name__ == "__main__":
    main()
