"""The embedded PostgreSQL (pgserver) of the test run.

Run as root, pgserver runs the server as a system user of its own
(`pgserver`), and so does everything that reaches the server's socket by
its path as that user (pgbouncer: tests/utils/pgbouncer.py). pgserver opens
the directories above the data directory to it once, at start; but pytest
sets /tmp/pytest-of-<user> back to 0700 whenever a pytest session of that
user starts on the machine (any other run, of this suite or not), and from
then on that user can no longer reach anything under pytest's temporary
directories: a pgbouncer started then fails every connect to the server
("sbuf_connect failed: Permission denied") and holds its clients until
their connect_timeout, and an initdb or pg_ctl of that moment fails. So
the data directory is one of our own, outside pytest's (`private_server`).

pgserver starts the server with `pg_ctl -w start`, which waits for the
server to say it is ready (its postmaster.pid), but under a 10 s subprocess
timeout, which a fresh cluster's first start on a loaded machine can
exceed: `get_server` lets pg_ctl's own readiness wait decide, bounded by
PGCTLTIMEOUT.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.utils.processes import STARTUP_SECONDS


def get_server(data_dir: Path, cleanup_mode: str | None = "stop") -> Any:
    """`pgserver.get_server(data_dir, cleanup_mode)`, waiting as long as the
    server takes to report ready (up to STARTUP_SECONDS)."""
    from pgserver import postgres_server

    # The name its start calls pg_ctl by.
    names = vars(postgres_server)
    ctl = names["pg_ctl"]

    def patient_ctl(args: list[str], **kwargs: Any) -> str:
        if "start" in args:
            kwargs.pop("timeout", None)
            environment = kwargs.get("env") or os.environ
            kwargs["env"] = {**environment, "PGCTLTIMEOUT": str(int(STARTUP_SECONDS))}
        return str(ctl(args, **kwargs))

    names["pg_ctl"] = patient_ctl
    try:
        return postgres_server.get_server(data_dir, cleanup_mode=cleanup_mode)
    finally:
        names["pg_ctl"] = ctl


@contextmanager
def private_server() -> Iterator[str]:
    """An embedded server in a temporary directory of its own (not pytest's),
    stopped and deleted after the block: its owner's URI."""
    home = Path(tempfile.mkdtemp(prefix="memchat-test-postgres-"))
    try:
        server = get_server(home / "pgdata", cleanup_mode="delete")
        try:
            yield str(server.get_uri())
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(home, ignore_errors=True)
