"""`memchat dev` as a subprocess, as a developer runs it, for end-to-end tests.

`dev_server` starts it on a free port of 127.0.0.1 against the test database,
with its model either the offline responder or a `FakeOpenAI` the test runs
(pacing its chunks, scripting tool calls and failures). Its output goes to a
file (a pipe nobody reads would fill up and stall the server), shown when it
fails to start. `token` mints a token for a fresh user with `memchat token`.

With DATABASE_URL set (the test database), neither `memchat dev` nor `memchat
token` starts the embedded PostgreSQL, so stopping the server leaves no
PostgreSQL behind; `dev_server` checks that none of its home's runs after it.
tests/cli/test_dev_command.py runs `memchat dev` on the embedded server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from memchat import devdb
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.processes import STARTUP_SECONDS, free_port, stop, wait_healthy

MEMCHAT = [sys.executable, "-m", "memchat.cli"]
JWT_SECRET = "dev-server-test-secret-" + "d" * 32


def clean_env(**values: str) -> dict[str, str]:
    """This process's environment without any model, Supabase or database settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SUPABASE_"))}
    env.pop("DATABASE_URL", None)
    env.update(values)
    return env


@dataclass
class DevServer:
    url: str  # http://127.0.0.1:PORT
    env: dict[str, str]  # what `memchat` commands need to reach the same database
    home: Path
    log: Path

    def token(self, user_id: uuid.UUID | None = None) -> str:
        """A token (12 h) for a fresh user, or for `user_id`, from `memchat token`."""
        return subprocess.run(
            [*MEMCHAT, "token", "--user-id", str(user_id or uuid.uuid4()), "--ttl", "43200"],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            check=True,
            # A fresh interpreter's imports, on a loaded machine too.
            timeout=STARTUP_SECONDS,
        ).stdout.strip()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def dev_server(admin_url: str, home: Path, model: FakeOpenAI | None = None) -> Iterator[DevServer]:
    """`memchat dev` against the test database; the fake model when given
    (else the offline responder). No rate limit, no background summaries."""
    home.mkdir(parents=True, exist_ok=True)
    env = clean_env(
        DATABASE_URL=admin_url,
        SUPABASE_JWT_SECRET=JWT_SECRET,
        MEMCHAT_HOME=str(home),
        CHAT_RATE_PER_MINUTE="0",
    )
    if model is not None:
        env.update(
            OPENAI_API_KEY="test-key",
            OPENAI_BASE_URL=model.url,
            OPENAI_MODEL="fake-model",
            OPENAI_MAX_RETRIES="0",
        )
    port = free_port()
    server = DevServer(f"http://127.0.0.1:{port}", env, home, home / "memchat-dev.log")
    with server.log.open("wb") as log:
        proc = subprocess.Popen(
            [*MEMCHAT, "dev", "--port", str(port), "--summary-every", "0"],
            env=env,
            cwd=home,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(server.url, proc, server.output, "memchat dev")
        yield server
    finally:
        stop(proc)
        # None was started (DATABASE_URL); were one, it would be stopped, not left.
        leftover = devdb.stop(home / "pgdata")
    assert leftover is None, f"memchat dev left an embedded PostgreSQL (pid {leftover})"
