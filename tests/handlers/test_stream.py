"""ExportFunction's server (memchat.handlers.stream), as the Lambda Web Adapter runs it.

`python -m memchat.handlers.stream` is started as its own process with a
deployed function's environment (AWS_LWA_PORT set, settings from the
environment) and spoken to over real HTTP, as the adapter does: it must come
up, answer the readiness check, serve the exports streamed in chunks, and
nothing else.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from memchat import devtokens
from tests.conftest import JWT_SECRET
from tests.handlers.conftest import LambdaRuntime
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.users import UserFactory

ROOT = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 60
SESSION_ID = "6f1c1d2e-4b7a-4c3e-9a51-2f0e8d9c7b10"

# Messages as LangChain's PostgresChatMessageHistory stores them (message_to_dict).
FILL = """
insert into public.chat_message_history (session_id, user_id, message)
select %(session_id)s, %(user_id)s, jsonb_build_object(
    'type', t.kind,
    'data', jsonb_build_object('content', 'message ' || g || ' ' || repeat('x', 200),
                               'type', t.kind))
  from generate_series(1, %(count)s) g
 cross join lateral (select case when g %% 2 = 1 then 'human' else 'ai' end as kind) t
 order by g
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fill_session(admin: psycopg.Connection, user_id: uuid.UUID, count: int) -> uuid.UUID:
    session_id = uuid.uuid4()
    admin.execute(
        "insert into public.chat_sessions (id, user_id, title, message_count)"
        " values (%s, %s, 'a long one', %s)",
        (session_id, user_id, count),
    )
    admin.execute(FILL, {"session_id": session_id, "user_id": user_id, "count": count})
    return session_id


class StreamServer:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def stream_server(
    database_url: str, fake_openai: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamServer]:
    """`python -m memchat.handlers.stream` with a deployed function's environment."""
    port = free_port()
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.endswith(("_SECRET_ARN", "_PARAMETER"))
        and not name.startswith(("POWERTOOLS_", "AWS_LWA_"))
        and name not in {"SUPABASE_URL", "CORS_ALLOW_ORIGINS", "MEMORY_ENABLED"}
    }
    env.update(
        {
            "AWS_LWA_PORT": str(port),
            "DATABASE_URL": database_url,
            "SUPABASE_JWT_SECRET": JWT_SECRET,
            "OPENAI_API_KEY": "test-key",
            "OPENAI_BASE_URL": fake_openai.url,
            "LOG_LEVEL": "INFO",
            "POWERTOOLS_SERVICE_NAME": "memchat",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "functions"), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
    )
    log = tmp_path_factory.mktemp("stream") / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "memchat.handlers.stream"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = StreamServer(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:  # what the adapter's readiness check does
            assert process.poll() is None, f"the server exited:\n{server.output()}"
            assert time.monotonic() < deadline, f"no answer on /health:\n{server.output()}"
            try:
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def auth_for(user_id: uuid.UUID) -> dict[str, str]:
    return {"Authorization": f"Bearer {devtokens.mint(JWT_SECRET, user_id)}"}


def test_a_large_account_export_streams_in_chunks(
    stream_server: StreamServer, users: UserFactory, admin: psycopg.Connection
) -> None:
    count = 4000
    user_id = users.create().user_id
    session_id = fill_session(admin, user_id, count)

    chunks: list[bytes] = []
    with (
        httpx.Client(base_url=stream_server.url, timeout=60) as client,
        client.stream(
            "GET", "/export", params={"format": "ndjson"}, headers=auth_for(user_id)
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        headers = response.headers
        chunks.extend(chunk for chunk in response.iter_raw() if chunk)

    # Streamed: no length known up front, sent in HTTP/1.1 chunks as it is written.
    assert headers["transfer-encoding"] == "chunked"
    assert "content-length" not in headers
    assert headers["content-type"] == "application/x-ndjson"
    assert headers["content-disposition"].startswith('attachment; filename="memchat-export-')
    assert headers["cache-control"] == "no-store"
    assert headers["x-request-id"]
    body = b"".join(chunks)
    assert len(body) > 1_000_000
    assert len(chunks) >= 4, f"{len(chunks)} chunk(s) for {len(body)} bytes"

    # Complete: every message, in order, after the header and its session.
    assert body.endswith(b"\n")
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert lines[0]["type"] == "export" and lines[0]["user_id"] == str(user_id)
    assert lines[1]["type"] == "session" and lines[1]["id"] == str(session_id)
    messages = [line for line in lines if line["type"] == "message"]
    assert len(messages) == len(lines) - 2 == count
    assert {m["session_id"] for m in messages} == {str(session_id)}
    assert [m["content"].split(" ")[1] for m in messages] == [str(g) for g in range(1, count + 1)]
    assert [m["role"] for m in messages[:2]] == ["user", "assistant"]


@pytest.mark.parametrize(
    ("fmt", "media_type"),
    [
        ("json", "application/json"),
        ("ndjson", "application/x-ndjson"),
        ("markdown", "text/markdown; charset=utf-8"),
    ],
)
def test_session_export_formats(
    stream_server: StreamServer,
    users: UserFactory,
    admin: psycopg.Connection,
    fmt: str,
    media_type: str,
) -> None:
    user_id = users.create().user_id
    session_id = fill_session(admin, user_id, 3)

    response = httpx.get(
        f"{stream_server.url}/chat/export/{session_id}",
        params={"format": fmt},
        headers=auth_for(user_id),
    )

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == media_type
    assert response.headers["content-disposition"] == (
        f'attachment; filename="memchat-session-{session_id}.{"md" if fmt == "markdown" else fmt}"'
    )
    assert "message 3 xxx" in response.text
    if fmt == "json":
        exported = response.json()
        assert exported["session"]["id"] == str(session_id)
        assert [m["role"] for m in exported["messages"]] == ["user", "assistant", "user"]


def test_exports_check_the_token_and_the_owner(
    stream_server: StreamServer, users: UserFactory, admin: psycopg.Connection
) -> None:
    owner, other = users.create().user_id, users.create().user_id
    session_id = fill_session(admin, owner, 2)

    for path in ("/export", f"/chat/export/{session_id}"):
        response = httpx.get(f"{stream_server.url}{path}")
        assert response.status_code == 401, response.text
        assert response.json()["error"] == "unauthorized"

    response = httpx.get(f"{stream_server.url}/chat/export/{session_id}", headers=auth_for(other))
    assert response.status_code == 404, response.text
    assert response.json()["error"] == "session_not_found"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/chat"),
        ("POST", "/chat/clear-session"),
        ("GET", "/sessions"),
        ("GET", "/memory"),
        ("DELETE", "/me"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
    ],
)
def test_only_the_exports_are_served(stream_server: StreamServer, method: str, path: str) -> None:
    """The rest of the API stays behind API Gateway (throttling, access log)."""
    response = httpx.request(method, f"{stream_server.url}{path}", json={"message": "hi"})
    assert response.status_code == 404, response.text
    assert response.json()["error"] == "not_found"


def test_readiness_check_and_logs(stream_server: StreamServer) -> None:
    response = httpx.get(f"{stream_server.url}/health")
    assert response.json() == {"status": "ok", "database": "ok"}
    # The app's own JSON log lines, as build_app() configured them for Lambda.
    requests = [
        json.loads(line)
        for line in stream_server.output().splitlines()
        if line.startswith("{") and '"message":"request"' in line.replace(" ", "")
    ]
    assert requests and all(r["service"] == "memchat" for r in requests)


def test_secrets_are_resolved_as_for_the_http_functions(
    lambda_: LambdaRuntime, lambda_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same set-up as memchat.handlers.http: the database URL from Secrets Manager."""
    from memchat import secrets

    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:memchat/database-url-AbCdEf"
    fetched: list[str] = []

    def fake_get_secret(name: str) -> str:
        fetched.append(name)
        return json.dumps({"DATABASE_URL": lambda_env["DATABASE_URL"]})

    monkeypatch.setattr(secrets, "_fetch_secret", fake_get_secret)
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.setenv("DATABASE_URL_SECRET_ARN", arn)
    monkeypatch.setenv("AWS_LWA_PORT", "8123")
    stream = lambda_.load("stream")

    async def health() -> httpx.Response:
        app = stream.create_stream_app()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://lwa") as client:
                return await client.get("/health")
        finally:
            await app.app.state.memchat.close()

    loop = asyncio.new_event_loop()
    try:
        response = loop.run_until_complete(health())
    finally:
        loop.close()

    assert fetched == [arn]
    assert response.status_code == 200, response.text
    assert stream.port() == 8123
