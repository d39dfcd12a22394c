"""`memchat db status|stop` (the embedded PostgreSQL), `memchat db reembed`
(the stored embeddings: their column's size, and every message embedded with
the configured model), `memchat db diff` (a migration from the schema files),
`memchat db distribute` (the tables on Citus) and `memchat migrate`."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from memchat.cli.base import add_described_command, database_url, err

if TYPE_CHECKING:
    from memchat.cli.base import Subcommands
    from memchat.config import Settings
    from memchat.usecases.backfill import EmbeddingRun

DB_DESCRIPTION = """\
status, stop: the embedded PostgreSQL that memchat commands start when
DATABASE_URL is unset, by its data directory $MEMCHAT_HOME/pgdata (default
.memchat/pgdata in the current directory). `memchat dev` stops the server it
started when it stops; one started by another command (memchat token,
migrate, chat...), or left by a crash, keeps running until `memchat db stop`.

reembed: the stored embeddings, on DATABASE_URL (or the embedded server).

diff: the migration that makes supabase/migrations agree with
supabase/schemas, written for what can be written from their difference.

distribute: memchat's tables on the Citus coordinator at DATABASE_URL.
"""

DISTRIBUTE_DESCRIPTION = """\
On a Citus coordinator (DATABASE_URL, the owner's connection, migrated with
`memchat migrate`): make every table of a user's rows a distributed table,
hash-distributed by user_id and co-located with public.chat_sessions, and
the small shared tables (auth.users, the limits, the word statistics, the
analytics key) reference tables, in one transaction. On the way it gives the
policies the form Citus takes (supabase/citus/policies.sql), keeps the
foreign keys and triggers, and sets what the login roles need on Citus
(docs/deploy.md, "Citus"). Run again, it moves nothing. Where the database
has no citus extension it refuses (exit code 2) and changes nothing.
"""

REEMBED_DESCRIPTION = """\
Embed every stored message (of live sessions) that has no embedding of the
configured model: OPENAI_EMBEDDING_MODEL at EMBEDDING_BASE_URL (or
OPENAI_BASE_URL), EMBEDDING_DIMENSIONS floats; with --embeddings local, the
local all-MiniLM-L6-v2 (384). It needs a provider: OPENAI_API_KEY, or
EMBEDDING_API_KEY or EMBEDDING_BASE_URL, or --embeddings local (with none
of them it refuses, exit code 2: it never stores `memchat dev`'s offline
stand-in embeddings in a database). Run it after changing the embedding model or
size, and once after the migration that began recording models (the
embeddings stored before it are of an unknown model and never recalled;
--adopt-unknown marks them as the configured model's instead, if it made
them).

--memories first makes the durable memories (docs/api.md, "Memories") that
the live sessions' messages and summaries lack: those stored before
durable memory, or before a change of what it keeps of a message, which
the backfill never reads again. Run it once after such an upgrade; a
memory that is its whole message takes the message's embedding, the
others are embedded here.

--dimensions N first changes the stored column to vector(N) (the embeddings
of another size are deleted, in the same transaction: their messages stay,
and are embedded again here); EMBEDDING_DIMENSIONS must then be N for the
API and the worker (they refuse to start, or to embed, otherwise).

It works through the embedding backfill's queue (what the summary worker
runs): every session with such a message is queued, and the messages are
embedded in batches of EMBEDDING_BATCH_SIZE, stored as they come, with a
progress bar on a terminal. Stopped (Ctrl-C, a failing provider), it leaves
the rest queued: the next run, or the deployed worker, continues where it
stopped.

It connects with DATABASE_URL as it is: the owner's connection, with the
migrations' rights (it changes the table and reads every user's messages),
never the API's or the worker's.
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


def cmd_distribute(args: argparse.Namespace) -> int:
    from memchat.store.distribute import NotCitus, distribute

    if "DATABASE_URL" not in os.environ:
        err("DATABASE_URL is not set: `memchat db distribute` needs a Citus coordinator")
        return 2
    try:
        done = distribute(database_url())
    except NotCitus as exc:
        err(f"db distribute: {exc}")
        return 2
    if not done.changed:
        print(f"Citus {done.citus_version}: every table already in place")
        return 0
    print(
        f"Citus {done.citus_version}: {len(done.distributed)} tables distributed by user_id,"
        f" {len(done.reference)} reference tables"
    )
    for table in (*done.distributed, *done.reference):
        print(f"  {table}")
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


DIFF_DESCRIPTION = """\
Build the schema twice, in two scratch databases on DATABASE_URL's server
(or the embedded one; a development server, where the connection may
create and drop databases): once from supabase/migrations, once from
supabase/schemas (the files supabase/config.toml lists in [db.migrations]
schema_paths). Where their catalogs differ, write
supabase/migrations/<version>_<name>.sql with what makes the first agree
with the second, as far as it can be written from the two catalogs:

  functions     create or replace (drop and create when the arguments or
                the result change; drop when gone); a function another
                writes when it runs (memchat.nearest_keys_indexed) is made
                again by running that one (memchat.index_recall_keys)
  views         dropped and made again, with those that read them
  policies      dropped and made again; row-level security on or off
  triggers      dropped and made again
  privileges    on schemas, tables, views, sequences, columns, functions
  comments      on any of those, tables and columns included

The migration is then applied to the first scratch database, and what still
differs is listed: it needs a migration written by hand (or added to the
written one), and the command exits 1. Not written: tables, columns,
constraints, indexes, partitions and their storage parameters, types,
sequences, schemas, extensions, rows (memchat.limits' and the analytics
key's, a backfill), and the roles, their memberships and settings (the
server's, which the catalogs compared do not hold: a change to them is
always a migration of its own). Read what it wrote before you apply it:
a dropped function or view is dropped for good, and the order that works
on a scratch database may need care on one with data.

Nothing differs: nothing is written (exit code 0). With the Supabase CLI,
`supabase db diff -f <name>` computes its own diff of the same two (see
docs/deploy.md, "Changing the schema").
"""


def cmd_db_diff(args: argparse.Namespace) -> int:
    """`memchat db diff`: a migration for what the schema files changed."""
    from pathlib import Path

    from memchat.store.migrations import (
        SUPABASE_DIR,
        MigrationError,
        next_version,
        schema_diff,
    )

    supabase_dir = Path(args.supabase_dir) if args.supabase_dir else SUPABASE_DIR
    if not re.fullmatch(r"[a-z0-9_]{1,64}", args.name):
        err("db diff: --name is lower-case letters, digits and _ (a migration file's name)")
        return 2
    try:
        diff = schema_diff(database_url(), supabase_dir)
    except MigrationError as exc:
        err(f"db diff: {exc}")
        return 1
    if not diff.statements and not diff.remaining:
        err("db diff: the schema files and the migrations build the same schema")
        return 0
    if diff.statements:
        migration = diff.migration()
        if args.print:
            sys.stdout.write(migration)
        else:
            migrations = supabase_dir / "migrations"
            path = migrations / f"{next_version(migrations)}_{args.name}.sql"
            path.write_text(migration)
            err(f"db diff: wrote {path}:")
        for what in diff.written:
            err(f"  {what}")
    if diff.remaining:
        err("db diff: still different, for a migration written by hand:")
        for difference in diff.remaining:
            err(f"  {difference}")
        return 1
    return 0


def cmd_reembed(args: argparse.Namespace) -> int:
    """`memchat db reembed`: the column's size if asked, then every message
    lacking an embedding of the configured model embedded."""
    import asyncio
    import logging

    from memchat import store
    from memchat.config import ConfigError

    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING").upper())
    url = database_url()
    server = None
    try:
        overrides: dict[str, Any] = {"database_url": url, "job": "summaries"}
        if args.embeddings == "local":
            from memchat.cli.embeddings import local_settings, start_server

            server = start_server("127.0.0.1", 0, background=True)
            overrides.update(local_settings(server))
        if args.dimensions is not None:
            overrides["embedding_dimensions"] = args.dimensions
        if not os.environ.get("OPENAI_API_KEY"):
            overrides["offline_model"] = True
        try:
            settings = _reembed_settings(overrides)
        except ConfigError as exc:
            err(str(exc))
            return 2
        if settings.offline_model and settings.embeddings_shared:
            # No provider at all: the stand-in would fill the database with
            # vectors no real model made (and recall would compare them).
            err(
                "reembed: no embeddings provider is configured: set OPENAI_API_KEY (or"
                " EMBEDDING_API_KEY and/or EMBEDDING_BASE_URL for another provider), or"
                " pass --embeddings local to embed with all-MiniLM-L6-v2 on this machine"
            )
            return 2
        with store.connect(url) as conn:
            if not _fit_column(conn, settings, resize=args.dimensions is not None):
                return 2
            model = _embedding_model(settings)
            if args.adopt_unknown:
                adopted = store.adopt_unknown_embeddings(conn, model)
                err(f"reembed: {adopted} embeddings of an unknown model marked as {model}'s")
            if args.memories:
                from memchat.usecases.backfill import remember_stored

                made = remember_stored(conn, model)
                err(f"reembed: {made} memories made of stored messages and summaries")
            sessions = store.queue_unembedded(conn, model)
            total = store.count_unembedded(conn, model)
        err(f"reembed: {total} messages in {sessions} sessions to embed with {model}")
        run = asyncio.run(_embed_queued(settings, total))
        with store.connect(url) as conn:
            left = store.count_unembedded(conn, model)
    finally:
        if server is not None:
            server.close()
    err(
        f"reembed: {run.embedded} embedded in {run.duration_ms / 1000:.1f} s; {left} left"
        f" ({run.memories} memories embedded)"
    )
    if left:
        err("reembed: run it again to continue (the provider failed? see above)")
        return 1
    return 0


def _reembed_settings(overrides: dict[str, Any]) -> Settings:
    from memchat.config import load_settings

    return load_settings(**overrides)


def _embedding_model(settings: Settings) -> str:
    """The model name the backfill records."""
    from memchat.model.client import ModelClient

    return ModelClient(settings).embedding_model


def _fit_column(conn: Any, settings: Settings, *, resize: bool) -> bool:
    """Whether the column has EMBEDDING_DIMENSIONS (after changing it, with
    `resize`); says what it did or why not."""
    from memchat import store

    stored = store.embedding_dimensions(conn, role=None)
    wanted = settings.embedding_dimensions
    if stored == wanted:
        return True
    if not resize:
        err(
            f"reembed: the database stores vector({stored}) embeddings but"
            f" EMBEDDING_DIMENSIONS is {wanted}: pass --dimensions {wanted} to change the"
            f" column (its vector({stored}) embeddings are deleted), or set"
            f" EMBEDDING_DIMENSIONS={stored}"
        )
        return False
    deleted = store.resize_embeddings(conn, wanted)
    err(
        f"reembed: the column is now vector({wanted});"
        f" {deleted} vector({stored}) embeddings deleted"
    )
    return True


async def _embed_queued(settings: Settings, total: int) -> EmbeddingRun:
    """The backfill, with the owner's connection, until the queue is empty (or stuck)."""
    from memchat import bootstrap

    embedder = bootstrap.embedder(settings)
    progress = _Progress(total)
    embedder.on_stored = progress.advance
    try:
        return await embedder.run()
    finally:
        progress.close()
        await embedder.close()


class _Progress:
    """A progress bar on stderr, when it is a terminal (else silent)."""

    WIDTH = 30

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.started = time.monotonic()
        self.shown = 0.0
        self.on = sys.stderr.isatty()

    def advance(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if self.on and (now - self.shown > 0.2 or self.done >= self.total):
            self.shown = now
            share = min(self.done / self.total, 1.0) if self.total else 1.0
            bar = "#" * int(share * self.WIDTH)
            rate = self.done / max(now - self.started, 1e-9)
            sys.stderr.write(
                f"\r[{bar:<{self.WIDTH}}] {self.done}/{self.total} messages, {rate:.0f}/s"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.on and self.shown:
            sys.stderr.write("\n")


def register(commands: Subcommands) -> None:
    db = add_described_command(
        commands,
        "db",
        "the embedded PostgreSQL under $MEMCHAT_HOME (default .memchat/): status, stop;"
        " the stored embeddings: reembed; the schema: diff",
        DB_DESCRIPTION,
    )
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser(
        "status", help="running or not (exit code 3 if not), its pid and connection URI"
    ).set_defaults(func=cmd_db)
    db_sub.add_parser(
        "stop", help="stop it (fast: open transactions roll back, clients are disconnected)"
    ).set_defaults(func=cmd_db)
    reembed = db_sub.add_parser(
        "reembed",
        help="embed every stored message that has no embedding of the configured model"
        " (the owner's connection: migrations' rights)",
        description=REEMBED_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reembed.add_argument(
        "--dimensions",
        type=int,
        default=None,
        metavar="N",
        help="first change the stored column to vector(N), deleting embeddings of another size",
    )
    reembed.add_argument(
        "--adopt-unknown",
        action="store_true",
        help="mark embeddings of unknown model (stored before models were recorded) as the"
        " configured model's, instead of embedding their messages again",
    )
    reembed.add_argument(
        "--memories",
        action="store_true",
        help="first make the durable memories the live sessions' messages and summaries"
        " lack (stored before durable memory): once after upgrading to it",
    )
    reembed.add_argument(
        "--embeddings",
        choices=["provider", "local"],
        default="provider",
        help="local: embed with all-MiniLM-L6-v2 on this machine (384 dimensions)",
    )
    reembed.set_defaults(func=cmd_reembed)
    diff = db_sub.add_parser(
        "diff",
        help="write the migration that makes supabase/migrations agree with supabase/schemas"
        " (functions, views, policies, triggers, privileges, comments)",
        description=DIFF_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    diff.add_argument(
        "--name",
        default="schema_diff",
        help="the migration's name: supabase/migrations/<version>_<name>.sql (default schema_diff)",
    )
    diff.add_argument(
        "--print",
        action="store_true",
        help="print the migration instead of writing it",
    )
    diff.add_argument(
        "--supabase-dir",
        default=None,
        metavar="DIR",
        help="the supabase directory (config.toml, schemas/, migrations/); default the project's",
    )
    diff.set_defaults(func=cmd_db_diff)

    db_sub.add_parser(
        "distribute",
        help="on a Citus coordinator (DATABASE_URL): distribute the users' tables by user_id",
        description=DISTRIBUTE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).set_defaults(func=cmd_distribute)

    mig = commands.add_parser("migrate", help="apply supabase/migrations to DATABASE_URL")
    mig.set_defaults(func=cmd_migrate)
