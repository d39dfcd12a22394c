"""`memchat cleanup`: delete expired sessions now (what the CleanupFunction does)."""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING

from memchat import bootstrap
from memchat.cli.base import database_url, err, role_url

if TYPE_CHECKING:
    import argparse

    from memchat.cli.base import Subcommands


def cmd_cleanup(args: argparse.Namespace) -> int:
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING").upper())
    from dataclasses import replace

    from memchat.config import ConfigError, load_settings
    from memchat.usecases.cleanup import TimeBudget

    try:
        # As the CleanupFunction reads them: CLEANUP_BATCH_SIZE, CLEANUP_PAUSE_FACTOR.
        settings = load_settings(job="cleanup", database_url=_cleanup_url())
    except ConfigError as exc:
        err(str(exc))
        return 2
    configured = bootstrap.cleanup(settings)
    cleanup = replace(
        configured,
        batch_size=args.batch_size or configured.batch_size,
        pause_factor=configured.pause_factor if args.pause_factor is None else args.pause_factor,
    )
    if args.dry_run:
        result = cleanup.dry_run()
    else:
        result = cleanup.run(TimeBudget(max_seconds=args.max_seconds))
    print(json.dumps(result.as_dict(), indent=2))
    return 0


def _cleanup_url() -> str:
    """The cleanup's own role, as deployed, where it can log in; else DATABASE_URL's."""
    from memchat import devdb

    url = database_url()
    return role_url(url, devdb.CLEANUP_ROLE) or url


def register(commands: Subcommands) -> None:
    clean = commands.add_parser("cleanup", help="delete expired sessions now")
    clean.add_argument("--dry-run", action="store_true", help="only count what would go")
    clean.add_argument("--max-seconds", type=float, default=None)
    clean.add_argument("--batch-size", type=int, default=None)
    clean.add_argument(
        "--pause-factor",
        type=float,
        default=None,
        help="pause this many times each batch's duration between batches (default 1; 0: none)",
    )
    clean.set_defaults(func=cmd_cleanup)
