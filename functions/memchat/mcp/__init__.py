"""memchat's memory as MCP tools (the official `mcp` SDK, an optional extra).

`server.build` makes the server: search_memory, read_notes, update_notes,
list_sessions and get_session, each acting for one verified caller under
RLS through the same use cases as the HTTP API. It is served two ways:
streamable HTTP at POST /mcp (api/routes/mcp.py, the API's JWT auth,
stateless: each request stands alone, as a Lambda invocation does) and
stdio (`memchat mcp`, cli/mcp.py) for desktop clients. The SDK is imported
here only, on first use: never on the chat function's cold start.
"""

from __future__ import annotations

import importlib.util

# What the operator installs to serve MCP: the venv infra/dev.sh builds has
# no `mcp` extra. Said by `memchat mcp` and by POST /mcp's 501.
INSTALL_HINT = (
    "install memchat's mcp extra (in a checkout: .venv/bin/pip install -e '.[mcp]';"
    " else: pip install 'memchat[mcp]')"
)


def sdk_missing() -> bool:
    """Whether the MCP SDK memchat.mcp is built on (mcp >= 2, which has
    mcp.server.mcpserver) cannot be imported: absent, or too old. Finding it
    imports its parent packages, not the server module (called only where
    MCP is about to be served)."""
    try:
        return importlib.util.find_spec("mcp.server.mcpserver") is None
    except ImportError:  # no `mcp` package at all
        return True
