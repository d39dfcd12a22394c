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
throttling and access log, and answers 404 at the function URL. The
function's ROUTE_GROUPS=export (template.yaml) also keeps the other routes
out of the app and the model key out of the function.

    ROUTE_GROUPS=export AWS_LWA_PORT=8081 python -m memchat.handlers.stream   # locally
"""

from __future__ import annotations

import os
import re
import uuid
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.routing import compile_path

from memchat.api import errors

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import Receive, Scope, Send

# What the function URL serves, as (method, path) in the app's route syntax.
EXPORT_ROUTES = frozenset({("GET", "/chat/export/{session_id}"), ("GET", "/export")})
# The adapter's readiness check (template.yaml: AWS_LWA_READINESS_CHECK_PATH).
READINESS_PATH = "/health"
HOST = "127.0.0.1"  # only the adapter, in the same sandbox, connects
DEFAULT_PORT = 8080  # the adapter's default AWS_LWA_PORT


class ExportsOnly:
    """The app, for the export routes and the readiness check only.

    Any other request gets the contract's JSON 404 without reaching the app,
    so the rest of the API cannot be called around API Gateway.
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        served = {*EXPORT_ROUTES, ("GET", READINESS_PATH)}
        self._served: list[tuple[str, re.Pattern[str]]] = [
            (method, compile_path(path)[0]) for method, path in sorted(served)
        ]

    def serves(self, method: str, path: str) -> bool:
        method = "GET" if method == "HEAD" else method
        return any(m == method and pattern.match(path) for m, pattern in self._served)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.serves(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request.state.request_id = uuid.uuid4().hex
        response = errors.error_response(
            request,
            404,
            "not_found",
            f"There is no endpoint {request.method} {request.url.path} at the export URL"
            " (only GET /export and GET /chat/export/{session_id}): use the API URL.",
            headers={"X-Request-ID": request.state.request_id},
        )
        await response(scope, receive, send)


def create_stream_app() -> ExportsOnly:
    """The app as http.py builds it, behind the export-routes-only guard."""
    # Imported here: importing this module (for its routes, in the template
    # tests) sets nothing up; the import is paid once, at start-up, either way.
    from memchat.handlers.instance import build_app

    return ExportsOnly(build_app())


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
