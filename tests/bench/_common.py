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
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def ensure_import_path() -> None:
    """Make `memchat` and `tests.*` importable when a script is run by path."""
    for path in (REPO_ROOT, REPO_ROOT / "functions"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


ensure_import_path()

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from memchat.devdb import quiet_runtime_dir  # noqa: E402
from memchat.migrate import migrate  # noqa: E402
from memchat.store import Caller  # noqa: E402
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
def database(*, apply_migrations: bool = True) -> Iterator[Target]:
    """A migrated database for the duration of the block.

    With DATABASE_URL set, that database is used (it must be disposable: the
    benchmarks write to it). Otherwise pgserver starts a server in a
    temporary directory that is stopped and removed afterwards.
    """
    url = os.environ.get("DATABASE_URL")
    if url:
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
            if apply_migrations:
                migrate(uri)
            yield Target(url=uri, embedded=True)
        finally:
            server.cleanup()


def admin_connection(url: str) -> psycopg.Connection[Any]:
    """A superuser (connecting-role) connection: bypasses RLS, autocommit.

    For arranging data (bulk fills with generate_series) and cleaning up
    between timed iterations; never use it inside a timed region.
    """
    return psycopg.connect(url, autocommit=True)


def create_user(admin: psycopg.Connection[Any], email: str | None = None) -> Caller:
    """A row in auth.users and the verified-claims Caller the store takes."""
    return UserFactory(admin).create(email)


def server_version(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("select current_setting('server_version')").fetchone()
    return str(row[0]) if row else "unknown"


def vacuum_analyze(admin: psycopg.Connection[Any], *tables: str) -> None:
    """Settle freshly filled tables (visibility map, statistics) before timing.

    `admin` must be in autocommit mode; names may be schema-qualified.
    """
    for table in tables:
        admin.execute(sql.SQL("vacuum (analyze) {}").format(sql.Identifier(*table.split("."))))


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
