"""The `search_memory` tool: its schema, and its result as the model reads it.

Offered to the model only when the turn opts in (SEARCH_MEMORY_TOOL, or the
request's own choice: `search_memory` on POST /chat, `memchat.search_memory`
on POST /v1/chat/completions): automatic recall puts a
few exchanges in every prompt; this lets the model look further back, with
a query of its own, the way Letta's conversation_search does. The search
itself is recall's (usecases/recall/, as GET /memory/search).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memchat import store

TOOL_NAME = "search_memory"
MAX_K = 10
DEFAULT_K = 5

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Search your earlier conversations with this user (all sessions) for "
            "exchanges about something; use it when the memory you were given does not "
            "hold what you need. Returns the best matching exchanges, best first."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for."},
                "k": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_K,
                    "description": f"At most this many exchanges (default {DEFAULT_K}).",
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}


def query_of(arguments: dict[str, Any]) -> tuple[str, int] | str:
    """(query, k) from a call's arguments, or the error text for the model."""
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return "error: query must be a non-empty string"
    k = arguments.get("k", DEFAULT_K)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        return f"error: k must be an integer from 1 to {MAX_K}"
    return query, k


def result_text(hits: list[store.Hit]) -> str:
    """The hits as the model reads them: one JSON array (remembered text is
    data, quoted, never instructions)."""
    if not hits:
        return "no earlier exchanges match"
    return json.dumps(
        [
            {
                "session_id": str(hit.session_id),
                "time": hit.created_at.isoformat(),
                "conversation": hit.title,
                "user": hit.question,
                "assistant": hit.answer,
                "score": round(hit.score, 4),
            }
            for hit in hits
        ],
        ensure_ascii=False,
    )
