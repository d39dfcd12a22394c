"""`memchat dev`: the API locally on one URL, with the chat page, the summary
worker and the embedding backfill, and (--embeddings local) a local
embeddings server."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memchat import bootstrap
from memchat.cli.base import add_described_command, database_url, err, jwt_secret, role_url
from memchat.cli.db import apply_migrations
from memchat.cli.summarize import worker_settings
from memchat.cli.token import DEFAULT_EMAIL, mint_local_token

if TYPE_CHECKING:
    import argparse
    import socket

    from memchat.cli.base import Subcommands
    from memchat.config import Settings
    from memchat.model.embedding_server import EmbeddingServer

DEV_DESCRIPTION = """\
Run the API locally on one URL: the chat page at /, docs at /docs.

Database: DATABASE_URL if set; otherwise the embedded PostgreSQL under
$MEMCHAT_HOME/pgdata (default .memchat/pgdata in the current directory).
If that server is not running, memchat dev starts it, and stops it again when
it stops itself (Ctrl-C or SIGTERM). If it was already running (another
memchat dev, another memchat command, or one left by a crash), memchat dev
uses it and leaves it running: `memchat db status` shows it, `memchat db
stop` stops it.

It prints the model it answers with (OPENAI_MODEL at OPENAI_BASE_URL, the key
masked; the offline responder without OPENAI_API_KEY), and refuses to start
(exit code 1) when --port is taken.

Embeddings (recall): from the model's provider, or EMBEDDING_BASE_URL. With
--embeddings local, from all-MiniLM-L6-v2 on this machine: memchat dev
starts the local embeddings server (`memchat embeddings serve`) on a free
port and points memchat at it (OPENAI_EMBEDDING_MODEL=all-MiniLM-L6-v2,
EMBEDDING_DIMENSIONS=384). The database's embedding column must then hold
384 dimensions: an empty one is changed at once; one holding embeddings of
another size is left alone and memchat dev refuses to start (exit code 2):
`memchat db reembed --dimensions 384 --embeddings local` changes it and
embeds every stored message again. Logs go to stderr, one line per request
(method, route, status, duration, request id, user id, and the client's
X-Request-ID when it is safe); LOG_LEVEL=DEBUG adds
an unexpected error's frames, never a request's content.
"""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _Terminated(BaseException):
    """SIGTERM, raised as Ctrl-C raises KeyboardInterrupt (no `except Exception` takes it)."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated()


@dataclass
class _DevRun:
    """What `memchat dev` started, to stop when it stops."""

    embedded: bool  # no DATABASE_URL: the embedded PostgreSQL
    started_db: bool = False  # ... which this run started (else: left running)
    worker: _BackgroundWorker | None = None
    embeddings: EmbeddingServer | None = None  # --embeddings local


def cmd_dev(args: argparse.Namespace) -> int:
    import signal

    from memchat import logs

    level = os.environ.get("LOG_LEVEL", "INFO").strip().upper()
    if level not in LOG_LEVELS:
        err(f"LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
        return 2
    logs.configure_dev(level)
    if level == "INFO":
        # The worker's run records, every --summary-every seconds: JSON fields
        # for CloudWatch, noise here (it says when it did something).
        logging.getLogger("memchat.usecases.summarize").setLevel(logging.WARNING)
        logging.getLogger("memchat.usecases.backfill").setLevel(logging.WARNING)
    previous = signal.getsignal(signal.SIGINT), signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        # The port first: nothing is started, nor printed, for a server that cannot listen.
        try:
            sock = _listen(args.host, args.port)
        except OSError as exc:
            err(
                f"memchat dev: cannot listen on {args.host}:{args.port}:"
                f" {exc.strerror or exc}. Is another memchat dev (or another server) using"
                " it? Stop that, or pass another --port."
            )
            return 1
        run = _DevRun(embedded="DATABASE_URL" not in os.environ)
        code = 0
        try:
            code = _dev(args, sock, run)
        except (KeyboardInterrupt, _Terminated):
            err("\nmemchat dev: stopping")
        finally:
            if not _stop_dev(sock, run):
                code = 1
        return code
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def _dev(args: argparse.Namespace, sock: socket.socket, run: _DevRun) -> int:
    from memchat import devdb

    if run.embedded:
        run.started_db = not devdb.status().running
        url = database_url(note_start=False)
        how = (
            "started now; stopped when memchat dev stops"
            if run.started_db
            else "already running; left running when memchat dev stops (memchat db stop)"
        )
        err(f"database:   embedded PostgreSQL at {devdb.data_dir()} ({how})")
    else:
        url = database_url()
        err("database:   DATABASE_URL")
    apply_migrations(url)
    os.environ.setdefault("SUPABASE_JWT_SECRET", jwt_secret())
    overrides: dict[str, Any] = {"db_max_connections": 10, "database_url": _api_url(url)}
    if not os.environ.get("OPENAI_API_KEY"):
        overrides["offline_model"] = True
        # The offline responder's follow-ups cost nothing: shown unless SUGGESTIONS says no.
        if "SUGGESTIONS" not in {name.upper() for name in os.environ}:
            overrides["suggestions"] = True
        banner = "!" * 72
        err(
            f"\n{banner}\n  OPENAI_API_KEY is not set: answers come from the OFFLINE RESPONDER,"
            f"\n  a stand-in that echoes and remembers, labelled in every answer."
            f"\n  Set OPENAI_API_KEY (and OPENAI_BASE_URL for other providers) for a real model."
            f"\n{banner}\n"
        )
    if args.embeddings == "local":
        code = _local_embeddings(url, run, overrides)
        if code:
            return code
    port = int(sock.getsockname()[1])  # --port 0: the one the system chose
    base = f"http://{args.host}:{port}"
    if not os.environ.get("CORS_ALLOW_ORIGINS"):
        overrides["cors_allow_origins"] = [base, "http://localhost:3000", "http://localhost:5173"]
    from memchat.config import ConfigError, load_settings

    try:
        settings = load_settings(**overrides)
        app = bootstrap.dev_app(settings)
    except ConfigError as exc:
        err(str(exc))
        return 2
    if args.summary_every > 0:
        run.worker = _BackgroundWorker(worker_settings(url, overrides), args.summary_every)
    page_token = mint_local_token(None, DEFAULT_EMAIL, 3600 * 12)
    err(model_line(settings))
    err(f"API on {base}   docs: {base}/docs")
    err(f"chat page:  {base}/#token={page_token}")
    err("terminal:   memchat chat        a token for curl:   memchat token")
    err("logs:       one line per request below; Ctrl-C stops")
    import uvicorn

    # The app logs each request itself (memchat.logs); uvicorn's records go
    # through the same handler (log_config=None), warnings and up.
    config = uvicorn.Config(app, log_level="warning", access_log=False, log_config=None)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _local_embeddings(owner_url: str, run: _DevRun, overrides: dict[str, Any]) -> int:
    """Start the local embeddings server and point the settings at it; make
    the database's column 384 wide if it holds no embedding. 0, or the exit
    code when that cannot be done (said why)."""
    from memchat import store
    from memchat.cli.embeddings import local_settings, start_server
    from memchat.model import minilm
    from memchat.model.minilm import ModelUnavailable

    try:
        run.embeddings = start_server("127.0.0.1", 0, background=True)
    except ModelUnavailable as exc:
        err(f"memchat dev --embeddings local: {exc}")
        return 2
    local = local_settings(run.embeddings)
    overrides.update(local)
    if "MEMORY_RECALL_MIN_SCORE" not in os.environ:
        overrides["memory_recall_min_score"] = minilm.RECALL_MIN_SCORE
        err(
            f"recall:     MEMORY_RECALL_MIN_SCORE={minilm.RECALL_MIN_SCORE}, {minilm.NAME}'s floor"
            " (set it to choose another)"
        )
    wanted = local["embedding_dimensions"]
    with store.connect(owner_url) as conn:
        stored = store.embedding_dimensions(conn, role=None)
        if stored != wanted and not store.has_embeddings(conn):
            store.resize_embeddings(conn, wanted)
            err(f"embeddings: the empty embedding column is now vector({wanted})")
        elif stored != wanted:
            err(
                f"memchat dev --embeddings local: the database stores vector({stored})"
                f" embeddings and all-MiniLM-L6-v2 makes {wanted} dimensions. Run `memchat db"
                f" reembed --dimensions {wanted} --embeddings local` (it deletes those"
                " embeddings and embeds every stored message again), or leave out --embeddings."
            )
            return 2
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, for uvicorn: bound before anything else
    starts, so a taken port stops `memchat dev` at once (OSError)."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        # As uvicorn binds: a port left in TIME_WAIT by the last run is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _stop_dev(sock: socket.socket, run: _DevRun) -> bool:
    """Stop what this run started (the worker, the embedded PostgreSQL);
    False if the database would not stop."""
    import signal

    from memchat import devdb

    # A second Ctrl-C or SIGTERM must not cut the database's stop short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock.close()
    if run.worker is not None:
        run.worker.stop()
    if run.embeddings is not None:
        run.embeddings.close()
    if not run.embedded:
        return True
    if not run.started_db:
        if devdb.status().running:
            err(
                "memchat dev: the embedded PostgreSQL is left running, as it was before"
                " (memchat db stop stops it)"
            )
        return True
    try:
        pid = devdb.stop()
    except devdb.StopError as exc:
        err(f"memchat dev: {exc}")
        return False
    if pid is not None:
        err(f"memchat dev: stopped the embedded PostgreSQL it started (pid {pid})")
    return True


def model_line(settings: Settings) -> str:
    """Which model answers, at which URL, with which key (masked), and which
    model embeds (and where, when that is not the model's provider)."""
    embeddings = f"embeddings: {settings.openai_embedding_model}"
    if not settings.embeddings_shared:
        url = settings.embedding_base_url or settings.openai_base_url
        where = _shown_url(url) if url else "https://api.openai.com/v1"
        embeddings += f" at {where} ({settings.embedding_dimensions} dimensions)"
    if settings.offline_model:
        recall = "recall: a local stand-in embedder" if settings.embeddings_shared else embeddings
        return f"model:      the offline responder (OPENAI_API_KEY is not set); {recall}"
    base = (
        _shown_url(settings.openai_base_url)
        if settings.openai_base_url
        else "https://api.openai.com/v1 (OPENAI_BASE_URL unset)"
    )
    return (
        f"model:      {settings.openai_model} at {base}, key"
        f" {mask_key(settings.openai_api_key or '')}; {embeddings}"
    )


def mask_key(key: str) -> str:
    """`sk-…abcd`: which key it is, never the key (the last four characters
    only of a key long enough to keep the rest hidden)."""
    prefix = "sk-" if key.startswith("sk-") else ""
    return f"{prefix}…{key[-4:] if len(key) >= 16 else ''}"


def _shown_url(url: str) -> str:
    """`url` without a user, password, query or fragment (they can hold keys)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _api_url(owner_url: str) -> str:
    """What `memchat dev` serves the API with: the memchat_api role, as deployed."""
    from memchat import devdb

    url = role_url(owner_url, devdb.API_ROLE)
    if url is None:
        err(
            f"note: cannot log in as {devdb.API_ROLE} (no password set?), so the API connects"
            " with DATABASE_URL's role; users are still kept apart by the per-request role"
            " switch and RLS. See docs/deploy.md, 'Database roles'."
        )
        return owner_url
    return url


class _BackgroundWorker:
    """The summary worker and the embedding backfill, every `every` seconds,
    beside `memchat dev` (what the deployed SummaryFunction does on its
    schedule), until `stop()`."""

    def __init__(self, settings: Settings, every: float) -> None:
        import threading

        self.settings = settings
        self.every = every
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="summaries", daemon=True)
        self.thread.start()
        err(
            f"summaries:  the worker (summaries, then embeddings) runs every {every:g} s"
            " (--summary-every)"
        )

    def _run(self) -> None:
        import asyncio

        asyncio.run(self._keep_summarizing())

    async def _keep_summarizing(self) -> None:
        import asyncio

        from memchat import logs

        log = logging.getLogger("memchat.summaries")
        summarizer, embedder = bootstrap.worker(self.settings)
        try:
            while not self.stopping.is_set():
                try:
                    run = await summarizer.run(max_seconds=60)
                    if run.summarized:
                        log.info("summarized %d session(s)", run.summarized)
                    embedded = await embedder.run(max_seconds=60)
                    if embedded.embedded:
                        log.info("embedded %d message(s)", embedded.embedded)
                except Exception as exc:
                    if self.stopping.is_set():
                        break
                    log.error("the summary worker failed; retrying", extra=logs.error_fields(exc))
                await asyncio.to_thread(self.stopping.wait, self.every)
        finally:
            await summarizer.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=15)


def register(commands: Subcommands) -> None:
    dev = add_described_command(
        commands,
        "dev",
        "run the API locally (embedded PostgreSQL if no DATABASE_URL)",
        DEV_DESCRIPTION,
    )
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument(
        "--summary-every",
        type=float,
        default=10.0,
        help="run the summary worker and the embedding backfill every N seconds in the"
        " background (0: never; default 10)",
    )
    dev.add_argument(
        "--embeddings",
        choices=["provider", "local"],
        default="provider",
        help="provider: the model's (or EMBEDDING_BASE_URL's; default); local: all-MiniLM-L6-v2"
        " on this machine, served in the background (384 dimensions)",
    )
    dev.set_defaults(func=cmd_dev)
