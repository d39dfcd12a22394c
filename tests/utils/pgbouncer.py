"""A real transaction-mode pooler (pgbouncer) in front of the test database.

Supabase's Supavisor hands each transaction whatever server connection is
free, as pgbouncer does in `pool_mode = transaction`: no server-side
prepared statements survive, and nothing set outside a transaction belongs
to the next client. Tests start one with a pool of one or two server
connections, so every request of every user shares them.

pgbouncer comes from Debian's packages (infra/test.sh installs it). It
refuses to run as root: as root it runs as the owner of the database's
socket directory (the embedded server's own system user), which can reach
that socket anyway, by its path, as long as nothing closes a directory on
that path to it (tests/utils/embedded_postgres.py: where the suite's server
lives, and why).

`start` returns once a connection of every user has gone through it to the
server and back. Until a pool has logged in to the server once, pgbouncer
holds each client's login (it has no server parameters to greet it with),
so the first connection of a test would otherwise be the one that waits for
pgbouncer's own connection to PostgreSQL, within the product's client
`connect_timeout`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.utils.processes import free_port, wait_ready

SEARCH_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/local/sbin"

# A port taken by another process between `free_port` and pgbouncer's bind.
PORT_ATTEMPTS = 3

# One readiness connection's wait for pgbouncer to log in to PostgreSQL
# (pgbouncer's `server_connect_timeout` is 15 s); `wait_ready` tries again
# until its own deadline.
READY_CONNECT_TIMEOUT = 30


def binary() -> str:
    found = shutil.which("pgbouncer", path=SEARCH_PATH)
    if found is None:
        raise RuntimeError(
            "pgbouncer is not installed: run the tests with infra/test.sh, which installs it"
            " (Debian: apt-get install pgbouncer)"
        )
    return found


@dataclass
class Pooler:
    """A running pgbouncer; `url(conninfo)` routes a connection string through it."""

    process: subprocess.Popen[bytes]
    port: int
    directory: Path
    # Why the last readiness connection failed, for the error if it never succeeds.
    last_error: str = field(default="", compare=False)

    def url(self, conninfo: str) -> str:
        params = conninfo_to_dict(conninfo)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo("", **params)

    def log(self) -> str:
        """Everything it printed: its log lines, and any error before it could log."""
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def output(self) -> str:
        last = f"last connection attempt: {self.last_error}\n" if self.last_error else ""
        return f"{last}{self.directory / 'pgbouncer.log'}:\n{self.log()}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        shutil.rmtree(self.directory, ignore_errors=True)


def start(server_conninfo: str, users: dict[str, str | None], pool_size: int) -> Pooler:
    """pgbouncer in transaction mode, `pool_size` server connections per (db, user).

    `server_conninfo` says where PostgreSQL listens (host, port, dbname);
    `users` are the login roles allowed through, with their passwords (None:
    the server trusts them).
    """
    output = ""
    for _ in range(PORT_ATTEMPTS):
        pooler = _launch(server_conninfo, users, pool_size)
        try:
            _wait_ready(pooler, server_conninfo, users)
        except BaseException:
            port_taken = pooler.process.poll() is not None and "already in use" in pooler.log()
            output = pooler.output()
            pooler.stop()
            if port_taken:
                continue
            raise
        return pooler
    raise RuntimeError(f"pgbouncer found no free port in {PORT_ATTEMPTS} attempts:\n{output}")


def _launch(server_conninfo: str, users: dict[str, str | None], pool_size: int) -> Pooler:
    server = conninfo_to_dict(server_conninfo)
    host = str(server.get("host") or "/tmp")
    dbname = str(server.get("dbname") or "postgres")
    port = free_port()
    directory = Path(tempfile.mkdtemp(prefix="memchat-pgbouncer-"))
    directory.chmod(0o755)  # readable by the unprivileged user it may run as
    userlist = "".join(f'"{name}" "{password or ""}"\n' for name, password in users.items())
    (directory / "userlist.txt").write_text(userlist)
    # No `logfile`: it logs to stderr, which goes to a file (see below).
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{dbname} = host={host} port={server.get('port') or 5432} dbname={dbname}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {directory / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "min_pool_size = 0\n"
        "reserve_pool_size = 0\n"
        "max_client_conn = 500\n"
        f"pidfile = {directory / 'pgbouncer.pid'}\n"
    )
    for path in directory.iterdir():
        path.chmod(0o644)
    command = [binary(), str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:
        owner = _owner_of(host)
        os.chown(directory, pwd.getpwnam(owner).pw_uid, -1)
        command = ["runuser", "-u", owner, "--", *command]
    # A file, never a pipe: pgbouncer writes every log line to stderr, and a
    # pipe nobody reads fills up and stops it mid-test, every client waiting.
    with (directory / "pgbouncer.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return Pooler(process, port, directory)


def _wait_ready(pooler: Pooler, server_conninfo: str, users: dict[str, str | None]) -> None:
    """Until it says it listens and a `select 1` of each user has gone
    through it: its pools have logged in to the server, so no test's
    connection waits for that."""
    waiting = set(users)
    params = conninfo_to_dict(server_conninfo)

    def ready() -> bool:
        log = pooler.log()
        if "sbuf_connect failed: Permission denied" in log:
            # Retrying cannot help: tests/utils/embedded_postgres.py says how it comes.
            raise AssertionError(
                f"pgbouncer may not reach the server's socket in {params.get('host')}: a"
                f" directory on its path is closed to the user it runs as.\n{pooler.output()}"
            )
        if f"listening on 127.0.0.1:{pooler.port}" not in log:
            return False
        for user in sorted(waiting):
            conninfo = make_conninfo(
                "",
                host="127.0.0.1",
                port=pooler.port,
                dbname=params.get("dbname") or "postgres",
                user=user,
                connect_timeout=READY_CONNECT_TIMEOUT,
            )
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute("select 1")
            except psycopg.Error as exc:
                pooler.last_error = f"{user}: {type(exc).__name__}: {exc}"
                return False
            waiting.discard(user)
        return True

    wait_ready(ready, pooler.process, pooler.output, f"pgbouncer on 127.0.0.1:{pooler.port}")


def _owner_of(host: str) -> str:
    """Who may reach the server: the socket directory's owner, else `nobody`."""
    if host.startswith("/"):
        name = pwd.getpwuid(os.stat(host).st_uid).pw_name
        if name != "root":
            return name
    return "nobody"
