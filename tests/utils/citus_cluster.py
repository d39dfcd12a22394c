"""A local Citus cluster for tests: a coordinator and two workers on 127.0.0.1.

infra/citus.sh builds Citus (once; cached under .memchat/citus/) into a copy
of pgserver's PostgreSQL 18, and starts and stops the three servers: it says
how, and with which settings. Run as root, the servers run as the `pgserver`
user, which must be able to reach the cluster's directory: give
`citus_cluster` a directory of its own such as `tempfile.mkdtemp()` makes (it
opens that one to others for traversal), never one under pytest's temporary
directories, which pytest closes again (tests/utils/embedded_postgres.py).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.utils.processes import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "infra" / "citus.sh"
NODES = 3  # the coordinator's port, then the workers' (base + 1, base + 2)

# A port taken by another process between choosing it and a server's bind.
PORT_ATTEMPTS = 3

# The first build: about a minute on 2 idle cores, a few on a loaded machine.
BUILD_SECONDS = 1800
# start: three initdbs and starts, then the extensions and the nodes' registration.
START_SECONDS = 600
STOP_SECONDS = 300


@dataclass(frozen=True)
class CitusCluster:
    """A running cluster: its owner's (superuser's) URLs, trusted on 127.0.0.1."""

    coordinator_url: str
    worker_urls: tuple[str, ...]
    directory: Path
    bin_dir: Path


class CitusError(RuntimeError):
    """infra/citus.sh failed; the message has its output."""


def _run(*args: str, timeout: float) -> str:
    """infra/citus.sh with `args`: the last line it printed (build and start print
    what they made, stop nothing); fails with its output."""
    result = subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise CitusError(
            f"infra/citus.sh {' '.join(args)} failed ({result.returncode}):\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base_port() -> int:
    """A port of 127.0.0.1 free right now, and the NODES above it too (the
    workers', and one for a worker added later: add_worker)."""
    for _ in range(100):
        base = free_port()
        if base + NODES <= 65535 and all(_port_free(base + i) for i in range(1, NODES + 1)):
            return base
    raise RuntimeError(f"found no {NODES + 1} consecutive free ports on 127.0.0.1")


def _url_on(url: str, port: int) -> str:
    """`url` (the coordinator's, as infra/citus.sh prints it) on another port."""
    head, _, rest = url.rpartition(":")
    _, slash, database = rest.partition("/")
    return f"{head}:{port}{slash}{database}"


def _start(directory: Path) -> tuple[str, int]:
    """Starts the cluster on free ports: the coordinator's URL and base port.
    A port taken meanwhile (another process bound it first) means another try
    in a fresh directory; any other failure, or the last try's, is raised. A
    cluster already in `directory` starts again on its own ports."""
    stored = directory / "base_port"  # written by infra/citus.sh
    if stored.exists():
        base = int(stored.read_text())
        return _run("start", str(directory), str(base), timeout=START_SECONDS), base
    for attempt in range(1, PORT_ATTEMPTS + 1):
        base = _free_base_port()
        try:
            return _run("start", str(directory), str(base), timeout=START_SECONDS), base
        except CitusError as exc:
            _stop_quietly(directory)
            if attempt == PORT_ATTEMPTS or "Address already in use" not in str(exc):
                raise
            shutil.rmtree(directory, ignore_errors=True)
    raise AssertionError("unreachable")


def _stop_quietly(directory: Path) -> None:
    """Stops what a failed start left running, keeping the start's error."""
    with suppress(CitusError, subprocess.TimeoutExpired):
        _run("stop", str(directory), timeout=STOP_SECONDS)


@contextmanager
def citus_cluster(tmp_dir: Path) -> Iterator[CitusCluster]:
    """A Citus cluster with its data directories under `tmp_dir` (in citus/),
    on free ports, stopped after the block (its files stay in `tmp_dir`).

    Builds Citus first if it is not built yet (a minute or more, once per machine).
    """
    bin_dir = Path(_run("build", timeout=BUILD_SECONDS))
    if os.geteuid() == 0:
        # The servers' user passes through it to their data directories.
        tmp_dir.chmod(tmp_dir.stat().st_mode | stat.S_IXGRP | stat.S_IXOTH)
    directory = tmp_dir / "citus"
    coordinator_url, base = _start(directory)
    try:
        yield CitusCluster(
            coordinator_url=coordinator_url,
            worker_urls=tuple(_url_on(coordinator_url, base + i) for i in range(1, NODES)),
            directory=directory,
            bin_dir=bin_dir,
        )
    finally:
        _run("stop", str(directory), timeout=STOP_SECONDS)


def add_worker(cluster: CitusCluster) -> str:
    """One worker more in the running `cluster` (infra/citus.sh add-worker):
    started on the port after the last node's and registered with the
    coordinator, holding no shards yet. Its owner's URL; `citus_cluster`
    stops it with the others."""
    return _run("add-worker", str(cluster.directory), timeout=START_SECONDS)


_SHARD_ID = re.compile(r"_(\d{6,})\b")


def shard_groups(
    coordinator_url: str, claims: Mapping[str, Any], statements: Sequence[tuple[str, Any]]
) -> int:
    """How many shard groups `statements` touch, run as the caller of `claims`
    through the API's login (rolled back): the commands Citus sends to the
    workers, and a delegated function's own on its worker's shards (local
    there), reported as notices (citus.log_remote_commands,
    citus.log_local_commands), their shards grouped by hash range (a user's
    rows of every co-located table share one)."""
    import psycopg

    from memchat.devdb import API_ROLE, role_conninfo
    from memchat.store.fragments import register
    from tests.utils.store_data import become

    with psycopg.connect(coordinator_url, autocommit=True) as admin:
        ranges = dict(
            admin.execute(
                "select shardid, shardminvalue from pg_dist_shard where shardminvalue is not null"
            ).fetchall()
        )
    commands: list[str] = []
    api = role_conninfo(coordinator_url, API_ROLE)
    with psycopg.connect(api, autocommit=True, prepare_threshold=None) as conn:
        register(conn.adapters)  # the store's vector parameters
        conn.add_notice_handler(lambda notice: commands.append(notice.message_primary or ""))
        with conn.transaction(force_rollback=True):
            become(conn, claims)
            conn.execute("set local citus.log_remote_commands = on")
            conn.execute("set local citus.log_local_commands = on")
            for query, params in statements:
                conn.execute(query, params)
    return len({ranges[int(m)] for c in commands for m in _SHARD_ID.findall(c) if int(m) in ranges})
