"""Errors in OpenAI's shape for the /v1 routes, with memchat's statuses.

OpenAI's clients read `{"error": {"message", "type", "param", "code"}}`;
the rest of the API answers `{"error", "detail", "request_id"}`
(api/errors.py). `OpenAIRoute` lets the app's own exception handlers answer
whatever a /v1 route raised (its authentication, its body, the turn) and
rewrites the body: the status, the headers (Retry-After,
WWW-Authenticate), the code and the sentence stay memchat's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
# "messages[2].content: must be ..." names the field the message is about.
_PARAM = re.compile(r"([A-Za-z_][\w.\[\]]*): ")


def openai_body(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """memchat's error JSON (`{"error", "detail", "request_id"}`) in OpenAI's shape."""
    detail = str(body.get("detail", ""))
    param = _PARAM.match(detail) if status in (400, 404, 413, 422) else None
    return {
        "error": {
            "message": detail,
            "type": _TYPES.get(status, "server_error" if status >= 500 else "api_error"),
            "param": param.group(1) if param else None,
            "code": body.get("error"),
        },
        "request_id": body.get("request_id"),
    }


class OpenAIRoute(APIRoute):
    """A route whose errors are answered in OpenAI's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handle_in_openai_shape(request: Request) -> Response:
            try:
                return await handle(request)
            except Exception as exc:
                return await _answer(request, exc)

        return handle_in_openai_shape


async def _answer(request: Request, exc: Exception) -> Response:
    """The app's own answer to `exc`, its body in OpenAI's shape."""
    handlers = request.app.exception_handlers
    handler = next(
        (handlers[kind] for kind in type(exc).__mro__ if kind in handlers),
        None,
    )
    if handler is None:
        raise exc
    response: Response = await handler(request, exc)
    try:
        body = json.loads(bytes(response.body))
    except ValueError:
        return response
    headers = {
        key: value
        for key, value in response.headers.items()
        if key.lower() not in ("content-length", "content-type")
    }
    return JSONResponse(
        openai_body(response.status_code, body), status_code=response.status_code, headers=headers
    )
