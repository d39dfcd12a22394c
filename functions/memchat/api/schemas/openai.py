"""POST /v1/chat/completions and GET /v1/models: their bodies as the OpenAPI
document describes them (OpenAI's own shapes; memchat reads the request
itself, usecases/completions.py, so that what it refuses is named)."""

# No `from __future__ import annotations`: pydantic would compile each
# annotation from its string when the classes are made (cold start).
from typing import Any, Literal

from pydantic import BaseModel, Field

from memchat.api.schemas import Responses, error_responses
from memchat.usecases import completions


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None = Field(description="memchat's error code (`rate_limited`, ...).")


class OpenAIErrorOut(BaseModel):
    """An error as OpenAI's clients read it, with memchat's status and code."""

    error: OpenAIError
    request_id: str


_TEXT_PARTS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    },
}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"anyOf": [{"type": "string"}, _TEXT_PARTS, {"type": "null"}]},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
    },
}
_NUMBER = {"type": "number"}
_SAMPLING: dict[str, Any] = {
    "max_tokens": {"type": "integer", "minimum": 1, "description": "Capped at OPENAI_MAX_TOKENS."},
    "max_completion_tokens": {
        "type": "integer",
        "minimum": 1,
        "description": "Capped at OPENAI_MAX_TOKENS (the smaller of the two when both are given).",
    },
    "temperature": {**_NUMBER, "minimum": 0, "maximum": 2},
    "top_p": {**_NUMBER, "minimum": 0, "maximum": 1},
    "presence_penalty": {**_NUMBER, "minimum": -2, "maximum": 2},
    "frequency_penalty": {**_NUMBER, "minimum": -2, "maximum": 2},
    "seed": {"type": "integer"},
    "stop": {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "maxItems": 4, "items": {"type": "string", "minLength": 1}},
            {"type": "null"},
        ]
    },
}
# Accepted and ignored (any value), and refused unless at their default.
_IGNORED = {name: {"description": "Ignored."} for name in sorted(completions.IGNORED)}
_REFUSED = {
    name: {"description": f"Refused unless {defaults!r}: {why}."}
    for name, (defaults, why) in sorted(completions.REFUSED.items())
}

REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "additionalProperties": False,
    "description": "OpenAI's Chat Completions request; docs/api.md lists the fields"
    " memchat honours, ignores and refuses.",
    "properties": {
        "model": {"type": "string", "examples": ["memchat", "memchat:support"]},
        "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
        "stream": {"type": "boolean"},
        "stream_options": {
            "type": "object",
            "properties": {"include_usage": {"type": "boolean"}},
        },
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"enum": ["auto", "none"]},
        "metadata": {
            "type": "object",
            "properties": {"session_id": {"type": "string", "format": "uuid"}},
        },
        "memchat": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "search_memory": {"type": "boolean"},
                "client_message_id": {"type": "string", "minLength": 1, "maxLength": 128},
                "suggest": {"type": "boolean"},
            },
        },
        **_SAMPLING,
        **_IGNORED,
        **_REFUSED,
    },
}


class ModelOut(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "memchat"


class ModelsOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]


_ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/OpenAIErrorOut"}}}


def openai_error_responses(*statuses: int, descriptions: dict[int, str] | None = None) -> Responses:
    """`error_responses`, each error in OpenAI's shape.

    Only the first names the model (which puts OpenAIErrorOut in the
    document's components); the others refer to it: FastAPI makes a pydantic
    field for every response that names a model when the route is created,
    a cost each cold start of the chat function would pay."""
    responses = error_responses(*statuses, descriptions=descriptions)
    for position, response in enumerate(responses.values()):
        del response["model"]
        if position == 0:
            response["model"] = OpenAIErrorOut
        else:
            response["content"] = _ERROR_REF
    return responses
