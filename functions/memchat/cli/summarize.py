"""`memchat summarize`: the summary worker and the embedding backfill once
(what the SummaryFunction does)."""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from memchat import bootstrap
from memchat.cli.base import database_url, err, role_url

if TYPE_CHECKING:
    import argparse

    from memchat.cli.base import Subcommands
    from memchat.config import Settings


def cmd_summarize(args: argparse.Namespace) -> int:
    """Summarize the sessions that are due now, then embed the messages queued
    for embeddings (what the SummaryFunction does); print both runs."""
    import asyncio

    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING").upper())
    from memchat.config import ConfigError

    try:
        settings = worker_settings(database_url(), {})
    except ConfigError as exc:
        err(str(exc))
        return 2

    async def once() -> dict[str, Any]:
        summarizer, embedder = bootstrap.worker(settings)
        try:
            run = (await summarizer.run(max_seconds=args.max_seconds)).as_dict()
            embedded = await embedder.run(max_seconds=args.max_seconds)
            return {**run, "embeddings": embedded.as_dict()}
        finally:
            await summarizer.close()

    print(json.dumps(asyncio.run(once()), indent=2))
    return 0


def worker_settings(owner_url: str, overrides: dict[str, Any]) -> Settings:
    """Settings for the summary worker and the backfill: its own role where it
    can log in."""
    from memchat import devdb
    from memchat.config import load_settings

    worker_url = role_url(owner_url, devdb.WORKER_ROLE) or owner_url
    values = {**overrides, "database_url": worker_url, "job": "summaries"}
    values.pop("cors_allow_origins", None)
    if not os.environ.get("OPENAI_API_KEY"):
        values["offline_model"] = True
    return load_settings(**values)


def register(commands: Subcommands) -> None:
    summ = commands.add_parser(
        "summarize",
        help="refresh the rolling summaries that are due now, then embed queued messages",
    )
    summ.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="each job starts no new round after about N s",
    )
    summ.set_defaults(func=cmd_summarize)
