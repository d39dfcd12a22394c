"""`memchat db status|stop` (the embedded PostgreSQL) and `memchat migrate`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from memchat.cli.base import add_described_command, database_url, err

if TYPE_CHECKING:
    import argparse

    from memchat.cli.base import Subcommands

DB_DESCRIPTION = """\
The embedded PostgreSQL that memchat commands start when DATABASE_URL is
unset, by its data directory $MEMCHAT_HOME/pgdata (default .memchat/pgdata in
the current directory). `memchat dev` stops the server it started when it
stops; one started by another command (memchat token, migrate, chat...), or
left by a crash, keeps running until `memchat db stop`.
"""


def cmd_db(args: argparse.Namespace) -> int:
    from memchat import devdb

    if os.environ.get("DATABASE_URL"):
        err("note: DATABASE_URL is set; `memchat db` is about the embedded server only")
    if args.db_command == "status":
        state = devdb.status()
        if not state.running:
            print(f"not running: {state.data_dir}")
            return 3  # as `pg_ctl status`
        print(f"running (pid {state.pid}): {state.data_dir}\n{state.uri}")
        return 0
    try:
        pid = devdb.stop()
    except devdb.StopError as exc:
        err(str(exc))
        return 1
    if pid is None:
        print(f"not running: {devdb.data_dir()} (nothing to stop)")
    else:
        print(f"stopped (pid {pid}): {devdb.data_dir()}")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    if "DATABASE_URL" not in os.environ:
        err("DATABASE_URL is not set: migrating the embedded PostgreSQL under .memchat/")
    apply_migrations(database_url())
    return 0


def apply_migrations(url: str) -> None:
    """Migrate `url`, saying how many migrations that applied."""
    from memchat.store.migrations import migrate

    applied = migrate(url)
    err(f"migrations: {len(applied)} applied" + (f" ({', '.join(applied)})" if applied else ""))


def register(commands: Subcommands) -> None:
    db = add_described_command(
        commands,
        "db",
        "the embedded PostgreSQL under $MEMCHAT_HOME (default .memchat/): status, stop",
        DB_DESCRIPTION,
    )
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser(
        "status", help="running or not (exit code 3 if not), its pid and connection URI"
    ).set_defaults(func=cmd_db)
    db_sub.add_parser(
        "stop", help="stop it (fast: open transactions roll back, clients are disconnected)"
    ).set_defaults(func=cmd_db)

    mig = commands.add_parser("migrate", help="apply supabase/migrations to DATABASE_URL")
    mig.set_defaults(func=cmd_migrate)
