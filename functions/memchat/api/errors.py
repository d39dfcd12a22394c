"""Every error as the contract's JSON: {"error", "detail", "request_id"}."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match

from memchat import logs
from memchat.errors import MemchatError

logger = logging.getLogger(__name__)

UNPAIRED_SURROGATES = (
    "must not contain unpaired surrogates (U+D800 to U+DFFF); send well-formed Unicode"
)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


def request_id_of(request: Request) -> str:
    return str(getattr(request.state, "request_id", "") or "")


def error_response(
    request: Request, status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(_body(request, code, detail), status_code=status, headers=headers)


def _body(request: Request, code: str, detail: str) -> dict[str, str]:
    return {"error": code, "detail": detail, "request_id": request_id_of(request)}


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app serves on this request's path.

    The router's own 405 names only the first route that matched the path;
    /memory, say, is three routes (GET, PUT, DELETE)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes
        )
    ]


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "header", "path")]
    return ".".join(parts) or "body"


async def _memchat_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MemchatError)
    body = error_body(request, exc)
    return JSONResponse(body, status_code=exc.status, headers=exc.headers or None)


def error_body(request: Request, exc: BaseException) -> dict[str, str]:
    """The contract's error JSON for `exc`, logged as its handler would: a
    MemchatError as itself, anything else as an internal error."""
    if not isinstance(exc, MemchatError):
        _log_unexpected(request, exc)
        return _body(request, "internal_error", MemchatError.detail)
    if exc.status >= 500:
        logger.warning(
            "request failed",
            extra={"error": exc.code, "status": exc.status, "request_id": request_id_of(request)},
        )
    return _body(request, exc.code, exc.detail)


JSON_MEDIA_TYPE = "application/json"


def is_json_media_type(content_type: str | None) -> bool:
    """`application/json` or `application/<anything>+json` (any parameters)."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    return media_type == JSON_MEDIA_TYPE or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


def not_json_detail(content_type: str | None) -> str:
    """The 415's detail: the type expected, and the one the request had."""
    media_type = (content_type or "").split(";", 1)[0].strip()[:100]
    sent = f"it was {media_type}" if media_type else "it had none"
    return f"The request body must be JSON: send it with Content-Type: {JSON_MEDIA_TYPE} ({sent})."


def not_utf8_detail(body: bytes) -> str:
    """The detail for a body that could not be decoded: where it is not UTF-8."""
    try:
        body.decode("utf-8", "surrogatepass")  # as json.loads decodes it
    except UnicodeDecodeError as exc:
        return (
            f"The request body is not UTF-8: the byte 0x{body[exc.start]:02X} at offset"
            f" {exc.start} (counting from 0) is not valid UTF-8; send the JSON encoded as UTF-8."
        )
    return "The request body is not valid JSON."


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    content_type = request.headers.get("content-type")
    if not is_json_media_type(content_type) and any(
        tuple(e.get("loc", ())) == ("body",) and e.get("type") != "missing" for e in errors
    ):
        # A body sent as something else (FastAPI reads only JSON ones as JSON).
        detail = not_json_detail(content_type)
        return error_response(request, 415, "unsupported_media_type", detail)
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(request, 400, "invalid_json", "The request body is not valid JSON.")
    details = []
    for error in errors[:5]:
        message = str(error.get("msg", "invalid value"))
        if error.get("type") == "missing":
            message = "is required"
        elif error.get("type") == "string_unicode":  # a key or value with a lone surrogate
            message = UNPAIRED_SURROGATES
        details.append(f"{_field(tuple(error.get('loc', ())))}: {message}")
    return error_response(request, 422, "validation_error", "; ".join(details) + ".")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "error")
    detail = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"There is no endpoint {request.method} {request.url.path}."
    headers = dict(exc.headers or {})
    if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        # FastAPI's "There was an error parsing the body": a JSON body whose
        # bytes are not text (json.loads decodes them first).
        body = exc.__cause__.object
        return error_response(request, 400, "invalid_json", not_utf8_detail(bytes(body)))
    if exc.status_code == 405:
        allow = ", ".join(allowed_methods(request))
        if request.method == "OPTIONS":
            # A plain OPTIONS (the CORS middleware answers preflights before this).
            return Response(status_code=204, headers={"Allow": allow})
        headers["Allow"] = allow
        detail = f"{request.method} is not allowed on {request.url.path}; use {allow}."
    return error_response(request, exc.status_code, code, detail, headers)


def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """A 500 in the contract's shape; the request middleware calls this so
    the exception never reaches the server's own (verbose) error logging."""
    return JSONResponse(error_body(request, exc), status_code=500)


def _log_unexpected(request: Request, exc: BaseException) -> None:
    """The exception's type and where it was raised (its frames too, at
    DEBUG), with the request id the client gets: never its message, which
    may quote user input (a database error echoing a value, say)."""
    fields = logs.error_fields(exc, with_traceback=logger.isEnabledFor(logging.DEBUG))
    logger.error(logs.UNEXPECTED, extra={**fields, "request_id": request_id_of(request)})


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    return unexpected_error(request, exc)


UNSUPPORTED_MEDIA_TYPE = (
    "The body was not sent as JSON (`unsupported_media_type`): send it with"
    " Content-Type: application/json"
)
_ERROR_CONTENT = {JSON_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}


def _json_body_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    """The routes FastAPI reads a JSON body for (those of included routers too)."""
    for route in routes:
        included = getattr(getattr(route, "original_router", None), "routes", None)
        if included is not None:
            yield from _json_body_routes(included)
        elif isinstance(route, APIRoute) and route.body_field is not None:
            yield route


def _document_unsupported_media_type(app: FastAPI) -> None:
    """The OpenAPI document lists the 415 of every operation with a JSON body,
    in the shape of the operation's other errors (its 400's: the /v1 routes
    answer in OpenAI's)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        for route in _json_body_routes(app.router.routes):
            for method in route.methods or ():
                operation = schema["paths"].get(route.path_format, {}).get(method.lower())
                if operation is not None:
                    content = operation["responses"].get("400", {}).get("content", _ERROR_CONTENT)
                    operation["responses"].setdefault(
                        "415", {"description": UNSUPPORTED_MEDIA_TYPE, "content": content}
                    )
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install(app: FastAPI) -> None:
    app.add_exception_handler(MemchatError, _memchat_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    _document_unsupported_media_type(app)
