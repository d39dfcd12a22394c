"""`memchat`: run the API locally, migrate, mint dev tokens, chat, clean up.

With no DATABASE_URL, every command uses the embedded PostgreSQL under
`.memchat/` (started on demand), so nothing needs to be installed or run
beforehand.

One module per command group (dev; db with migrate; token; login with logout; chat;
history_import: import; cleanup; summarize; stats; embeddings; mcp), each adding its
commands to the parser (`register`); `base` holds what several of them use.
"""

from __future__ import annotations

import argparse

from memchat.cli import (
    chat,
    cleanup,
    db,
    dev,
    embeddings,
    history_import,
    login,
    mcp,
    stats,
    summarize,
    token,
)
from memchat.cli.base import Handled

__all__ = ["build_parser", "main"]

# In the order `memchat --help` lists them (db adds `db` and `migrate`).
COMMAND_GROUPS = (
    dev,
    db,
    token,
    login,
    chat,
    history_import,
    cleanup,
    summarize,
    stats,
    embeddings,
    mcp,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memchat", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except Handled:
        return 1
    except KeyboardInterrupt:
        return 130
    return code
