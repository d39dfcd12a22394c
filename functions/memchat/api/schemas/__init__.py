"""Request and response bodies of the contract (docs/api.md): what every route shares.

The bodies of each group of routes are in their own module (chat, sessions,
memory, account, feedback), imported only by the routes a process serves.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from memchat.api.errors import UNPAIRED_SURROGATES
from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import BadRequest

AgentName = Field(default="default", pattern=AGENT_NAME_PATTERN, description="Agent name.")
# PostgreSQL's int4 (notes version): a larger number is a 422, not a database error.
INT4_MAX = 2**31 - 1


def json_integer(value: Any) -> Any:
    """What JSON Schema calls an integer, no more: `true` and `"2"` are not
    (pydantic would take them), `2.0` is (JSON Schema says so). A request
    body's integer fields run it first (a `mode="before"` field validator,
    which leaves the OpenAPI document's bounds as they are)."""
    if isinstance(value, bool | str):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


def _refuse_unstorable_text(value: object) -> object:
    # JSON's \u escapes can carry both, PostgreSQL text can hold neither:
    # refused here, as a 422 naming the field, not in the database (after the
    # model was paid for). Before pydantic's own str checks, which catch
    # surrogates only where a constraint makes them look at the text.
    if isinstance(value, str):
        if "\x00" in value:
            raise PydanticCustomError("unstorable_text", "must not contain NUL (U+0000) characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise PydanticCustomError("unstorable_text", UNPAIRED_SURROGATES) from None
    return value


# What _refuse_unstorable_text allows, said in the schema too (clients and the fuzzer read it).
STORABLE_PATTERN = "^[^\\u0000\\ud800-\\udfff]*$"

StoredText = Annotated[
    str,
    BeforeValidator(_refuse_unstorable_text),
    Field(json_schema_extra={"pattern": STORABLE_PATTERN}),
]
"""Free text from a client that is stored or sent on: refuses NUL and lone surrogates."""

_UUID_SCHEMA = {"type": "string", "format": "uuid"}
UuidText = Annotated[str, WithJsonSchema(_UUID_SCHEMA)]
"""A UUID in the schema, a string to the validator: `parse_session_id` checks it,
so a malformed id is the contract's 400 (not a 422) and any case is accepted."""
UuidHeader = Annotated[str | None, WithJsonSchema(_UUID_SCHEMA)]
"""UuidText for an optional header: absent is None, but never null on the wire."""


def parse_session_id(value: str | None, source: str = "session_id") -> uuid.UUID | None:
    """A session id as the contract accepts it (any-case UUID); 400 otherwise."""
    if value is None:
        return None
    try:
        return uuid.UUID(value.strip())
    except (ValueError, AttributeError):
        raise BadRequest(
            f"{source} must be a UUID, e.g. 123e4567-e89b-12d3-a456-426614174000."
        ) from None


class ErrorOut(BaseModel):
    error: str
    detail: str
    request_id: str


Responses = dict[int | str, dict[str, Any]]

_RETRY_AFTER = {
    "description": "Seconds to wait before retrying.",
    "schema": {"type": "integer", "minimum": 1},
}
# Every error status an endpoint can answer, with the contract's codes.
_ERRORS: dict[int, dict[str, Any]] = {
    400: {
        "description": "Malformed id, cursor or JSON, conflicting input (`bad_request`),"
        " or more than 50 query parameters (`too_many_query_parameters`)"
    },
    401: {
        "description": "Missing or invalid access token (`unauthorized`)",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string", "enum": ["Bearer"]}}},
    },
    404: {"description": "Not found (`not_found`, `session_not_found`, `message_not_found`)"},
    409: {
        "description": "The resource changed meanwhile (`conflict`)",
        "headers": {"Retry-After": _RETRY_AFTER},
    },
    413: {"description": "Request body over 1 MB, or text over its limit (`payload_too_large`)"},
    422: {"description": "A field failed validation (`validation_error`)"},
    429: {
        "description": "Throttled: too many requests of this kind (`rate_limited`)",
        "headers": {"Retry-After": {**_RETRY_AFTER, "required": True}},
    },
    502: {"description": "The model provider failed; nothing stored (`model_upstream_error`)"},
    503: {
        "description": "Database or sign-in keys unreachable"
        " (`database_unavailable`, `auth_unavailable`)",
        "headers": {"Retry-After": _RETRY_AFTER},
    },
    504: {"description": "The model took too long; nothing stored (`model_timeout`)"},
}


def error_responses(*statuses: int, descriptions: dict[int, str] | None = None) -> Responses:
    """OpenAPI `responses` for an authenticated endpoint: the given error
    statuses plus the 400, 401 and 503 every such endpoint can answer, each with
    the ErrorOut schema; `descriptions` says more where an endpoint can."""
    responses: Responses = {}
    # Any request may be refused with 400 (more than 50 query parameters,
    # before routing), 401 and 503.
    for status in sorted({*statuses, 400, 401, 503}):
        responses[status] = {"model": ErrorOut, **_ERRORS[status]}
        if descriptions and status in descriptions:
            responses[status]["description"] = descriptions[status]
    return responses


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    database: Literal["ok", "unreachable"]


# PostgreSQL's bigint (message ids): a larger number is a 422, not a database error.
INT8_MAX = 2**63 - 1
MessageId = Annotated[int, Field(ge=1, le=INT8_MAX, description="An answer's message_id.")]
