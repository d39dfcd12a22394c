"""The model's `search_memory` tool run for one turn (its schema and result
text: model/search_tool.py): recall's search (as GET /memory/search), under
the caller's RLS."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memchat.model import search_tool
from memchat.usecases.recall.service import OK

if TYPE_CHECKING:
    from memchat import store
    from memchat.usecases.conversation import SearchMemory
    from memchat.usecases.recall.service import Recall


def searcher(recall: Recall, caller: store.Caller, agent_name: str) -> SearchMemory:
    """A turn's search_memory: each call's result text for the model, and its
    log entry for the turn's metadata (the query, k, the exchanges found by
    message id; never their text)."""

    async def search(arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        parsed = search_tool.query_of(arguments)
        if isinstance(parsed, str):
            return parsed, {"error": parsed}
        query, k = parsed
        found = await recall.search(caller, query, agent_name=agent_name, k=k)
        entry: dict[str, Any] = {"query": query, "k": k, "status": found.status}
        if found.status != OK:
            return "error: memory search is unavailable right now", entry
        entry["message_ids"] = [hit.message_id for hit in found.hits]
        return search_tool.result_text(found.hits), entry

    return search
