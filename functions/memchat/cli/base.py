"""What the commands share: the database and JWT secret they run against,
messages on stderr, and the parser's scaffolding.

With no DATABASE_URL, a command uses the embedded PostgreSQL under
`.memchat/` (started on demand); with no SUPABASE_JWT_SECRET, the dev
secret kept beside it (memchat.devdb).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TypeAlias

# What each command module's `register` adds its commands to.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_described_command(
    commands: Subcommands, name: str, summary: str, description: str
) -> argparse.ArgumentParser:
    """A command whose `--help` shows `description` as written (its line
    breaks and paragraphs kept); `summary` is its line in `memchat --help`."""
    return commands.add_parser(
        name,
        help=summary,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


class Handled(Exception):
    """A failure already shown to the user: exit code 1, no traceback."""


def err(message: str) -> None:
    print(message, file=sys.stderr)


def database_url(*, note_start: bool = True) -> str:
    """The owner's connection (migrations, local users): DATABASE_URL, else
    the embedded server's (started on demand; a command other than `memchat
    dev` says so, since the server then keeps running after it)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    from memchat import devdb

    started = not devdb.status().running
    url = devdb.start()
    os.environ["DATABASE_URL"] = url
    if started and note_start:
        err(
            f"note: started the embedded PostgreSQL at {devdb.data_dir()}; it keeps running"
            " (`memchat db stop` stops it)"
        )
    return url


def role_url(owner_url: str, role: str) -> str | None:
    """`owner_url` logging in as `role`, if that role can log in there without
    a password (the embedded server; a local server that trusts local logins)."""
    import psycopg

    from memchat import devdb
    from memchat.store.db import connect

    url = devdb.role_conninfo(owner_url, role)
    try:
        connect(url).close()
    except psycopg.OperationalError:
        return None
    return url


def jwt_secret() -> str:
    secret = os.environ.get("SUPABASE_JWT_SECRET")
    if secret:
        return secret
    from memchat import devdb

    return devdb.dev_jwt_secret()
