"""`memchat import`, run as a person runs it (a subprocess), against a real
`memchat dev`: the exports' JSON and NDJSON forms and the plain shape, a
file split into several requests, a malformed file, the wait for embeddings
(with the backfill run by `memchat summarize`), the embeddings the backfill
gave up on, and its progress bar on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from memchat.usecases.backfill import MAX_ATTEMPTS
from tests.utils.dev_server import MEMCHAT, DevServer, dev_server
from tests.utils.fake_openai import FakeOpenAI, tool_call

T0 = "2023-05-20T09:30:00Z"


def run(dev: DevServer, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MEMCHAT, "import", *args, "--url", dev.url],
        env=dev.env,
        cwd=dev.home,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def client(dev: DevServer, token: str) -> httpx.Client:
    return httpx.Client(base_url=dev.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def plain(sessions: int, messages: int = 2, size: int = 20) -> dict[str, Any]:
    return {
        "sessions": [
            {
                "title": f"s{s}",
                "messages": [
                    {
                        "role": "user" if m % 2 == 0 else "assistant",
                        "content": f"{s}.{m} " + "x" * size,
                        "created_at": f"2023-05-{1 + s % 28:02d}T09:{m % 60:02d}:00Z",
                    }
                    for m in range(messages)
                ],
            }
            for s in range(sessions)
        ]
    }


def write(tmp_path: Path, name: str, content: Any) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def without_ids(export: dict[str, Any]) -> list[Any]:
    """An account export's sessions as an import keeps them."""
    sessions = []
    for session in export["sessions"]:
        sessions.append(
            {
                **{k: v for k, v in session.items() if k not in ("expires_at", "messages")},
                "messages": [
                    {k: v for k, v in m.items() if k != "id"} for m in session["messages"]
                ],
            }
        )
    return sessions


@pytest.fixture
def history(dev: DevServer, dev_model: FakeOpenAI) -> tuple[str, dict[str, Any]]:
    """A user with two sessions (one with a tool round) and notes; their token
    and their account export (JSON)."""
    token = dev.token()
    with client(dev, token) as c:
        dev_model.script(tool_call("append", content="## Drinks\ntea"))
        for message, agent in (("remember I like tea", "default"), ("hello", "work")):
            r = c.post("/chat", json={"message": message, "agent_name": agent})
            assert r.status_code == 200, r.text
        exported = c.get("/export").json()
    return token, exported


def test_an_account_export_round_trips_and_a_second_run_skips_it(
    dev: DevServer, history: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    _, exported = history
    path = write(tmp_path, "export.json", exported)
    token = dev.token()
    done = run(dev, str(path), "--token", token, "--no-wait")
    assert done.returncode == 0, done.stderr
    # Not a terminal: plain lines, no bar.
    assert done.stdout.splitlines() == [
        "sessions: 0/2",
        "sessions: 2/2",
        "imported 2 sessions (6 messages); skipped 0 this account has already",
    ]
    with client(dev, token) as c:
        again = c.get("/export").json()
    assert without_ids(again) == without_ids(exported)
    assert again["long_term_memory"][0]["notes"] == "## Drinks\ntea"

    second = run(dev, str(path), "--token", token, "--no-wait")
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[-1] == (
        "imported 0 sessions (0 messages); skipped 2 this account has already"
    )


def test_the_exports_ndjson_forms_are_read(
    dev: DevServer, history: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    owner, exported = history
    with client(dev, owner) as c:
        account = c.get("/export", params={"format": "ndjson"}).text
        one = c.get(
            f"/chat/export/{exported['sessions'][0]['id']}", params={"format": "ndjson"}
        ).text
    token = dev.token()
    for name, text in (("account.ndjson", account), ("session.ndjson", one)):
        done = run(dev, str(write(tmp_path, name, text)), "--token", token, "--no-wait")
        assert done.returncode == 0, (name, done.stderr)
    with client(dev, token) as c:
        again = c.get("/export").json()
    assert without_ids(again) == without_ids(exported)


def test_a_large_file_goes_in_several_requests(dev: DevServer, tmp_path: Path) -> None:
    path = write(tmp_path, "plain.json", plain(30, size=300))
    token = dev.token()
    done = run(dev, str(path), "--token", token, "--no-wait", "--max-request-bytes", "4000")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "sessions: 0/30" and lines[-2] == "sessions: 30/30"
    assert len(lines) > 4  # a line per request answered
    assert lines[-1] == "imported 30 sessions (60 messages); skipped 0 this account has already"

    too_big = write(tmp_path, "big.json", plain(1, size=5000))
    refused = run(dev, str(too_big), "--token", token, "--no-wait", "--max-request-bytes", "4000")
    assert refused.returncode == 1
    assert "sessions[0] alone is over 4000 bytes" in refused.stderr


def test_requests_are_split_by_what_the_server_takes(
    admin_url: str,
    model: FakeOpenAI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No --max-request-bytes: the server's IMPORT_MAX_BYTES, read from GET
    /sessions/import/status (what a deployment sets under Lambda's 6 MB),
    decides how the file is split (one request of it all would be a 413)."""
    monkeypatch.setenv("IMPORT_MAX_BYTES", "1000000")
    with dev_server(admin_url, tmp_path / "small", model) as small:
        path = write(tmp_path, "big.json", plain(24, messages=20, size=5000))
        assert path.stat().st_size > 2_000_000
        token = small.token()
        with client(small, token) as c:
            limits = c.get("/sessions/import/status").json()["limits"]
            assert limits["max_request_bytes"] == 1_000_000
        done = run(small, str(path), "--token", token, "--no-wait")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) >= 2 + 3  # 0/24, at least three requests answered, the summary
        assert lines[-1] == (
            "imported 24 sessions (480 messages); skipped 0 this account has already"
        )


def test_a_malformed_file_is_refused_before_anything_is_sent(
    dev: DevServer, tmp_path: Path
) -> None:
    document = plain(3)
    document["sessions"][2]["messages"][1]["created_at"] = "yesterday"
    token = dev.token()
    done = run(dev, str(write(tmp_path, "bad.json", document)), "--token", token, "--no-wait")
    assert done.returncode == 1
    assert "sessions[2].messages[1].created_at: not an ISO 8601 time with a zone" in done.stderr
    with client(dev, token) as c:
        assert c.get("/sessions").json()["sessions"] == []
    garbled = run(dev, str(write(tmp_path, "x.json", "{nope")), "--token", token)
    assert garbled.returncode == 1 and "neither JSON" in garbled.stderr


def test_a_file_with_nothing_to_import_says_so_and_fails(dev: DevServer, tmp_path: Path) -> None:
    token = dev.token()
    for name, document in (("empty.json", {"sessions": []}), ("bare.json", {"sessions": [],
                           "long_term_memory": []})):  # fmt: skip
        done = run(dev, str(write(tmp_path, name, document)), "--token", token, "--no-wait")
        assert done.returncode == 1, done
        assert "holds nothing to import" in done.stderr
        assert "imported 0 sessions" not in done.stdout


def test_it_waits_until_recall_sees_the_import(
    dev: DevServer, dev_model: FakeOpenAI, tmp_path: Path
) -> None:
    token = dev.token()
    path = write(tmp_path, "plain.json", plain(2, messages=4))
    timed_out = run(dev, str(path), "--token", token, "--timeout", "1")
    assert timed_out.returncode == 3, timed_out.stderr
    assert timed_out.stdout.splitlines()[-1] == (
        "8 messages still wait for embeddings; recall finds them once embedded"
    )

    waiting = subprocess.Popen(
        [*MEMCHAT, "import", str(path), "--url", dev.url, "--token", token, "--timeout", "60"],
        env=dev.env, cwd=dev.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1)
    worker = subprocess.run(
        [*MEMCHAT, "summarize"], env=dev.env, cwd=dev.home, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert out.splitlines()[-2:] == [
        "embedded: 8/8",
        "recall is ready: every imported message is embedded",
    ]


def test_it_says_when_the_backfill_gave_up_and_exits_4(
    dev: DevServer, dev_model: FakeOpenAI, admin: psycopg.Connection, tmp_path: Path
) -> None:
    """The embeddings of an import failed again and again and the backfill
    (`memchat summarize`) gave up on them: recall cannot find them, so every
    later import says so and exits 4, until that file is imported again."""
    user_id = uuid.uuid4()
    token = dev.token(user_id)
    first = write(tmp_path, "first.json", plain(2, messages=4))
    done = run(dev, str(first), "--token", token, "--no-wait")
    assert done.returncode == 0, done.stderr

    admin.execute("delete from memchat.embedding_queue where user_id <> %s", (user_id,))
    admin.execute("update memchat.embedding_queue set attempts = %s", (MAX_ATTEMPTS - 1,))
    dev_model.script_embeddings(*[{"status": 503}] * 4)
    worker = subprocess.run(
        [*MEMCHAT, "summarize"], env=dev.env, cwd=dev.home, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr
    assert json.loads(worker.stdout)["embeddings"]["gave_up"] == 2

    second = write(tmp_path, "second.json", plain(1, messages=2, size=40))
    warned = run(dev, str(second), "--token", token, "--no-wait")
    assert warned.returncode == 4, warned.stderr
    assert warned.stdout.splitlines()[-1] == (
        "imported 1 sessions (2 messages); skipped 0 this account has already"
    )
    assert warned.stderr.startswith(
        "! embeddings failed for 8 messages of this account: the embeddings provider failed"
        " again and again, and the backfill gave up on their sessions, so recall cannot find"
        " them\n"
    ), warned.stderr
    # Waiting does not hide it either.
    waited = run(dev, str(second), "--token", token, "--timeout", "1")
    assert waited.returncode == 4, waited.stderr
    assert "! embeddings failed for 8 messages of this account" in waited.stderr

    # The first file again: its sessions are queued again, nothing has failed.
    again = run(dev, str(first), "--token", token, "--timeout", "1")
    assert again.returncode == 3, again.stderr
    assert "embeddings failed" not in again.stderr
    assert again.stdout.splitlines()[-1] == (
        "10 messages still wait for embeddings; recall finds them once embedded"
    )


def test_a_terminal_gets_a_progress_bar(dev: DevServer, tmp_path: Path) -> None:
    path = write(tmp_path, "plain.json", plain(3))
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*MEMCHAT, "import", str(path), "--url", dev.url, "--token", dev.token(), "--no-wait"],
        env=dev.env, cwd=dev.home, stdin=follower, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        output += chunk
    assert proc.wait(timeout=60) == 0
    os.close(leader)
    text = output.decode()
    assert "\rsessions [" + "." * 30 + "] 0/3" in text
    assert "\rsessions [" + "#" * 30 + "] 3/3" in text
