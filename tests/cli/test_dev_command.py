"""`memchat dev` as a developer runs it: its model line, its access lines,
a taken port, and the embedded PostgreSQL it starts, then stops again.

These runs have their own MEMCHAT_HOME and no DATABASE_URL (the embedded
server), except the model line's, which uses the test database. Whatever
happens, a test stops the servers it made (`cleanup`), and proves with psutil
that no PostgreSQL process of its data directory is left.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import jwt
import psutil
import psycopg
import pytest

from memchat import devdb
from tests.utils.dev_server import MEMCHAT, clean_env
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.processes import free_port, wait_healthy

# Its last word is not hex: a request id (32 hex digits) can hold any run of
# digits (one in a CI run held 4471, the number the secrets once ended in).
SECRET = "my locker code is tangerine"
TIMEOUT = 60


@dataclass
class Dev:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 10) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output(), re.MULTILINE)
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in:\n{self.output()}")

    def signal_and_wait(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=TIMEOUT)


@pytest.fixture
def cleanup() -> Iterator[list[Path]]:
    """Data directories to stop any server of after the test, pass or fail."""
    data_dirs: list[Path] = []
    yield data_dirs
    for data_dir in data_dirs:
        devdb.stop(data_dir)


@pytest.fixture
def running() -> Iterator[list[Dev]]:
    """`memchat dev` processes to kill after the test if they are still running."""
    devs: list[Dev] = []
    yield devs
    for dev in devs:
        if dev.proc.poll() is None:
            dev.proc.kill()
            dev.proc.wait(timeout=10)


def start_dev(env: dict[str, str], cwd: Path, running: list[Dev]) -> Dev:
    port = free_port()
    log = cwd / f"memchat-dev-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*MEMCHAT, "dev", "--port", str(port), "--summary-every", "0"],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    dev = Dev(proc, f"http://127.0.0.1:{port}", log)
    running.append(dev)
    wait_healthy(dev.url, proc, dev.output, "memchat dev")
    return dev


def postgres_processes(data_dir: Path) -> list[psutil.Process]:
    """Every process that is a PostgreSQL server of `data_dir`, and their children."""
    servers = []
    for process in psutil.process_iter(["cmdline"]):
        if str(data_dir) in (process.info["cmdline"] or []):
            servers.append(process)
    return servers + [child for server in servers for child in server.children(recursive=True)]


def memchat(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MEMCHAT, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT
    )


def test_dev_logs_one_line_per_request_and_stops_its_postgres_on_sigterm(
    tmp_path: Path, running: list[Dev], cleanup: list[Path]
) -> None:
    home = tmp_path / "home"
    data_dir = (home / "pgdata").resolve()
    cleanup.append(data_dir)
    env = clean_env(MEMCHAT_HOME=str(home), CHAT_RATE_PER_MINUTE="0")

    dev = start_dev(env, tmp_path, running)

    output = dev.output()
    assert f"database:   embedded PostgreSQL at {data_dir} (started now;" in output
    assert "model:      the offline responder (OPENAI_API_KEY is not set)" in output
    server = devdb.status(data_dir)
    assert server.running
    processes = postgres_processes(data_dir)
    assert len(processes) > 1  # the server and its background processes
    token = dev.wait_for(r"#token=(\S+)").group(1)
    user_id = jwt.decode(token, options={"verify_signature": False})["sub"]
    auth = {"Authorization": f"Bearer {token}"}

    r = httpx.post(
        f"{dev.url}/chat",
        json={"message": SECRET},
        headers={**auth, "X-Request-ID": "dev-req-1"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    session_id = r.json()["session_id"]
    exported = httpx.get(
        f"{dev.url}/chat/export/{session_id}?format=markdown", headers=auth, timeout=30
    )
    assert exported.status_code == 200 and SECRET in exported.text
    missing = httpx.get(f"{dev.url}/memory", headers={"X-Request-ID": "dev-req-3"}, timeout=30)
    assert missing.status_code == 401

    time_ = r"^\d\d:\d\d:\d\d "
    duration = r"\d+\.\d ms"
    chat_id = r.headers["x-request-id"]
    dev.wait_for(
        rf"{time_}POST /chat 200 {duration} req={chat_id} user={user_id} client_req=dev-req-1$"
    )
    export_id = exported.headers["x-request-id"]
    dev.wait_for(
        rf"{time_}GET /chat/export/\{{session_id\}} 200 {duration} req={export_id} user={user_id}$"
    )
    missing_id = missing.headers["x-request-id"]
    dev.wait_for(
        rf"{time_}GET /memory 401 {duration} req={missing_id} user=- client_req=dev-req-3$"
    )
    health = re.findall(rf"{time_}GET /health 200 {duration} req=\w+ user=-$", dev.output(), re.M)
    assert health  # wait_healthy's polls

    assert dev.signal_and_wait(signal.SIGTERM) == 0
    output = dev.output()
    assert f"stopped the embedded PostgreSQL it started (pid {server.pid})" in output
    assert not devdb.status(data_dir).running
    assert not any(p.is_running() for p in processes)
    assert postgres_processes(data_dir) == []
    # The logs (after the banner, which links the page with its token) never
    # hold the message, the token or a query string.
    logs = output.split("\nlogs:", 1)[1]
    assert SECRET not in output and "tangerine" not in output
    assert token not in logs and "Bearer" not in logs and "format=markdown" not in logs


def test_a_server_running_before_is_left_running_and_memchat_db_stops_it(
    tmp_path: Path, running: list[Dev], cleanup: list[Path]
) -> None:
    """Started by another command (`memchat migrate` says so), so Ctrl-C on
    `memchat dev` leaves it; `memchat db status` and `stop` find it."""
    home = tmp_path / "home"
    data_dir = (home / "pgdata").resolve()
    cleanup.append(data_dir)
    env = clean_env(MEMCHAT_HOME=str(home), CHAT_RATE_PER_MINUTE="0")

    migrated = memchat(env, tmp_path, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert f"note: started the embedded PostgreSQL at {data_dir}; it keeps running" in (
        migrated.stderr
    )
    server = devdb.status(data_dir)
    assert server.running

    dev = start_dev(env, tmp_path, running)
    assert "(already running; left running when memchat dev stops" in dev.output()
    assert dev.signal_and_wait(signal.SIGINT) == 0  # Ctrl-C
    assert "the embedded PostgreSQL is left running, as it was before" in dev.output()
    assert devdb.status(data_dir).pid == server.pid

    status = memchat(env, tmp_path, "db", "status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"running (pid {server.pid}): {data_dir}\n")
    with psycopg.connect(status.stdout.splitlines()[1]) as conn:  # the URI it prints
        assert conn.execute("select current_setting('data_directory')").fetchone() == (
            str(data_dir),
        )
    stopped = memchat(env, tmp_path, "db", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"stopped (pid {server.pid}): {data_dir}"
    assert postgres_processes(data_dir) == []
    status = memchat(env, tmp_path, "db", "status")
    assert (status.returncode, status.stdout.strip()) == (3, f"not running: {data_dir}")
    again = memchat(env, tmp_path, "db", "stop")
    assert again.returncode == 0 and "nothing to stop" in again.stdout


def test_a_taken_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = clean_env(MEMCHAT_HOME=str(home))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*MEMCHAT, "dev", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    assert result.returncode == 1, result.stderr
    assert f"memchat dev: cannot listen on 127.0.0.1:{port}: Address already in use" in (
        result.stderr
    )
    assert "--port" in result.stderr
    # Before the banner, the database, the model line: nothing was started.
    for line in ("database:", "model:", "API on", "OFFLINE RESPONDER", "migrations:"):
        assert line not in result.stderr + result.stdout
    assert not (home / "pgdata").exists()


def test_the_model_line_names_model_and_base_url_with_the_key_masked(
    admin_url: str, tmp_path: Path, running: list[Dev], fake_openai: FakeOpenAI
) -> None:
    key = f"sk-test-{uuid.uuid4().hex}"
    env = clean_env(
        DATABASE_URL=admin_url,
        MEMCHAT_HOME=str(tmp_path / "home"),
        SUPABASE_JWT_SECRET="dev-command-test-secret-" + "m" * 32,
        OPENAI_API_KEY=key,
        OPENAI_BASE_URL=fake_openai.url,
        OPENAI_MODEL="fake-model",
    )

    dev = start_dev(env, tmp_path, running)
    assert dev.signal_and_wait(signal.SIGTERM) == 0

    output = dev.output()
    assert f"model:      fake-model at {fake_openai.url}, key sk-…{key[-4:]};" in output
    assert key not in output and key[:12] not in output
    assert "database:   DATABASE_URL" in output
    assert "OFFLINE RESPONDER" not in output
    assert "embedded PostgreSQL" not in output  # DATABASE_URL: none started, none stopped
    assert not (tmp_path / "home" / "pgdata").exists()


def test_a_data_directory_of_another_postgresql_version_is_moved_aside(tmp_path: Path) -> None:
    # memchat's embedded server was PostgreSQL 16 before it was 18: a data
    # directory from then cannot be opened, so it is kept aside and a new
    # one starts.
    old = tmp_path / "pgdata"
    old.mkdir()
    (old / "PG_VERSION").write_text("16\n")
    (old / "kept.txt").write_text("the old data")
    try:
        uri = devdb.start(old)
        with psycopg.connect(uri) as conn:
            row = conn.execute("show server_version_num").fetchone()
        assert row is not None and row[0].startswith(devdb.shipped_major())
        aside = tmp_path / "pgdata-pg16"
        assert (aside / "kept.txt").read_text() == "the old data"
        assert (old / "PG_VERSION").read_text().strip() == devdb.shipped_major()
        assert devdb.set_aside_other_major(old) is None  # this version's: left alone
    finally:
        devdb.stop(old)
