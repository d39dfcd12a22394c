"""Stored message shape: LangChain's `message_to_dict`.

`chat_message_history.message` holds `{"type": ..., "data": {...}}` exactly
as `langchain_core.messages.message_to_dict` writes it, so
`langchain_postgres.PostgresChatMessageHistory` reads our tables as they are.
Built here by hand so the API does not import LangChain.
"""

from __future__ import annotations

import json
from typing import Any

ROLE_BY_TYPE = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}


def _data(kind: str, content: str, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "content": content,
        "additional_kwargs": {},
        "response_metadata": {},
        "type": kind,
        "name": None,
        "id": None,
    }
    data.update(extra)
    return {"type": kind, "data": data}


UNSTORABLE_NUL = "must not contain NUL (U+0000) characters"
UNSTORABLE_SURROGATE = "must not contain unpaired surrogates (U+D800 to U+DFFF)"


def unstorable(value: object) -> str | None:
    """Why PostgreSQL's text and jsonb could not hold `value` (a string, or
    any JSON value: its keys and strings), or None when they can: NUL, or a
    lone surrogate (which UTF-8 cannot encode)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return UNSTORABLE_NUL
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return UNSTORABLE_SURROGATE
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


def human(content: str) -> dict[str, Any]:
    return _data("human", content)


def ai(
    content: str,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    model: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """An assistant message; `tool_calls` items are `{"id", "name", "args"}`."""
    calls = [
        {"name": c["name"], "args": c["args"], "id": c["id"], "type": "tool_call"}
        for c in tool_calls or []
    ]
    usage_metadata = None
    if usage is not None:
        usage_metadata = {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0),
        }
    message = _data(
        "ai",
        content,
        tool_calls=calls,
        invalid_tool_calls=[],
        usage_metadata=usage_metadata,
    )
    metadata: dict[str, Any] = {}
    if model:
        metadata["model_name"] = model
    if usage_metadata is not None:
        # Where LangChain's ChatOpenAI keeps the provider's own counts.
        metadata["token_usage"] = {
            "prompt_tokens": usage_metadata["input_tokens"],
            "completion_tokens": usage_metadata["output_tokens"],
            "total_tokens": usage_metadata["total_tokens"],
        }
    if metadata:
        message["data"]["response_metadata"] = metadata
    return message


def annotate_answer(
    message: dict[str, Any], *, latency_ms: float, recalled: int, summary_used: bool
) -> None:
    """Add to a turn's final answer what the operator's analytics read
    (memchat_analytics.turns): how long the model took for the whole turn
    (tool rounds included), and what memory the prompt carried."""
    metadata = message["data"].setdefault("response_metadata", {})
    metadata["latency_ms"] = round(latency_ms, 1)
    metadata["memchat"] = {"recalled": recalled, "summary_used": summary_used}


def tool(content: str, *, tool_call_id: str, name: str) -> dict[str, Any]:
    return _data("tool", content, tool_call_id=tool_call_id, name=name, status="success")


def text_of(message: dict[str, Any]) -> str:
    """The text of a stored message."""
    return content_text(message.get("data", {}).get("content", ""))


def content_text(content: Any) -> str:
    """The text of a message's content, whatever shape LangChain gave it."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    # Multimodal content (written by other LangChain apps): a list of strings and
    # blocks; keep the text.
    if not isinstance(content, list):
        return json.dumps(content, ensure_ascii=False)
    parts = [
        p if isinstance(p, str) else str(p.get("text") or "")
        for p in content
        if isinstance(p, str) or (isinstance(p, dict) and p.get("type", "text") == "text")
    ]
    return "".join(parts)


def to_openai(message: dict[str, Any]) -> dict[str, Any] | None:
    """A stored human/ai/system message as an OpenAI chat message (else None)."""
    role = ROLE_BY_TYPE.get(message.get("type", ""))
    if role in ("user", "assistant", "system"):
        return {"role": role, "content": text_of(message)}
    return None
