"""POST /mcp: memchat's memory tools over MCP's streamable HTTP (memchat.mcp)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter
from starlette.responses import Response

from memchat.api.deps import CurrentUser, State
from memchat.errors import MemchatError
from memchat.mcp import INSTALL_HINT, sdk_missing

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from memchat.api.state import AppState
    from memchat.store import Caller

router = APIRouter(tags=["mcp"])


class McpExchange(Response):
    """The MCP SDK's answer to the request, written by the SDK itself."""

    def __init__(self, state: AppState, caller: Caller) -> None:
        super().__init__()
        self._state = state
        self._caller = caller

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from memchat.mcp.http import serve

        await serve(self._state, self._caller, scope, receive, send)


# MCP is JSON-RPC with its own errors, described by the MCP specification
# rather than this API's OpenAPI document (tests/handlers/test_template.py
# still checks that the template routes it).
@router.post("/mcp", response_model=None, include_in_schema=False)
async def mcp(caller: CurrentUser, state: State) -> Response:
    """The Model Context Protocol (streamable HTTP, stateless, JSON answers):
    tools search_memory, read_notes, update_notes, list_sessions, get_session,
    acting for the caller."""
    if sdk_missing():
        raise McpNotInstalled()
    return McpExchange(state, caller)


class McpNotInstalled(MemchatError):
    """A deployment without the `mcp` extra (the SDK) answers this, not a 500."""

    status, code = 501, "mcp_unavailable"
    detail = f"This deployment does not serve MCP: the MCP SDK is not installed; {INSTALL_HINT}."
