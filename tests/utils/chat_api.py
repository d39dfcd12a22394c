"""Checks shared by the /chat API tests: error bodies, turns, prompts, notes."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg

from memchat.prompts.memory import MEMORY_OPEN, Remembered, read_memory

ERROR_KEYS = {"error", "detail", "request_id"}


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The contract's error JSON with `status` and `code`, and the X-Request-ID header."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == ERROR_KEYS, body
    assert body["error"] == code, body
    assert isinstance(body["detail"], str) and body["detail"].strip(), body
    assert body["request_id"], body
    assert response.headers["x-request-id"] == body["request_id"]
    return body


async def chat(
    client: httpx.AsyncClient, auth: dict[str, str], message: str, **fields: Any
) -> dict[str, Any]:
    """One successful POST /chat; returns the response body."""
    response = await client.post("/chat", json={"message": message, **fields}, headers=auth)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert response.headers["x-session-id"] == body["session_id"]
    return body


def conversation(request: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, content) of the user/assistant messages a model request carried,
    the memory block left out."""
    block = memory_message(request)
    return [
        (m["role"], m["content"])
        for m in request["messages"]
        if m["role"] in ("user", "assistant") and not m.get("tool_calls") and m is not block
    ]


def system_texts(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "system"]


def memory_message(request: dict[str, Any]) -> dict[str, Any] | None:
    """The memory block's message: the first after the system prompt, a user
    message that opens with MEMORY_OPEN (None when the request has none)."""
    first: dict[str, Any] | None = next(
        (m for m in request["messages"] if m["role"] != "system"), None
    )
    if first is None or first["role"] != "user" or not first["content"].startswith(MEMORY_OPEN):
        return None
    return first


def memory_text(request: dict[str, Any]) -> str | None:
    """The memory block the model was sent, as sent."""
    message = memory_message(request)
    return None if message is None else str(message["content"])


def remembered(request: dict[str, Any]) -> Remembered:
    """What the request's memory block carries, unquoted (empty without a block)."""
    text = memory_text(request)
    if text is None:
        return Remembered()
    memory = read_memory(text)
    assert memory is not None, f"not a memory block: {text!r}"
    return memory


def kinds(request: dict[str, Any]) -> list[str]:
    """The request's messages by role, the memory block as "memory"."""
    block = memory_message(request)
    return ["memory" if m is block else m["role"] for m in request["messages"]]


def seed_notes(
    admin: psycopg.Connection, user_id: uuid.UUID, notes: str, agent_name: str = "default"
) -> None:
    admin.execute(
        "insert into public.agent_long_term_memory (user_id, agent_name, notes)"
        " values (%s, %s, %s)",
        (user_id, agent_name, notes),
    )


def stored_notes(
    admin: psycopg.Connection, user_id: uuid.UUID, agent_name: str = "default"
) -> tuple[str, int] | None:
    """(notes, version) as stored, or None when there is no row."""
    row = admin.execute(
        "select notes, version from public.agent_long_term_memory"
        " where user_id = %s and agent_name = %s",
        (user_id, agent_name),
    ).fetchone()
    return (row[0], row[1]) if row else None
