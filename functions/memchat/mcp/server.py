"""The MCP server: memchat's memory tools for one caller at a time.

The caller is the one the transport verified (`acting_for`): the HTTP
route sets it per request from the bearer token; `memchat mcp` once, from
its token, so there each tool call first checks (`recheck`) that the token
has not expired since and that its user still exists, and does nothing
otherwise. A tool's failure the user can act on (arguments that fail the
tool's schema, a conflict, a limit, an unknown session) comes back as the
tool's error text, `<code>: <detail>` as the HTTP API would say it
(arguments: `validation_error` naming each field, never quoting the value);
anything else is the SDK's generic tool error, its cause logged without the
request's content.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, ValidationError

from memchat import store
from memchat.auth import LEEWAY_SECONDS as TOKEN_LEEWAY_SECONDS
from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import BadRequest, MemchatError, RecallOff, RecallUnavailable, Unauthorized
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
    "list_memories and forget_memory what memory keeps of the conversations (it outlives "
    "them), list_sessions and get_session the conversations themselves."
)
EXPIRED = (
    "The access token has expired; get a new one (locally: `memchat token`)"
    " and restart `memchat mcp` with it."
)
GONE = "This account no longer exists; nothing was done."
# The most argument errors one tool error lists (as the HTTP API's 422 does).
_MAX_ARGUMENT_ERRORS = 5


@dataclass(frozen=True)
class _Acting:
    caller: store.Caller
    recheck: bool


_ACTING: contextvars.ContextVar[_Acting] = contextvars.ContextVar("memchat_mcp_caller")

Agent = Annotated[
    str, Field(pattern=AGENT_NAME_PATTERN, description="The agent; default 'default'.")
]


@contextmanager
def acting_for(caller: store.Caller, *, recheck: bool = False) -> Iterator[None]:
    """Run the server's tools for `caller` within the block. `recheck`: the
    token was verified once for a long-lived transport (stdio), so each
    tool call first checks its expiry and that its user still exists (the
    signature cannot have changed)."""
    token = _ACTING.set(_Acting(caller, recheck))
    try:
        yield
    finally:
        _ACTING.reset(token)


def _acting() -> _Acting:
    try:
        return _ACTING.get()
    except LookupError:
        raise RuntimeError("an MCP tool ran outside acting_for()") from None


def _caller() -> store.Caller:
    return _acting().caller


async def _check_caller(state: AppState) -> None:
    """Unauthorized unless the caller may still act (with `recheck` only):
    its token unexpired (the verifier's leeway), its user still there (one
    round trip)."""
    acting = _acting()
    if not acting.recheck:
        return
    expires = acting.caller.claims.get("exp")
    # The verifier's own leeway: a token accepted at start is not refused by
    # the next call for a difference in rules.
    if isinstance(expires, int | float) and time.time() > expires + TOKEN_LEEWAY_SECONDS:
        raise Unauthorized(EXPIRED)
    try:
        async with state.db.pipeline(acting.caller.claims):
            pass  # the pipeline checks that the user exists
    except Unauthorized:
        raise Unauthorized(GONE) from None


def _invalid_arguments(exc: ValidationError) -> str:
    """The tool's arguments' errors as the HTTP API's 422 says a body's:
    each field and what is wrong with it (never the value sent)."""
    details = []
    for error in exc.errors(include_url=False, include_input=False)[:_MAX_ARGUMENT_ERRORS]:
        where = ".".join(str(part) for part in error.get("loc", ())) or "arguments"
        message = "is required" if error.get("type") == "missing" else error.get("msg")
        details.append(f"{where}: {message or 'invalid value'}")
    return "; ".join(details) + "."


def build(state: AppState) -> MCPServer:
    """The server over `state` (the app's own: database, settings, recall)."""
    # The SDK logs each request's lifecycle at INFO (a stateless request
    # starts and stops a session manager) and a tool's error text, which can
    # quote what the caller sent: memchat's own lines say what happened.
    logging.getLogger("mcp").setLevel(logging.WARNING)
    server: MCPServer = _server_class()(state)
    tools = _Tools(state)
    for tool in (
        tools.search_memory,
        tools.read_notes,
        tools.update_notes,
        tools.list_memories,
        tools.forget_memory,
        tools.list_sessions,
        tools.get_session,
    ):
        server.add_tool(tool, name=tool.__name__, description=inspect.cleandoc(tool.__doc__ or ""))
    return server


@functools.cache
def _server_class() -> Callable[[AppState], MCPServer]:
    """MCPServer with memchat's checks around every tool call (defined on
    first use: the SDK is imported only then)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError

    class Server(MCPServer):
        def __init__(self, state: AppState) -> None:
            super().__init__(NAME, instructions=INSTRUCTIONS)
            self._memchat_state = state

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            """The tool's answer, once the caller is checked (nothing done
            otherwise); arguments the schema refuses, as a sentence."""
            try:
                await _check_caller(self._memchat_state)
            except MemchatError as exc:
                raise ToolError(f"Error executing tool {name}: {exc.code}: {exc.detail}") from None
            try:
                return await super().call_tool(name, arguments, context)
            except UnexpectedToolError:
                raise
            except ToolError as exc:
                cause = exc.__cause__
                if not isinstance(cause, ValidationError):
                    raise
                detail = _invalid_arguments(cause)
                # From the ValidationError still: the SDK then logs the fields' names only.
                raise ToolError(
                    f"Error executing tool {name}: validation_error: {detail}"
                ) from cause

    return Server


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
            storable("query", query)  # as GET /memory/search's q: text the database can hold
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

    async def list_memories(
        self,
        query: Annotated[str | None, Field(min_length=1, max_length=16000)] = None,
        agent_name: Annotated[str | None, Field(pattern=AGENT_NAME_PATTERN)] = None,
        limit: Annotated[int, Field(ge=1, le=100)] = 20,
    ) -> dict[str, Any]:
        """What memory keeps about the user (facts either side stated, with the
        date and the session): the newest first, or with `query` those best
        matching it (of agent_name's agent, default 'default')."""
        from memchat.usecases.memories import memories_matching, memory_dict, memory_page

        async with _tool_errors():
            state = self._state
            if query is not None:
                found = await memories_matching(
                    state.db,
                    state.chat.recall,
                    state.settings,
                    _caller(),
                    agent_name=agent_name or "default",
                    text=query,
                    limit=limit,
                )
            else:
                found, _ = await memory_page(
                    state.db,
                    state.settings,
                    _caller(),
                    agent_name=agent_name,
                    before=None,
                    limit=limit,
                )
            return {"memories": [memory_dict(m) for m in found]}

    async def forget_memory(
        self, memory_id: Annotated[int, Field(ge=1, le=2**63 - 1)]
    ) -> dict[str, Any]:
        """Delete one memory (an id from list_memories) for good: when the user
        asks to forget something, list the matching memories and forget each."""
        from memchat.usecases.memories import forget_memory

        async with _tool_errors():
            await forget_memory(self._state.db, _caller(), memory_id)
            return {"deleted": 1, "memory_id": memory_id}

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
