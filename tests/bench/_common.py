"""Shared helpers for the on-demand benchmark scripts in `tests/bench`.

The scripts are named `bench_*.py` so pytest never collects them; run them
directly, e.g. `python tests/bench/bench_memory.py`. Each script:

    from tests.bench import _common as common

    with common.database() as target:            # embedded server or DATABASE_URL
        admin = common.admin_connection(target.url)
        caller = common.create_user(admin)
        samples = []
        for _ in range(100):
            with common.Timer() as t:
                ...
            samples.append(t.ms)
        stats = common.summarize(samples)
        print(common.machine_report(admin, target))
        print(common.format_table(["case", "median ms"], [["x", f"{stats.median:.3f}"]]))

`database()` applies the migrations, as the test suite does (see
`tests/conftest.py`): the embedded PostgreSQL (pgserver) in a temporary
directory, unless DATABASE_URL points at a disposable database.
"""

from __future__ import annotations

import math
import os
import platform
import queue
import shlex
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# The HS256 secret the benchmarks' apps verify their minted tokens with.
JWT_SECRET = "bench-jwt-secret-with-at-least-32-characters"


def ensure_import_path() -> None:
    """Make `memchat` and `tests.*` importable when a script is run by path."""
    for path in (REPO_ROOT, REPO_ROOT / "functions"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


ensure_import_path()

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: E402

from memchat.devdb import quiet_runtime_dir  # noqa: E402
from memchat.store import Caller  # noqa: E402
from memchat.store.migrations import migrate  # noqa: E402
from tests.utils.users import UserFactory  # noqa: E402

# ------------------------------------------------------------- database


@dataclass(frozen=True)
class Target:
    """The database a benchmark runs against."""

    url: str
    embedded: bool  # True: a pgserver started for this run (unix socket, local)

    @property
    def description(self) -> str:
        if self.embedded:
            return "embedded PostgreSQL (pgserver, unix socket, temporary directory)"
        return "DATABASE_URL"


@contextmanager
def database(
    *, apply_migrations: bool = True, settings: Mapping[str, str] | None = None
) -> Iterator[Target]:
    """A migrated database for the duration of the block.

    With DATABASE_URL set, that database is used (it must be disposable: the
    benchmarks write to it). Otherwise pgserver starts a server in a
    temporary directory that is stopped and removed afterwards; with
    `settings` ({"shared_buffers": "256MB"}), set by ALTER SYSTEM and the
    server restarted first (some, like shared_buffers, are read only then).
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        if settings:
            raise SystemExit("server settings apply to the embedded server only, not DATABASE_URL")
        if apply_migrations:
            migrate(url)
        yield Target(url=url, embedded=False)
        return
    quiet_runtime_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    with tempfile.TemporaryDirectory(prefix="memchat-bench-") as tmp:
        server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="stop")
        try:
            uri = server.get_uri()
            if settings:
                _restart_with(server, uri, settings)
            if apply_migrations:
                migrate(uri)
            yield Target(url=uri, embedded=True)
        finally:
            server.cleanup()


def _restart_with(server: Any, uri: str, settings: Mapping[str, str]) -> None:
    """ALTER SYSTEM `settings` on the embedded server, then restart it."""
    from pgserver._commands import pg_ctl

    with psycopg.connect(uri, autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(
                sql.SQL("alter system set {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )
    # The options of the first start (postmaster.opts) again; the log to the
    # same file, so that no pipe stays open behind pg_ctl.
    pg_ctl(
        ["-w", "-m", "fast", "-l", str(server.log), "restart"],
        pgdata=server.pgdata,
        user=server.system_user,
    )
    with psycopg.connect(uri, autocommit=True) as conn:
        pending = conn.execute(
            "select name from pg_settings where pending_restart and name = any(%s)",
            (list(settings),),
        ).fetchall()
    if pending:
        raise SystemExit(f"the server did not take {', '.join(row[0] for row in pending)}")


def admin_connection(url: str) -> psycopg.Connection[Any]:
    """A superuser (connecting-role) connection: bypasses RLS, autocommit.

    For arranging data (bulk fills with generate_series) and cleaning up
    between timed iterations; never use it inside a timed region.
    """
    return psycopg.connect(url, autocommit=True)


def create_user(admin: psycopg.Connection[Any], email: str | None = None) -> Caller:
    """A row in auth.users and the verified-claims Caller the store takes."""
    return UserFactory(admin).create(email)


def insert_users(admin: psycopg.Connection[Any], ids: Sequence[uuid.UUID]) -> None:
    """Rows in auth.users for these ids, in one statement (many users, no Callers)."""
    admin.execute(
        "insert into auth.users (id, aud, role, email)"
        " select u, 'authenticated', 'authenticated', u::text || '@example.test'"
        " from unnest(%s::uuid[]) as u",
        (list(ids),),
    )


def server_version(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("select current_setting('server_version')").fetchone()
    return str(row[0]) if row else "unknown"


def vacuum_analyze(admin: psycopg.Connection[Any], *tables: str) -> None:
    """Settle freshly filled tables (visibility map, statistics) before timing.

    `admin` must be in autocommit mode; names may be schema-qualified. After
    the recall keys' analysis, recall's copy of their word statistics is
    made, as the backfill's next run would (supabase/schemas/functions/words.sql).
    """
    for table in tables:
        admin.execute(sql.SQL("vacuum (analyze) {}").format(sql.Identifier(*table.split("."))))
    if "memchat.message_embeddings" in tables:
        admin.execute("select memchat.copy_word_statistics()")


# ---------------------------------------------------------------- timing


class Timer:
    """`with Timer() as t: ...` then `t.ms` (wall clock, perf_counter)."""

    def __init__(self) -> None:
        self.start = 0
        self.ns = 0

    def __enter__(self) -> Timer:
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ns = time.perf_counter_ns() - self.start

    @property
    def ms(self) -> float:
        return self.ns / 1e6


@dataclass(frozen=True)
class Stats:
    n: int
    median: float
    p95: float
    mean: float
    minimum: float
    maximum: float


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on the sorted samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def comma_list(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """An argparse type: a comma-separated list of `kind`."""
    return lambda value: [kind(x) for x in value.split(",") if x.strip()]


def summarize(samples: Sequence[float]) -> Stats:
    if not samples:
        return Stats(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Stats(
        n=len(samples),
        median=statistics.median(samples),
        p95=percentile(samples, 95),
        mean=statistics.fmean(samples),
        minimum=min(samples),
        maximum=max(samples),
    )


# --------------------------------------------------------------- latency


class LatencyProxy:
    """A TCP proxy on 127.0.0.1 that adds `rtt_ms` to every round trip.

    Forwards each accepted connection to the server `url` names (a Unix
    socket when its host is a directory, as pgserver's is, else TCP) and
    holds every chunk read from either side for `rtt_ms / 2` before passing
    it on. Each direction of each connection has its own queue and sender:
    a chunk leaves at its arrival time plus the delay, in arrival order, so
    back-to-back chunks (a pipeline, a large result) are delayed together,
    not one after another - latency, not bandwidth. Threads and
    `time.sleep`: an asyncio loop on epoll would round every wait up to a
    whole millisecond; `time.sleep` wakes late by roughly 0.05-0.15 ms on a
    busy machine, so measure what a proxy really adds (`round_trip_ms`).

        with LatencyProxy(target.url, rtt_ms=2) as proxy:
            conn = psycopg.connect(proxy.url)
            before = proxy.round_trips
            conn.execute("select 1")
            assert proxy.round_trips - before == 1

    `round_trips` counts, over all connections, the client->server chunks
    sent after the server last answered on that connection: the times a
    client had to wait for the server, whatever number of writes it split a
    request into. `client_chunks` counts every client->server chunk.
    """

    CHUNK = 65536

    def __init__(self, url: str, rtt_ms: float) -> None:
        if rtt_ms < 0:
            raise ValueError("rtt_ms must be >= 0")
        self.rtt_ms = rtt_ms
        self._delay = rtt_ms / 2000  # seconds, each way
        params = conninfo_to_dict(url)
        host = str(params.pop("host", "") or "")
        hostaddr = str(params.pop("hostaddr", "") or "")
        port = int(str(params.pop("port", "") or 5432))
        if "," in host or "," in hostaddr:
            raise ValueError("LatencyProxy takes a single-host URL")
        if hostaddr:
            self._upstream: tuple[int, Any] = (socket.AF_INET, (hostaddr, port))
        elif host.startswith("/"):
            self._upstream = (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
        elif host:
            self._upstream = (socket.AF_INET, (host, port))
        else:
            raise ValueError("LatencyProxy needs the server's host (or socket directory)")
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self.url = make_conninfo("", **params, host="127.0.0.1", port=str(self.port))
        self.round_trips = 0
        self.client_chunks = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="latency-proxy", daemon=True)

    @property
    def description(self) -> str:
        family, address = self._upstream
        upstream = "unix socket" if family == socket.AF_UNIX else f"tcp {address[0]}:{address[1]}"
        return (
            f"tcp proxy on 127.0.0.1 -> {upstream},"
            f" +{self.rtt_ms:g} ms per round trip ({self.rtt_ms / 2:g} ms each way)"
        )

    def start(self) -> LatencyProxy:
        self._acceptor.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=5)
        for sock in sockets:
            sock.close()

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            family, address = self._upstream
            upstream = socket.socket(family, socket.SOCK_STREAM)
            try:
                upstream.connect(address)
            except OSError:
                client.close()
                upstream.close()
                continue
            if family == socket.AF_INET:
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, upstream]
            # True once the server has answered; starts True (it just sent
            # nothing, but the first request is a round trip all the same).
            answered = [True]

            def from_client(answered: list[bool] = answered) -> None:
                with self._lock:
                    self.client_chunks += 1
                    if answered[0]:
                        self.round_trips += 1
                        answered[0] = False

            def from_server(answered: list[bool] = answered) -> None:
                answered[0] = True

            self._spawn(self._pump, client, upstream, from_client)
            self._spawn(self._pump, upstream, client, from_server)

    def _pump(self, src: socket.socket, dst: socket.socket, seen: Callable[[], None]) -> None:
        """Read `src`, queue each chunk with its due time; a sender writes `dst`."""
        pending: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        self._spawn(self._send, pending, dst)
        try:
            while data := src.recv(self.CHUNK):
                due = time.perf_counter() + self._delay
                seen()
                pending.put((due, data))
        except OSError:
            pass
        finally:
            pending.put(None)

    def _send(
        self, pending: queue.SimpleQueue[tuple[float, bytes] | None], dst: socket.socket
    ) -> None:
        try:
            while (item := pending.get()) is not None:
                due, data = item
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


def wait_for_health(base: str, alive: Callable[[], bool], seconds: float = 120) -> None:
    """Until the app at `base` answers GET /health 200 (RuntimeError when
    `alive` says its process died, or `seconds` pass): ready when it says
    so, however long a loaded machine takes."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(f"the app at {base} did not start")
        time.sleep(0.05)


def round_trip_ms(url: str, n: int = 200) -> Stats:
    """`select 1` on one autocommit connection to `url`: one round trip each."""
    samples = []
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        for _ in range(n // 10):
            conn.execute("select 1")
        for _ in range(n):
            with Timer() as t:
                conn.execute("select 1").fetchone()
            samples.append(t.ms)
    return summarize(samples)


# --------------------------------------------------------------- output


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (readable in a terminal, pasteable into docs/)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def command_line() -> str:
    """How this script was invoked, for the report."""
    return shlex.join([Path(sys.executable).as_posix(), *sys.argv])


def load_average() -> str:
    """The 1/5/15-minute load averages: other work on the machine skews timings."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine_report(
    conn: psycopg.Connection[Any], target: Target, *, load_at_start: str | None = None
) -> str:
    """Python, PostgreSQL, CPUs, load and the command, one per line."""
    load = f"{load_at_start} at start, {load_average()} at end" if load_at_start else load_average()
    return "\n".join(
        [
            f"python:     {platform.python_version()} ({platform.python_implementation()})",
            f"postgresql: {server_version(conn)} ({target.description})",
            f"cpus:       {os.cpu_count()} (load average 1/5/15 min: {load})",
            f"platform:   {platform.platform()}",
            f"psycopg:    {psycopg.__version__} (libpq {psycopg.pq.version()})",
            f"command:    {command_line()}",
        ]
    )
