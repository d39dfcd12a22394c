"""MCP's streamable HTTP transport for one request of POST /mcp.

Stateless with JSON answers: every request is a whole exchange (no MCP
session id, no server-sent stream to hold open), which is what a Lambda
invocation behind API Gateway can serve, and any instance can answer any
request. The caller was verified by the route (the API's JWT auth); the
SDK's own DNS-rebinding guard (a Host check meant for unauthenticated
local servers) is off for that reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memchat.mcp import server

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.types import Receive, Scope, Send

    from memchat.api.state import AppState
    from memchat.store import Caller

# The server of the process's app state (one per process; rebuilt for another state).
_built: tuple[AppState, MCPServer] | None = None


def server_for(state: AppState) -> MCPServer:
    global _built
    if _built is None or _built[0] is not state:
        _built = (state, server.build(state))
    return _built[1]


async def serve(
    state: AppState, caller: Caller, scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer one MCP request (its body still unread) for `caller`."""
    from mcp.server.transport_security import TransportSecuritySettings

    app = server_for(state).streamable_http_app(
        streamable_http_path=scope["path"],
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    with server.acting_for(caller):
        async with app.router.lifespan_context(app):
            await app(scope, receive, send)
