"""`memchat mcp`: memchat's memory tools over MCP on stdio, for desktop clients.

The server runs in this process against the database (as `memchat dev`
does: DATABASE_URL, else the embedded PostgreSQL under `.memchat/`), acting
for the user of one access token (--token or MEMCHAT_TOKEN, verified as the
API verifies it: its signature once, at start; its expiry and that its
user still exists at every tool call, which does nothing otherwise).
stdout carries the protocol only; notes go to stderr. Without the MCP SDK
(the `mcp` extra) it says what to install and exits 2, as POST /mcp answers
501.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from memchat.cli.base import (
    Subcommands,
    add_described_command,
    database_url,
    err,
    jwt_secret,
    role_url,
)

if TYPE_CHECKING:
    from memchat.api.state import AppState
    from memchat.store import Caller

DESCRIPTION = """\
Serve memchat's memory as MCP tools over stdio (search_memory, read_notes,
update_notes, list_sessions, get_session) for one user: the one whose access
token is given (--token, or MEMCHAT_TOKEN; `memchat token` makes one locally).

A desktop client (Claude Desktop, Cursor, ...) starts it as a command:

  {"mcpServers": {"memchat": {"command": "memchat", "args": ["mcp"],
                              "env": {"MEMCHAT_TOKEN": "<token>"}}}}

The database is DATABASE_URL, else the embedded PostgreSQL of `memchat dev`.
The deployed API serves the same tools over HTTP at POST /mcp."""


def register(commands: Subcommands) -> None:
    command = add_described_command(
        commands, "mcp", "serve the memory tools over MCP (stdio)", DESCRIPTION
    )
    command.add_argument("--token", help="the user's access token (default: MEMCHAT_TOKEN)")
    command.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    from memchat.mcp import INSTALL_HINT, sdk_missing

    if sdk_missing():
        err(f"memchat mcp: the MCP SDK is not installed: {INSTALL_HINT}.")
        return 2
    token = args.token or os.environ.get("MEMCHAT_TOKEN", "")
    if not token.strip():
        err("memchat mcp: give the user's access token (--token or MEMCHAT_TOKEN)")
        return 2
    from memchat import bootstrap, devdb
    from memchat.config import ConfigError, load_settings
    from memchat.errors import MemchatError

    url = database_url()
    os.environ.setdefault("SUPABASE_JWT_SECRET", jwt_secret())
    overrides: dict[str, Any] = {
        "db_max_connections": 4,
        "database_url": role_url(url, devdb.API_ROLE) or url,
    }
    if not os.environ.get("OPENAI_API_KEY"):
        overrides["offline_model"] = True  # embeddings as `memchat dev` makes them
    try:
        settings = load_settings(**overrides)
    except ConfigError as exc:
        err(str(exc))
        return 2
    state = bootstrap.services(settings)
    try:
        caller = state.verifier.verify(token.strip())
    except MemchatError as exc:
        err(f"memchat mcp: {exc.code}: {exc.detail}")
        return 2
    return _serve(state, caller)


def _serve(state: AppState, caller: Caller) -> int:
    import anyio

    from memchat.mcp import server

    mcp_server = server.build(state)

    async def run() -> None:
        try:
            with server.acting_for(caller, recheck=True):
                await mcp_server.run_stdio_async()
        finally:
            await state.close()

    anyio.run(run)
    return 0
