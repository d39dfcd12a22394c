"""Checks shared by the tests of the OpenAI-compatible routes (/v1)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.utils.chat_api import assert_error

OPENAI_PREFIX = "/v1/"
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}
# A client's own tool, as the Chat Completions API takes it.
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def assert_openai_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """OpenAI's error shape with memchat's status, code and request id; the `error` object."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"error", "request_id"}, body
    assert set(body["error"]) == OPENAI_ERROR_KEYS, body
    assert body["error"]["code"] == code, body
    assert body["error"]["message"].strip(), body
    assert body["request_id"] == response.headers["x-request-id"]
    error: dict[str, Any] = body["error"]
    return error


def assert_error_at(path: str, response: httpx.Response, status: int, code: str) -> None:
    """The error in the shape of the route at `path`: OpenAI's under /v1, else the contract's."""
    if path.startswith(OPENAI_PREFIX):
        assert_openai_error(response, status, code)
    else:
        assert_error(response, status, code)
