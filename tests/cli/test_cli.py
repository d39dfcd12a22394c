"""The `memchat` console script, run as a user would run it (subprocesses)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import psycopg
import pytest

from tests.utils.processes import free_port

MEMCHAT = [sys.executable, "-m", "memchat.cli"]


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SUPABASE_"))}
    env.pop("DATABASE_URL", None)
    env.update(values)
    return env


def _wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"memchat dev exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("memchat dev did not become healthy")


def _long_conversation(url: str, bearer: dict[str, str], sid: str, prefix: str) -> None:
    """12 turns in one session: past its window and its summary trigger."""
    for i in range(12):
        r = httpx.post(
            f"{url}/chat",
            json={"message": f"{prefix} {i}", "session_id": sid},
            headers=bearer,
            timeout=30,
        )
        assert r.status_code == 200, r.text


def _summary_in_reach(url: str, bearer: dict[str, str], sid: str, seconds: float = 30) -> str:
    """The session's summary, once the next turn will use it: the worker has
    run since the last burst of turns, so no more than the window and the
    trigger (10 + 10 by default) of the session's messages lie after what the
    summary covers (the worker may run mid-burst: its first summary alone
    says nothing about the next turn)."""
    deadline = time.monotonic() + seconds
    while True:
        exported = httpx.get(f"{url}/chat/export/{sid}", headers=bearer, timeout=10).json()
        session = exported["session"]
        covers = session["summary_covers_until"]
        after = [
            m
            for m in exported["messages"]
            if m["role"] in ("user", "assistant") and covers is not None and m["id"] > covers
        ]
        if session["summary"] and len(after) <= 20:
            return str(session["summary"])
        assert time.monotonic() < deadline, f"no usable summary after {seconds} s: {session}"
        time.sleep(0.25)


def _start_dev(env: dict[str, str], cwd: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`memchat dev` on a free port; returns the process and its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [*MEMCHAT, "dev", "--port", str(port), *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def dev_server(admin_url: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`memchat dev` against the test database, offline model, own JWT secret."""
    secret = "cli-test-secret-" + "x" * 32
    env = _env(
        DATABASE_URL=admin_url,
        SUPABASE_JWT_SECRET=secret,
        MEMCHAT_HOME=str(tmp_path),
        CHAT_RATE_PER_MINUTE="0",  # these tests send turns faster than a person
    )
    proc, url = _start_dev(env, tmp_path, "--summary-every", "0")
    try:
        _wait_healthy(url, proc)
        yield url, env
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_dev_starts_from_nothing_with_embedded_postgres(tmp_path: Path) -> None:
    env = _env(MEMCHAT_HOME=str(tmp_path / ".memchat"), CHAT_RATE_PER_MINUTE="0")
    proc, url = _start_dev(env, tmp_path, "--summary-every", "1")
    try:
        assert _wait_healthy(url, proc) == {"status": "ok", "database": "ok"}
        token = subprocess.run(
            [*MEMCHAT, "token"], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
        ).stdout.strip()
        r = httpx.post(
            f"{url}/chat",
            json={"message": "remember I like green tea"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert r.json()["answer"].startswith("[offline responder")
        assert r.json()["memory"]["long_term_notes_updated"] is True
        # Recall works offline too: a fact from one session, asked in a new one.
        bearer = {"Authorization": f"Bearer {token}"}
        told = httpx.post(
            f"{url}/chat", json={"message": "my favourite colour is teal"}, headers=bearer
        )
        assert told.status_code == 200, told.text
        asked = httpx.post(
            f"{url}/chat",
            json={"message": "what is my favourite colour?", "session_id": str(uuid.uuid4())},
            headers=bearer,
            timeout=30,
        )
        assert asked.status_code == 200, asked.text
        assert 'I recall you said: "my favourite colour is teal"' in asked.json()["answer"]
        assert asked.json()["memory"]["recall_status"] == "ok"
        # Summaries appear on a long conversation: the background worker.
        sid = asked.json()["session_id"]
        _long_conversation(url, bearer, sid, "planning step")
        summary = _summary_in_reach(url, bearer, sid)
        assert summary.startswith("[offline summary]")
        assert "planning step 0" in summary
        later = httpx.post(
            f"{url}/chat",
            json={"message": "where were we?", "session_id": sid},
            headers=bearer,
            timeout=30,
        ).json()
        assert later["memory"]["summary_used"] is True
        assert "My summary of our earlier messages:" in later["answer"]
        page = httpx.get(f"{url}/", timeout=5)
        assert page.status_code == 200 and "memchat" in page.text
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=20)
        subprocess.run(
            [
                str(Path(sys.executable).parent / "python"),
                "-c",
                "import pgserver, sys; pgserver.get_server(sys.argv[1]).cleanup()",
                str(tmp_path / ".memchat" / "pgdata"),
            ],
            env=env,
            check=False,
            capture_output=True,
        )
        shutil.rmtree(tmp_path / ".memchat", ignore_errors=True)
    assert "OFFLINE RESPONDER" in output
    assert (tmp_path / ".memchat").exists() is False


def test_token_creates_user_and_verifies(
    admin_url: str, admin: psycopg.Connection, tmp_path: Path
) -> None:
    secret = "token-test-secret-" + "y" * 32
    email = f"{uuid.uuid4()}@example.test"
    env = _env(DATABASE_URL=admin_url, SUPABASE_JWT_SECRET=secret)
    out = subprocess.run(
        [*MEMCHAT, "token", "--email", email],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    claims = jwt.decode(out, secret, algorithms=["HS256"], audience="authenticated")
    assert claims["role"] == "authenticated" and claims["email"] == email
    row = admin.execute("select id from auth.users where email = %s", (email,)).fetchone()
    assert row is not None and str(row[0]) == claims["sub"]
    again = subprocess.run(
        [*MEMCHAT, "token", "--email", email],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert (
        jwt.decode(again, secret, algorithms=["HS256"], audience="authenticated")["sub"]
        == (claims["sub"])
    )


def test_token_for_a_user_id_alone_is_accepted_by_the_api(
    admin_url: str, admin: psycopg.Connection, tmp_path: Path
) -> None:
    """--user-id without --email: the default dev email is already taken by
    then (the first command made that user), and the token must still work."""
    secret = "token-test-secret-" + "z" * 32
    env = _env(DATABASE_URL=admin_url, SUPABASE_JWT_SECRET=secret)
    run = {"env": env, "cwd": tmp_path, "capture_output": True, "text": True, "check": True}
    subprocess.run([*MEMCHAT, "token"], **run)  # the dev user exists now
    user_id = uuid.uuid4()
    token = subprocess.run([*MEMCHAT, "token", "--user-id", str(user_id)], **run).stdout.strip()

    claims = jwt.decode(token, secret, algorithms=["HS256"], audience="authenticated")
    assert claims["sub"] == str(user_id)
    row = admin.execute("select email from auth.users where id = %s", (user_id,)).fetchone()
    assert row == (f"{user_id}@example.test",)
    again = subprocess.run([*MEMCHAT, "token", "--user-id", str(user_id)], **run).stdout
    assert jwt.decode(again.strip(), secret, algorithms=["HS256"], audience="authenticated")[
        "sub"
    ] == str(user_id)
    taken = subprocess.run(
        [*MEMCHAT, "token", "--user-id", str(uuid.uuid4()), "--email", claims["email"]],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert taken.returncode != 0 and "another local user" in taken.stderr


def test_dev_serves_the_api_as_the_memchat_api_role(
    dev_server: tuple[str, dict[str, str]], admin: psycopg.Connection, tmp_path: Path
) -> None:
    url, env = dev_server
    token = subprocess.run(
        [*MEMCHAT, "token"], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    r = httpx.get(f"{url}/memory", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    pids = admin.execute(
        "select usename from pg_stat_activity where pid <> pg_backend_pid()"
        " and backend_type = 'client backend' and usename like 'memchat%%'"
    ).fetchall()
    assert ("memchat_api",) in pids


def test_summarize_runs_the_worker_once(
    dev_server: tuple[str, dict[str, str]], admin: psycopg.Connection, tmp_path: Path
) -> None:
    url, env = dev_server  # started with --summary-every 0: nothing in the background
    token = subprocess.run(
        [*MEMCHAT, "token", "--user-id", str(uuid.uuid4())],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    bearer = {"Authorization": f"Bearer {token}"}
    sid = str(uuid.uuid4())
    _long_conversation(url, bearer, sid, "step")

    result = subprocess.run(
        [*MEMCHAT, "summarize", "--max-seconds", "20"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )

    report = json.loads(result.stdout)
    assert report["summarized"] >= 1 and report["failed"] == 0
    (summary,) = admin.execute(
        "select summary from public.chat_sessions where id = %s", (uuid.UUID(sid),)
    ).fetchone()
    assert summary and "step 0" in summary


def test_migrate_is_idempotent(admin_url: str, tmp_path: Path) -> None:
    env = _env(DATABASE_URL=admin_url)
    result = subprocess.run(
        [*MEMCHAT, "migrate"], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert "0 applied" in result.stderr


def test_terminal_chat_uses_a_new_session_per_run(
    dev_server: tuple[str, dict[str, str]], admin: psycopg.Connection, tmp_path: Path
) -> None:
    url, env = dev_server
    sessions = []
    for first_line in ("hello there", "second run"):
        result = subprocess.run(
            [*MEMCHAT, "chat", "--url", url, "--agent", "cli"],
            input=f"{first_line}\n/notes\n",  # then EOF, like Ctrl-D
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert f'You said: "{first_line}"' in result.stdout
        assert "(no notes yet)" in result.stdout
        sid = result.stdout.split("session ", 1)[1].split()[0]
        sessions.append(uuid.UUID(sid))
        assert result.stdout.rstrip().endswith(f"bye (session {sid})")
    assert sessions[0] != sessions[1]
    rows = admin.execute(
        "select id, message_count from public.chat_sessions where id = any(%s)", (sessions,)
    ).fetchall()
    assert sorted(r[1] for r in rows) == [2, 2]


def test_cleanup_dry_run_prints_counts(admin_url: str, tmp_path: Path) -> None:
    env = _env(DATABASE_URL=admin_url)
    result = subprocess.run(
        [*MEMCHAT, "cleanup", "--dry-run"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(result.stdout)
    assert {"deleted_sessions", "deleted_messages", "batches", "duration_ms", "finished"} <= set(
        report
    )
