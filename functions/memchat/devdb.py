"""The embedded PostgreSQL for local development and tests.

`pgserver` ships PostgreSQL 16 (with pgvector) as a Python package: no root,
no Docker, a data directory of our own, up in under a second. It listens
on a Unix socket inside the data directory only.
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
import warnings
from pathlib import Path

logger = logging.getLogger(__name__)

STATE_DIR = Path(os.environ.get("MEMCHAT_HOME", ".memchat"))


def start(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded server; returns its connection URI."""
    quiet_runtime_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server  # dev-only: imported where needed

    directory = (data_dir or STATE_DIR / "pgdata").resolve()
    directory.parent.mkdir(parents=True, exist_ok=True)
    server = get_server(directory, cleanup_mode=None)
    uri: str = server.get_uri()
    logger.info("embedded PostgreSQL at %s", directory)
    return uri


# The login roles of the migrations: the API's and the cleanup's
# (*_least_privilege.sql), the summary worker's (*_summaries.sql).
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
