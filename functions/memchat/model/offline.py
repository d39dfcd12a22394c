"""A tiny offline stand-in for an OpenAI-compatible server.

`memchat dev` with no OPENAI_API_KEY answers from this, so a newcomer can
try the whole flow (sessions, history, long-term notes) with no key. It is
served through the real `openai` client via an in-process HTTP transport,
and every answer says that it is the offline responder.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx2 as httpx  # the HTTP library of the openai SDK (>= 3)

LABEL = "[offline responder: set OPENAI_API_KEY for real answers]"


def _reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return {"role": "assistant", "content": f"{LABEL} Noted, I will remember that."}
    user_text = str(last.get("content", ""))
    lowered = user_text.strip().lower()
    if lowered.startswith("remember "):
        fact = user_text.strip()[len("remember ") :].strip()
        arguments = json.dumps({"operation": "append", "content": f"- {fact}"})
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": "manage_long_term_memory", "arguments": arguments},
                }
            ],
        }
    history = [m for m in messages[:-1] if m.get("role") in ("user", "assistant")]
    notes = next(
        (
            str(m["content"])
            for m in messages
            if m.get("role") == "system" and "Long-term notes" in str(m.get("content"))
        ),
        "",
    )
    earlier = [m["content"] for m in history if m.get("role") == "user"]
    parts = [LABEL, f'You said: "{user_text}".']
    parts.append(
        f'I remember {len(history)} earlier messages; your last one was "{earlier[-1]}".'
        if earlier
        else "This is the start of our conversation."
    )
    if notes:
        parts.append("My notes about you: " + notes.split("\n", 1)[-1].replace("\n", " "))
    parts.append('(Say "remember <fact>" to add to my long-term notes.)')
    return {"role": "assistant", "content": " ".join(parts)}


def _handle(request: httpx.Request) -> httpx.Response:
    if not request.url.path.endswith("/chat/completions"):
        return httpx.Response(404, json={"error": {"message": "not found"}})
    body = json.loads(request.content)
    message = _reply(body.get("messages", []))
    if body.get("tool_choice") == "none" and message.get("tool_calls"):
        message = {"role": "assistant", "content": f"{LABEL} (no tool rounds left)"}
    completion = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "memchat-offline",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
    return httpx.Response(200, json=completion)


def http_client() -> httpx.AsyncClient:
    """An httpx client whose every request is answered in-process."""
    return httpx.AsyncClient(transport=httpx.MockTransport(_handle))
