"""`memchat`: run the API locally, migrate, mint dev tokens, chat, clean up.

With no DATABASE_URL, every command uses the embedded PostgreSQL under
`.memchat/` (started on demand), so nothing needs to be installed or run
beforehand.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket
    from collections.abc import Iterable, Iterator

    from fastapi import FastAPI

    from memchat.config import Settings

DEFAULT_EMAIL = "dev@example.test"
DEFAULT_URL = "http://127.0.0.1:8000"
SSE_MEDIA_TYPE = "text/event-stream"


def _err(message: str) -> None:
    print(message, file=sys.stderr)


def _database_url(*, note_start: bool = True) -> str:
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
        _err(
            f"note: started the embedded PostgreSQL at {devdb.data_dir()}; it keeps running"
            " (`memchat db stop` stops it)"
        )
    return url


def _role_url(owner_url: str, role: str) -> str | None:
    """`owner_url` logging in as `role`, if that role can log in there without
    a password (the embedded server; a local server that trusts local logins)."""
    import psycopg

    from memchat import devdb
    from memchat.store.db import connect_kwargs

    url = devdb.role_conninfo(owner_url, role)
    try:
        psycopg.connect(url, **connect_kwargs()).close()
    except psycopg.OperationalError:
        return None
    return url


def _api_url(owner_url: str) -> str:
    """What `memchat dev` serves the API with: the memchat_api role, as deployed."""
    from memchat import devdb

    url = _role_url(owner_url, devdb.API_ROLE)
    if url is None:
        _err(
            f"note: cannot log in as {devdb.API_ROLE} (no password set?), so the API connects"
            " with DATABASE_URL's role; users are still kept apart by the per-request role"
            " switch and RLS. See docs/deploy.md, 'Database roles'."
        )
        return owner_url
    return url


def _jwt_secret() -> str:
    secret = os.environ.get("SUPABASE_JWT_SECRET")
    if secret:
        return secret
    from memchat import devdb

    return devdb.dev_jwt_secret()


def _migrate(url: str) -> None:
    from memchat.store.migrations import migrate

    applied = migrate(url)
    _err(f"migrations: {len(applied)} applied" + (f" ({', '.join(applied)})" if applied else ""))


# ------------------------------------------------------------------ dev


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
(exit code 1) when --port is taken. Logs go to stderr, one line per request
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
    worker: _SummaryWorker | None = None


def cmd_dev(args: argparse.Namespace) -> int:
    import signal

    from memchat import logs

    level = os.environ.get("LOG_LEVEL", "INFO").strip().upper()
    if level not in LOG_LEVELS:
        _err(f"LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
        return 2
    logs.configure_dev(level)
    if level == "INFO":
        # The worker's run record, every --summary-every seconds: JSON fields
        # for CloudWatch, noise here (it says when it summarized something).
        logging.getLogger("memchat.usecases.summarize").setLevel(logging.WARNING)
    previous = signal.getsignal(signal.SIGINT), signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        # The port first: nothing is started, nor printed, for a server that cannot listen.
        try:
            sock = _listen(args.host, args.port)
        except OSError as exc:
            _err(
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
            _err("\nmemchat dev: stopping")
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
        url = _database_url(note_start=False)
        how = (
            "started now; stopped when memchat dev stops"
            if run.started_db
            else "already running; left running when memchat dev stops (memchat db stop)"
        )
        _err(f"database:   embedded PostgreSQL at {devdb.data_dir()} ({how})")
    else:
        url = _database_url()
        _err("database:   DATABASE_URL")
    _migrate(url)
    os.environ.setdefault("SUPABASE_JWT_SECRET", _jwt_secret())
    overrides: dict[str, Any] = {"db_max_connections": 10, "database_url": _api_url(url)}
    if not os.environ.get("OPENAI_API_KEY"):
        overrides["offline_model"] = True
        banner = "!" * 72
        _err(
            f"\n{banner}\n  OPENAI_API_KEY is not set: answers come from the OFFLINE RESPONDER,"
            f"\n  a stand-in that echoes and remembers, labelled in every answer."
            f"\n  Set OPENAI_API_KEY (and OPENAI_BASE_URL for other providers) for a real model."
            f"\n{banner}\n"
        )
    port = int(sock.getsockname()[1])  # --port 0: the one the system chose
    base = f"http://{args.host}:{port}"
    if not os.environ.get("CORS_ALLOW_ORIGINS"):
        overrides["cors_allow_origins"] = [base, "http://localhost:3000", "http://localhost:5173"]
    from memchat.config import ConfigError, load_settings

    try:
        settings = load_settings(**overrides)
    except ConfigError as exc:
        _err(str(exc))
        return 2
    import uvicorn

    from memchat.api.main import create_app

    app = create_app(settings)
    try:
        app.state.memchat.chat.recall.check_at_start()
    except ConfigError as exc:
        _err(str(exc))
        return 2
    _add_chat_page(app)
    if args.summary_every > 0:
        run.worker = _SummaryWorker(_worker_settings(url, overrides), args.summary_every)
    page_token = mint_local_token(None, DEFAULT_EMAIL, 3600 * 12)
    _err(model_line(settings))
    _err(f"API on {base}   docs: {base}/docs")
    _err(f"chat page:  {base}/#token={page_token}")
    _err("terminal:   memchat chat        a token for curl:   memchat token")
    _err("logs:       one line per request below; Ctrl-C stops")
    # The app logs each request itself (memchat.logs); uvicorn's records go
    # through the same handler (log_config=None), warnings and up.
    config = uvicorn.Config(app, log_level="warning", access_log=False, log_config=None)
    uvicorn.Server(config).run(sockets=[sock])
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
    if not run.embedded:
        return True
    if not run.started_db:
        if devdb.status().running:
            _err(
                "memchat dev: the embedded PostgreSQL is left running, as it was before"
                " (memchat db stop stops it)"
            )
        return True
    try:
        pid = devdb.stop()
    except devdb.StopError as exc:
        _err(f"memchat dev: {exc}")
        return False
    if pid is not None:
        _err(f"memchat dev: stopped the embedded PostgreSQL it started (pid {pid})")
    return True


def model_line(settings: Settings) -> str:
    """Which model answers, at which URL, with which key (masked)."""
    if settings.offline_model:
        return (
            "model:      the offline responder (OPENAI_API_KEY is not set);"
            " recall: a local stand-in embedder"
        )
    base = (
        _shown_url(settings.openai_base_url)
        if settings.openai_base_url
        else "https://api.openai.com/v1 (OPENAI_BASE_URL unset)"
    )
    return (
        f"model:      {settings.openai_model} at {base}, key"
        f" {mask_key(settings.openai_api_key or '')}; embeddings:"
        f" {settings.openai_embedding_model}"
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


def _add_chat_page(app: FastAPI) -> None:
    """A small browser chat page at / (local development only)."""
    from importlib.resources import files

    from fastapi.responses import HTMLResponse

    page = (files("memchat") / "static" / "chat.html").read_text(encoding="utf-8")

    @app.get("/", include_in_schema=False)
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(page)


def _worker_settings(owner_url: str, overrides: dict[str, Any]) -> Settings:
    """Settings for the summary worker: its own role where it can log in."""
    from memchat import devdb
    from memchat.config import load_settings

    worker_url = _role_url(owner_url, devdb.WORKER_ROLE) or owner_url
    values = {**overrides, "database_url": worker_url, "route_groups": "summaries"}
    values.pop("cors_allow_origins", None)
    if not os.environ.get("OPENAI_API_KEY"):
        values["offline_model"] = True
    return load_settings(**values)


class _SummaryWorker:
    """The summary worker, every `every` seconds, beside `memchat dev` (what
    the deployed SummaryFunction does on its schedule), until `stop()`."""

    def __init__(self, settings: Settings, every: float) -> None:
        import threading

        self.settings = settings
        self.every = every
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="summaries", daemon=True)
        self.thread.start()
        _err(f"summaries:  the worker runs every {every:g} s (--summary-every)")

    def _run(self) -> None:
        import asyncio

        asyncio.run(self._keep_summarizing())

    async def _keep_summarizing(self) -> None:
        import asyncio

        from memchat import logs
        from memchat.usecases.summarize import Summarizer

        log = logging.getLogger("memchat.summaries")
        summarizer = Summarizer.for_settings(self.settings)
        try:
            while not self.stopping.is_set():
                try:
                    run = await summarizer.run(max_seconds=60)
                    if run.summarized:
                        log.info("summarized %d session(s)", run.summarized)
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


# --------------------------------------------------------------------- db

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
        _err("note: DATABASE_URL is set; `memchat db` is about the embedded server only")
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
        _err(str(exc))
        return 1
    if pid is None:
        print(f"not running: {devdb.data_dir()} (nothing to stop)")
    else:
        print(f"stopped (pid {pid}): {devdb.data_dir()}")
    return 0


# ---------------------------------------------------------------- migrate


def cmd_migrate(args: argparse.Namespace) -> int:
    if "DATABASE_URL" not in os.environ:
        _err("DATABASE_URL is not set: migrating the embedded PostgreSQL under .memchat/")
    _migrate(_database_url())
    return 0


# ------------------------------------------------------------------ token


def default_email(user_id: uuid.UUID | None) -> str:
    """The dev user's email, or one of the given user's own (never another's)."""
    return f"{user_id}@example.test" if user_id else DEFAULT_EMAIL


def ensure_user(url: str, user_id: uuid.UUID | None, email: str) -> uuid.UUID:
    """The local user with this id or email, created if missing (never on Supabase)."""
    from memchat.store.db import connect
    from memchat.store.users import LocalUserError, ensure_local_user

    with connect(url) as conn:
        try:
            return ensure_local_user(conn, user_id, email)
        except LocalUserError as exc:
            raise SystemExit(str(exc)) from None


def mint_local_token(user_id: uuid.UUID | None, email: str | None, ttl_seconds: int) -> str:
    from memchat import devtokens

    url = _database_url()
    email = email or default_email(user_id)
    resolved = ensure_user(url, user_id, email)
    issuer = os.environ.get("SUPABASE_URL")
    return devtokens.mint(
        _jwt_secret(),
        resolved,
        email=email,
        ttl_seconds=ttl_seconds,
        issuer=f"{issuer.rstrip('/')}/auth/v1" if issuer else None,
    )


def cmd_token(args: argparse.Namespace) -> int:
    token = mint_local_token(args.user_id, args.email, args.ttl)
    print(token)
    return 0


# ------------------------------------------------------------------- chat


def cmd_chat(args: argparse.Namespace) -> int:
    import httpx2 as httpx  # ships with the openai SDK (>= 3)

    token = (
        args.token
        or os.environ.get("MEMCHAT_TOKEN")
        or mint_local_token(None, DEFAULT_EMAIL, 3600 * 12)
    )
    session_id = str(uuid.uuid4())  # an ephemeral session for this run
    headers = {"Authorization": f"Bearer {token}"}
    print(f"memchat · agent {args.agent} · session {session_id}")
    print("Ctrl-D or /quit to leave, /clear to start over, /notes to see long-term notes;")
    print("Ctrl-C stops an answer (the server still stores it).\n")
    with httpx.Client(base_url=args.url, headers=headers, timeout=120) as client:
        while True:
            try:
                line = input("you> ").strip()
            except (EOFError, KeyboardInterrupt):
                print()
                break
            if not line:
                continue
            if line in ("/quit", "/exit"):
                break
            try:
                session_id = _chat_command(client, line, session_id, args.agent)
            except httpx.HTTPError as exc:
                print(f"! cannot reach {args.url}: {exc}")
            except _Handled:
                continue
            except KeyboardInterrupt:
                print()
                break
    print(f"bye (session {session_id})")
    return 0


def _chat_command(client: Any, line: str, session_id: str, agent: str) -> str:
    if line == "/clear":
        r = client.post("/chat/clear-session", json={"session_id": session_id, "agent_name": agent})
        if r.status_code == 404:
            print("(nothing to clear yet)")
            return session_id
        _raise_for(r)
        new_id: str = r.json()["new_session_id"]
        print(f"(cleared {r.json()['deleted_messages']} messages; new session {new_id})")
        return new_id
    if line == "/notes":
        r = client.get("/memory", params={"agent_name": agent})
        _raise_for(r)
        print(r.json()["notes"] or "(no notes yet)")
        return session_id
    _stream_turn(client, line, session_id, agent)
    return session_id


def _stream_turn(client: Any, line: str, session_id: str, agent: str) -> None:
    """One turn as Server-Sent Events, its answer printed as the model writes it.

    Failures before the stream starts are HTTP errors (`_raise_for`); an
    `error` event is printed and the session stays usable. Ctrl-C stops the
    printing only: the server still finishes and stores the turn."""
    out = _AnswerPrinter(f"{agent}> ")
    body = {"message": line, "session_id": session_id, "agent_name": agent}
    try:
        with client.stream("POST", "/chat", json=body, headers={"Accept": SSE_MEDIA_TYPE}) as r:
            if r.status_code >= 400:
                r.read()
                _raise_for(r)
            for event, data in _sse_events(r.iter_lines()):
                if event == "delta":
                    out.write(str(data.get("text", "")))
                elif event == "notes":
                    out.notice(f"(notes: {data.get('operation')})")
                elif event == "done":
                    out.finish(str(data.get("answer", "")), _notes_updated(data))
                    return
                elif event == "error":
                    out.notice(f"! {data.get('error')}: {data.get('detail')}\n")
                    return
            out.notice("! the answer ended early: the connection closed\n")
    except KeyboardInterrupt:
        out.notice("(stopped; the server still finishes and stores this turn)\n")
    finally:
        out.end_line()


def _notes_updated(done: dict[str, Any]) -> bool:
    memory = done.get("memory")
    return isinstance(memory, dict) and memory.get("long_term_notes_updated") is True


def _sse_events(lines: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) of each Server-Sent Event with a JSON object (comments skipped)."""
    event = "message"
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                try:
                    parsed = json.loads("\n".join(data))
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    yield event, parsed
            event, data = "message", []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)


class _AnswerPrinter:
    """Prints an answer piece by piece after its prefix; notices on lines of their own."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._printed = ""
        self._open = False  # a line of the answer is being written

    def write(self, text: str) -> None:
        if not text:
            return
        if not self._open:
            # After a notice the answer goes on, indented under its prefix.
            sys.stdout.write(self._prefix if not self._printed else " " * len(self._prefix))
            self._open = True
        sys.stdout.write(text)
        sys.stdout.flush()
        self._printed += text

    def end_line(self) -> None:
        if self._open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._open = False

    def notice(self, message: str) -> None:
        self.end_line()
        print(message, flush=True)

    def finish(self, answer: str, notes_updated: bool) -> None:
        """The stored answer (done.answer): what streamed, unless it differs."""
        if not self._printed or not self._printed.endswith(answer):
            self.end_line()
            sys.stdout.write(self._prefix + answer)
            self._open = True
        note = " (notes updated)" if notes_updated else ""
        print(note, flush=True)
        self._open = False
        print()


def _raise_for(response: Any) -> None:
    if response.status_code >= 400:
        try:
            body = response.json()
            message = f"{body.get('error')}: {body.get('detail')}"
        except ValueError:
            message = response.text[:200]
        print(f"! {response.status_code} {message}")
        raise _Handled()


class _Handled(Exception):
    pass


# ---------------------------------------------------------------- cleanup


def cmd_cleanup(args: argparse.Namespace) -> int:
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING").upper())
    from memchat.config import ConfigError
    from memchat.usecases.cleanup import run_cleanup, settings_from_env

    try:
        batch_size, pause_factor = settings_from_env()
    except ConfigError as exc:
        _err(str(exc))
        return 2
    result = run_cleanup(
        _cleanup_url(),
        batch_size=args.batch_size or batch_size,
        pause_factor=pause_factor if args.pause_factor is None else args.pause_factor,
        max_seconds=args.max_seconds,
        dry_run=args.dry_run,
    )
    print(json.dumps(result.as_dict(), indent=2))
    return 0


def _cleanup_url() -> str:
    """The cleanup's own role, as deployed, where it can log in; else DATABASE_URL's."""
    from memchat import devdb

    url = _database_url()
    return _role_url(url, devdb.CLEANUP_ROLE) or url


# -------------------------------------------------------------- summarize


def cmd_summarize(args: argparse.Namespace) -> int:
    """Summarize the sessions that are due now (what the SummaryFunction does)."""
    import asyncio

    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING").upper())
    from memchat.config import ConfigError
    from memchat.usecases.summarize import Summarizer

    try:
        settings = _worker_settings(_database_url(), {})
    except ConfigError as exc:
        _err(str(exc))
        return 2

    async def once() -> dict[str, Any]:
        summarizer = Summarizer.for_settings(settings)
        try:
            return (await summarizer.run(max_seconds=args.max_seconds)).as_dict()
        finally:
            await summarizer.close()

    print(json.dumps(asyncio.run(once()), indent=2))
    return 0


# ------------------------------------------------------------------ stats


def cmd_stats(args: argparse.Namespace) -> int:
    """The operator's analytics (memchat_analytics, docs/analytics.md), read
    as memchat_analyst through DATABASE_URL's login."""
    from memchat.usecases import analytics

    if not 1 <= args.days <= analytics.MAX_DAYS:
        _err(f"--days must be from 1 to {analytics.MAX_DAYS}")
        return 2
    try:
        report = analytics.read_report(_database_url(), days=args.days, agent=args.agent)
    except analytics.AnalyticsError as exc:
        _err(str(exc))
        return 1
    if report.note:
        _err(f"note: {report.note}")
    print(json.dumps(report.as_dict(), indent=2) if args.json else analytics.render(report))
    return 0


# ------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memchat", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser(
        "dev",
        help="run the API locally (embedded PostgreSQL if no DATABASE_URL)",
        description=DEV_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument(
        "--summary-every",
        type=float,
        default=10.0,
        help="run the summary worker every N seconds in the background (0: never; default 10)",
    )
    dev.set_defaults(func=cmd_dev)

    db = sub.add_parser(
        "db",
        help="the embedded PostgreSQL under $MEMCHAT_HOME (default .memchat/): status, stop",
        description=DB_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser(
        "status", help="running or not (exit code 3 if not), its pid and connection URI"
    ).set_defaults(func=cmd_db)
    db_sub.add_parser(
        "stop", help="stop it (fast: open transactions roll back, clients are disconnected)"
    ).set_defaults(func=cmd_db)

    mig = sub.add_parser("migrate", help="apply supabase/migrations to DATABASE_URL")
    mig.set_defaults(func=cmd_migrate)

    tok = sub.add_parser("token", help="print a dev access token (creates the user locally)")
    tok.add_argument("--user-id", type=uuid.UUID, default=None)
    tok.add_argument(
        "--email", default=None, help=f"default {DEFAULT_EMAIL}, or <user-id>@example.test"
    )
    tok.add_argument("--ttl", type=int, default=3600, help="seconds (default 3600)")
    tok.set_defaults(func=cmd_token)

    chat = sub.add_parser("chat", help="chat in the terminal (a new session per run)")
    chat.add_argument("--agent", default="default")
    chat.add_argument("--url", default=os.environ.get("MEMCHAT_URL", DEFAULT_URL))
    chat.add_argument("--token", default=None, help="access token (default: a local dev token)")
    chat.set_defaults(func=cmd_chat)

    clean = sub.add_parser("cleanup", help="delete expired sessions now")
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

    summ = sub.add_parser("summarize", help="refresh the rolling summaries that are due now")
    summ.add_argument("--max-seconds", type=float, default=None, help="stop after about N s")
    summ.set_defaults(func=cmd_summarize)

    stats = sub.add_parser("stats", help="usage, feedback and memory analytics across all users")
    stats.add_argument(
        "--days", type=int, default=7, help="the last N days, UTC, today included (default 7)"
    )
    stats.add_argument("--agent", default=None, help="only this agent, where a view has agents")
    stats.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    stats.set_defaults(func=cmd_stats)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except _Handled:
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
