"""A real transaction-mode pooler (pgbouncer) in front of the test database.

Supabase's Supavisor hands each transaction whatever server connection is
free, as pgbouncer does in `pool_mode = transaction`: no server-side
prepared statements survive, and nothing set outside a transaction belongs
to the next client. Tests start one with a pool of one or two server
connections, so every request of every user shares them.

pgbouncer comes from Debian's packages (infra/test.sh installs it). It
refuses to run as root: as root it runs as the owner of the database's
socket directory (the embedded server's own system user), which can reach
that socket anyway.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.utils.processes import free_port

SEARCH_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/local/sbin"


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

    def url(self, conninfo: str) -> str:
        params = conninfo_to_dict(conninfo)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo("", **params)

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def start(server_conninfo: str, users: dict[str, str | None], pool_size: int) -> Pooler:
    """pgbouncer in transaction mode, `pool_size` server connections per (db, user).

    `server_conninfo` says where PostgreSQL listens (host, port, dbname);
    `users` are the login roles allowed through, with their passwords (None:
    the server trusts them).
    """
    server = conninfo_to_dict(server_conninfo)
    host = str(server.get("host") or "/tmp")
    dbname = str(server.get("dbname") or "postgres")
    port = free_port()
    directory = Path(tempfile.mkdtemp(prefix="memchat-pgbouncer-"))
    directory.chmod(0o755)  # readable by the unprivileged user it may run as
    userlist = "".join(f'"{name}" "{password or ""}"\n' for name, password in users.items())
    (directory / "userlist.txt").write_text(userlist)
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
        f"logfile = {directory / 'pgbouncer.log'}\n"
        f"pidfile = {directory / 'pgbouncer.pid'}\n"
    )
    for path in directory.iterdir():
        path.chmod(0o644)
    command = [binary(), str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:
        owner = _owner_of(host)
        os.chown(directory, pwd.getpwnam(owner).pw_uid, -1)
        command = ["runuser", "-u", owner, "--", *command]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pooler = Pooler(process, port, directory)
    _wait_listening(pooler)
    return pooler


def _owner_of(host: str) -> str:
    """Who may reach the server: the socket directory's owner, else `nobody`."""
    if host.startswith("/"):
        name = pwd.getpwuid(os.stat(host).st_uid).pw_name
        if name != "root":
            return name
    return "nobody"


def _wait_listening(pooler: Pooler, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pooler.process.poll() is not None:
            stderr = pooler.process.stderr.read().decode() if pooler.process.stderr else ""
            raise RuntimeError(f"pgbouncer exited: {stderr}{pooler.log()}")
        try:
            with socket.create_connection(("127.0.0.1", pooler.port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    pooler.stop()
    raise RuntimeError("pgbouncer did not start listening")
