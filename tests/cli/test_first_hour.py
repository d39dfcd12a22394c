"""The README's "First hour" walkthrough runs as written: its shell blocks,
after the one that starts the server, run in order with bash (stopping at
the first failure) against `memchat dev` (the offline responder, the test
database), and say what the README says they show. The only change made to
them: the server's address (the test's port instead of 8000)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.unit.test_readme import FENCE, README, examples
from tests.utils.dev_server import DevServer, dev_server

BIN = Path(sys.executable).parent  # where the `memchat` console script is


def walkthrough() -> list[str]:
    section = README.read_text().split("\n## First hour\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(3) for m in FENCE.finditer(section) if m.group(2).strip() == "sh"]


# What the examples cannot run here: the set-up scripts (the test runs the
# server and the tests itself) and the benchmark (minutes, a data set).
NOT_RUN = ("bash infra/", ".venv/bin/python tests/bench/")


DEV_EMAIL = "dev@example.test"  # the user `memchat token` and `memchat chat` use


@pytest.fixture
def fresh_clone(admin: psycopg.Connection) -> None:
    """No dev user yet, as on a fresh clone (`memchat token` creates it): not
    one that earlier tests used (its throttles, its notes)."""
    admin.execute("delete from auth.users where email = %s", (DEV_EMAIL,))


def run_as_written(script: str, dev: DevServer, home: Path) -> subprocess.CompletedProcess[str]:
    """`script` with bash (stopping at the first failure), as a reader runs it
    in a shell with the venv activated, against `dev` instead of port 8000."""
    port = dev.url.rsplit(":", 1)[1]
    script = re.sub(r"\b(localhost|127\.0\.0\.1):8000\b", f"127.0.0.1:{port}", script)
    env = {
        **dev.env,
        "HOME": str(home),
        "MEMCHAT_URL": dev.url,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        cwd=dev.home,
        stdin=subprocess.DEVNULL,  # `memchat chat` typed at: Ctrl-D at once
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_walkthrough_starts_the_server_with_the_setup_command() -> None:
    first, *rest = walkthrough()
    assert first.split("#", 1)[0].strip() == "bash infra/dev.sh"
    assert len(rest) == 2
    assert "my-data" not in README.read_text()


def test_the_first_hour_walkthrough_runs_as_written(
    admin_url: str, admin: psycopg.Connection, tmp_path: Path, fresh_clone: None
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with dev_server(admin_url, tmp_path / "dev") as dev:
        result = run_as_written("\n".join(walkthrough()[1:]), dev, home)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Your name is Ana (you told me earlier in this conversation)." in out
    assert "(notes updated)" in out
    assert 'What I have on that: "I like green tea" (from my long-term notes).' in out
    assert "- I like green tea" in out  # /notes
    assert "Your favourite colour is teal (you told me in an earlier conversation)." in out
    # The export went to the home directory, with what was said in it.
    exported = json.loads((home / "memchat-export.json").read_text())
    said = [m["content"] for s in exported["sessions"] for m in s["messages"]]
    assert "my name is Ana" in said and "what is my favourite colour?" in said
    # Then everything was deleted.
    deleted = json.loads(out.strip().splitlines()[-1])["deleted"]
    assert deleted["messages"] >= 10 and deleted["long_term_memory"] >= 1, deleted
    user = admin.execute("select id from auth.users where email = 'dev@example.test'").fetchone()
    assert user is not None
    left = admin.execute(
        "select count(*) from public.chat_message_history where user_id = %s", (user[0],)
    ).fetchone()
    assert left == (0,)


def test_every_example_of_the_readme_runs_in_order(
    admin_url: str, tmp_path: Path, fresh_clone: None
) -> None:
    """On a fresh start, every shell example of the README, in reading order
    (each inline command a line of its own), succeeds, and no API call in
    them is answered with an error."""
    code = [e.code for e in examples(README.read_text())]
    lines = [line for block in code for line in block.splitlines() if not line.startswith(NOT_RUN)]
    assert sum("curl " in line for line in lines) >= 20, lines  # the examples were found
    home = tmp_path / "home"
    home.mkdir()
    with dev_server(admin_url, tmp_path / "dev") as dev:
        result = run_as_written("\n".join(lines), dev, home)
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"error":' not in result.stdout and "event: error" not in result.stdout, result.stdout
    assert '{"status":"ok","database":"ok"}' in result.stdout
    assert (home / "memchat-data.ndjson").stat().st_size > 0
