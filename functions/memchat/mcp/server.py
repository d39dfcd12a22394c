"""The MCP server: memchat's memory tools for one caller at a time.

The caller is the one the transport verified (`acting_for`): the HTTP
route sets it per request from the bearer token; `memchat mcp` once, from
its token. A tool's failure the user can act on (a conflict, a limit, an
unknown session) comes back as the tool's error text (memchat's detail);
anything else is the SDK's generic tool error, its cause logged without
the request's content.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from memchat import store
from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import BadRequest, MemchatError, RecallOff, RecallUnavailable
from memchat.usecases.completions import storable
from memchat.usecases.recall import OK

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from memchat.api.state import AppState

logger = logging.getLogger(__name__)

NAME = "memchat"
INSTRUCTIONS = (
    "memchat remembers this user across conversations: search_memory finds earlier "
    "exchanges, read_notes and update_notes are the long-term notes about the user, "
    "list_sessions and get_session the conversations themselves."
)
_CALLER: contextvars.ContextVar[store.Caller] = contextvars.ContextVar("memchat_mcp_caller")

Agent = Annotated[
    str, Field(pattern=AGENT_NAME_PATTERN, description="The agent; default 'default'.")
]


@contextmanager
def acting_for(caller: store.Caller) -> Iterator[None]:
    """Run the server's tools for `caller` within the block."""
    token = _CALLER.set(caller)
    try:
        yield
    finally:
        _CALLER.reset(token)


def _caller() -> store.Caller:
    try:
        return _CALLER.get()
    except LookupError:
        raise RuntimeError("an MCP tool ran outside acting_for()") from None


def build(state: AppState) -> MCPServer:
    """The server over `state` (the app's own: database, settings, recall)."""
    from mcp.server.mcpserver import MCPServer

    # The SDK logs each request's lifecycle at INFO (a stateless request
    # starts and stops a session manager) and a tool's error text, which can
    # quote what the caller sent: memchat's own lines say what happened.
    logging.getLogger("mcp").setLevel(logging.WARNING)
    server: MCPServer = MCPServer(NAME, instructions=INSTRUCTIONS)
    tools = _Tools(state)
    for tool in (
        tools.search_memory,
        tools.read_notes,
        tools.update_notes,
        tools.list_sessions,
        tools.get_session,
    ):
        server.add_tool(tool, name=tool.__name__, description=inspect.cleandoc(tool.__doc__ or ""))
    return server


class _Tools:
    def __init__(self, state: AppState) -> None:
        self._state = state

    async def search_memory(
        self,
        query: Annotated[str, Field(min_length=1, max_length=16000)],
        k: Annotated[int, Field(ge=1, le=50)] = 5,
        agent_name: Agent = "default",
    ) -> dict[str, Any]:
        """Search the user's earlier conversations (every session) for exchanges
        about `query`: each hit's question, answer, session and time, best first."""
        async with _tool_errors():
            if not query.strip():
                raise BadRequest("query is blank.")
            state = self._state
            if not state.settings.memory_enabled:
                raise RecallOff
            found = await state.chat.recall.search(_caller(), query, agent_name=agent_name, k=k)
            if found.status != OK:
                raise RecallUnavailable
            return {
                "hits": [
                    {
                        "session_id": str(hit.session_id),
                        "message_id": hit.message_id,
                        "created_at": hit.created_at.isoformat(),
                        "score": hit.score,
                        "title": hit.title,
                        "question": hit.question,
                        "answer": hit.answer,
                    }
                    for hit in found.hits
                ]
            }

    async def read_notes(self, agent_name: Agent = "default") -> dict[str, Any]:
        """The long-term notes about the user (Markdown) and their version."""
        async with _tool_errors():
            notes = await store.read_notes(self._state.db, _caller(), agent_name)
            return _notes(notes)

    async def update_notes(
        self,
        notes: str,
        expected_version: Annotated[int | None, Field(ge=0, le=2**31 - 1)] = None,
        agent_name: Agent = "default",
    ) -> dict[str, Any]:
        """Replace the long-term notes (a new version; earlier ones are kept).
        Pass the version read_notes gave as expected_version so a change made
        meanwhile is not overwritten (then: re-read and retry)."""
        from memchat.usecases.notes import replace_notes

        async with _tool_errors():
            storable("notes", notes)
            state = self._state
            saved = await replace_notes(
                state.db, state.settings, _caller(), agent_name, notes, expected_version
            )
            return _notes(saved)

    async def list_sessions(
        self,
        agent_name: Annotated[str | None, Field(pattern=AGENT_NAME_PATTERN)] = None,
        limit: Annotated[int, Field(ge=1, le=100)] = 20,
    ) -> dict[str, Any]:
        """The user's conversations, most recently active first."""
        async with _tool_errors():
            sessions = await store.list_sessions(
                self._state.db, _caller(), agent_name=agent_name, limit=limit
            )
            return {"sessions": [s.as_dict() for s in sessions]}

    async def get_session(
        self,
        session_id: str,
        last: Annotated[int, Field(ge=1, le=500)] = 50,
    ) -> dict[str, Any]:
        """One conversation: its details and its `last` messages, oldest first."""
        from memchat.usecases.export import ExportFormat, export_session

        async with _tool_errors():
            try:
                sid = uuid.UUID(session_id.strip())
            except ValueError:
                raise BadRequest("session_id must be a UUID.") from None
            exported = await export_session(self._state.db, _caller(), sid, ExportFormat.JSON)
            document = json.loads("".join([chunk async for chunk in exported.chunks]))
            messages = document["messages"]
            return {"session": document["session"], "messages": messages[-last:]}


def _notes(notes: store.Notes) -> dict[str, Any]:
    return {
        "agent_name": notes.agent_name,
        "notes": notes.notes,
        "version": notes.version,
        "updated_at": notes.updated_at.isoformat() if notes.updated_at else None,
    }


@asynccontextmanager
async def _tool_errors() -> AsyncIterator[None]:
    """memchat's errors as the tool's error text (its code and detail);
    anything else is the SDK's generic tool error, logged here by type only."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        yield
    except MemchatError as exc:
        raise ToolError(f"{exc.code}: {exc.detail}") from None
    except ToolError:
        raise
    except Exception as exc:
        logger.error("MCP tool failed", extra={"error": type(exc).__name__})
        raise
