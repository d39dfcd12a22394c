"""The streaming functions' server (memchat.handlers.stream), as the Lambda Web Adapter runs it.

`python -m memchat.handlers.stream` is started as its own process with a
deployed function's environment (ROUTE_GROUPS and AWS_LWA_PORT set, settings
from the environment) and spoken to over real HTTP, as the adapter does, once
as each function runs it:

- ExportFunction's (ROUTE_GROUPS=export): it must come up, answer the
  readiness check, serve the exports streamed in chunks, and nothing else;
- ChatStreamFunction's (ROUTE_GROUPS=chat): it must come up, answer the
  readiness check, serve POST /chat (a JSON turn end to end against the
  fake model; a streamed turn's events as they are written, over the wire)
  and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from memchat import bootstrap, devtokens
from tests.conftest import JWT_SECRET
from tests.handlers.conftest import LambdaRuntime
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.processes import free_port, stop, wait_healthy
from tests.utils.sse import iter_events
from tests.utils.users import UserFactory

ROOT = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 60
KEEPALIVE_SECONDS = 0.2
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


@contextlib.contextmanager
def run_stream_server(route_groups: str, env: dict[str, str], log: Path) -> Iterator[StreamServer]:
    """`python -m memchat.handlers.stream` with a deployed function's environment."""
    port = free_port()
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.endswith(("_SECRET_ARN", "_PARAMETER"))
        and not name.startswith(("POWERTOOLS_", "AWS_LWA_", "OPENAI_"))
        and name not in {"SUPABASE_URL", "CORS_ALLOW_ORIGINS", "MEMORY_ENABLED"}
    }
    environment.update(
        {
            "ROUTE_GROUPS": route_groups,
            "AWS_LWA_PORT": str(port),
            "SUPABASE_JWT_SECRET": JWT_SECRET,
            "LOG_LEVEL": "INFO",
            "POWERTOOLS_SERVICE_NAME": "memchat",
            "POWERTOOLS_METRICS_NAMESPACE": "memchat",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "functions"), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            **env,
        }
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "memchat.handlers.stream"],
            env=environment,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = StreamServer(f"http://127.0.0.1:{port}", process, log)
    try:
        # What the adapter's readiness check does.
        wait_healthy(server.url, process, server.output, "the server", STARTUP_SECONDS)
        yield server
    finally:
        stop(process)


@pytest.fixture(scope="module")
def stream_server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamServer]:
    """ExportFunction's server: ROUTE_GROUPS=export, and no model key."""
    log = tmp_path_factory.mktemp("stream") / "export-server.log"
    with run_stream_server("export", {"DATABASE_URL": database_url}, log) as server:
        yield server


@pytest.fixture(scope="module")
def chat_stream_server(
    database_url: str, fake_openai: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamServer]:
    """ChatStreamFunction's server: ROUTE_GROUPS=chat, with the model key."""
    env = {
        "DATABASE_URL": database_url,
        "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": fake_openai.url,
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "0",
        "OPENAI_TIMEOUT_SECONDS": "10",
        # Short, so that the keep-alive comments show within a test.
        "STREAM_KEEPALIVE_SECONDS": str(KEEPALIVE_SECONDS),
    }
    log = tmp_path_factory.mktemp("stream") / "chat-server.log"
    with run_stream_server("chat", env, log) as server:
        yield server


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
    body = response.json()
    assert body["error"] == "not_found"
    assert body["request_id"] == response.headers["x-request-id"]
    assert body["detail"].startswith(
        f"There is no endpoint {method} {path} at the export URL"
        " (only GET /export and GET /chat/export/{session_id}): use the API URL"
    )
    if (method, path) == ("POST", "/chat"):
        assert "or the chat stream URL" in body["detail"]


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
        app = bootstrap.stream_app()
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


# ------------------------------------------------------------ chat stream
# POST /chat with `Accept: text/event-stream` answers Server-Sent Events
# (memchat.api.sse).
SSE_MEDIA_TYPE = "text/event-stream"
STREAM_HEADERS = {"Accept": SSE_MEDIA_TYPE}


def assert_event_stream(response: httpx.Response) -> None:
    assert response.headers["content-type"].startswith(SSE_MEDIA_TYPE), (
        f"POST /chat with Accept: {SSE_MEDIA_TYPE} answered {response.headers['content-type']}"
    )


@contextlib.contextmanager
def streamed_chat(
    server: StreamServer, user_id: uuid.UUID, message: str
) -> Iterator[httpx.Response]:
    """POST /chat asking for the event stream; the 200 response, being read."""
    with httpx.stream(
        "POST",
        f"{server.url}/chat",
        json={"message": message},
        headers={**auth_for(user_id), **STREAM_HEADERS},
        timeout=30,
    ) as response:
        assert response.status_code == 200, response.read()
        assert_event_stream(response)
        yield response


def stored_messages(admin: psycopg.Connection, session_id: str) -> list[tuple[str, str]]:
    rows = admin.execute(
        "select message->>'type', message->'data'->>'content'"
        "  from public.chat_message_history where session_id = %s order by id",
        (session_id,),
    ).fetchall()
    return [(kind, content) for kind, content in rows]


def wait_for(check: Callable[[], bool], what: str, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def test_the_chat_stream_server_answers_the_readiness_check(
    chat_stream_server: StreamServer,
) -> None:
    response = httpx.get(f"{chat_stream_server.url}/health")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok", "database": "ok"}


def test_a_json_turn_through_the_chat_stream_server(
    chat_stream_server: StreamServer,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
) -> None:
    """Without Accept: text/event-stream, POST /chat answers JSON exactly as through the API."""
    user_id = users.create().user_id
    message = f"the code word is {uuid.uuid4().hex}"

    response = httpx.post(
        f"{chat_stream_server.url}/chat",
        json={"message": message},
        headers=auth_for(user_id),
        timeout=30,
    )

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["answer"] == f"echo: {message}"
    assert body["model"] == "fake-model"
    assert body["session_id"] == response.headers["x-session-id"]
    assert body["session"]["message_count"] == 2
    assert response.headers["x-request-id"]
    assert model.calls == 1 and not model.requests[0].get("stream")
    assert stored_messages(admin, body["session_id"]) == [
        ("human", message),
        ("ai", f"echo: {message}"),
    ]
    # The turn's metrics are published as it ends (one EMF line), as the
    # API Gateway chat function's are at the end of each invocation.
    wait_for(lambda: '"TurnLatency"' in chat_stream_server.output(), "the turn's metrics")
    emf = [
        json.loads(line)
        for line in chat_stream_server.output().splitlines()
        if line.startswith("{") and '"_aws"' in line and '"TurnLatency"' in line
    ]
    assert emf and emf[-1]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "memchat"
    # Never the message text (nor the answer that echoes it) in the logs.
    assert message.split()[-1] not in chat_stream_server.output()


def test_an_openai_streamed_turn_through_the_chat_stream_server(
    chat_stream_server: StreamServer,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
) -> None:
    """POST /v1/chat/completions with `stream: true` at the chat stream URL:
    OpenAI's chunks as the model writes them, then [DONE]; the turn stored."""
    user_id = users.create().user_id
    message = f"the pass phrase is {uuid.uuid4().hex}"
    body = {"model": "memchat", "messages": [{"role": "user", "content": message}], "stream": True}
    with httpx.stream(
        "POST",
        f"{chat_stream_server.url}/v1/chat/completions",
        json=body,
        headers=auth_for(user_id),
        timeout=30,
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == f"echo: {message}"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    session_id = response.headers["x-memchat-session-id"]
    assert stored_messages(admin, session_id) == [("human", message), ("ai", f"echo: {message}")]
    assert model.requests[-1]["stream"] is True
    # Never the message text (nor the answer that echoes it) in the logs.
    assert message.split()[-1] not in chat_stream_server.output()


def test_the_chat_stream_server_checks_the_token(chat_stream_server: StreamServer) -> None:
    for headers in ({}, STREAM_HEADERS):
        response = httpx.post(
            f"{chat_stream_server.url}/chat", json={"message": "hi"}, headers=headers
        )
        assert response.status_code == 401, response.text
        assert response.json()["error"] == "unauthorized"


@pytest.mark.parametrize(
    ("method", "path", "elsewhere"),
    [
        ("GET", "/export", "use the export URL"),
        ("GET", f"/chat/export/{SESSION_ID}", "use the export URL"),
        ("GET", "/chat", "use the API URL"),
        ("POST", "/chat/clear-session", "use the API URL"),
        ("GET", "/sessions", "use the API URL"),
        ("GET", "/sessions/active", "use the API URL"),
        ("GET", "/memory", "use the API URL"),
        ("PUT", "/memory", "use the API URL"),
        ("DELETE", "/me", "use the API URL"),
        ("GET", "/docs", "use the API URL"),
        ("GET", "/openapi.json", "use the API URL"),
    ],
)
def test_only_post_chat_is_served_at_the_chat_stream_url(
    chat_stream_server: StreamServer, method: str, path: str, elsewhere: str
) -> None:
    """The rest of the API stays behind API Gateway; the exports at their own URL."""
    response = httpx.request(method, f"{chat_stream_server.url}{path}", json={"message": "hi"})
    assert response.status_code == 404, response.text
    body = response.json()
    assert body["error"] == "not_found"
    assert body["request_id"] == response.headers["x-request-id"]
    assert body["detail"] == (
        f"There is no endpoint {method} {path} at the chat stream URL"
        " (only POST /chat and POST /v1/chat/completions):"
        f" {elsewhere}."
    )


def test_a_streamed_turn_arrives_as_it_is_written(
    chat_stream_server: StreamServer,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
) -> None:
    """Through uvicorn each event reaches the client as it is sent: nothing is buffered."""
    user_id = users.create().user_id
    pieces = ["Streamed ", "from ", "the ", "chat ", "stream ", "URL."]
    answer = "".join(pieces)
    first_token_delay, chunk_delay = 0.6, 0.15
    # The model is silent for first_token_delay, then writes a piece every chunk_delay.
    model.script(
        {
            "content": answer,
            "chunks": pieces,
            "first_token_delay": first_token_delay,
            "chunk_delay": chunk_delay,
        }
    )

    with streamed_chat(chat_stream_server, user_id, "stream me") as response:
        headers = response.headers
        events = list(iter_events(response))

    assert "content-length" not in headers
    assert headers["transfer-encoding"] == "chunked"
    assert headers["cache-control"] == "no-cache"
    assert headers["x-request-id"]
    named = [e for e in events if e.name != "comment"]
    start, done = named[0], named[-1]
    assert (start.name, done.name) == ("start", "done")
    assert {e.name for e in named} <= {"start", "delta", "notes", "done"}
    deltas = [e for e in named if e.name == "delta"]
    assert "".join(e.data["text"] for e in deltas) == answer == done.data["answer"]
    assert done.data["session_id"] == start.data["session_id"] == headers["x-session-id"]
    assert model.requests[-1]["stream"] is True

    # Over the wire, as written: `start` before the model said anything,
    # keep-alive comments while it was silent, the first delta well before
    # `done` (the model was still writing), nothing after `done`.
    first = deltas[0]
    assert first.at - start.at >= first_token_delay * 0.8, events
    assert any(e.name == "comment" and e.data == "keep-alive" for e in events if e.at < first.at)
    assert done.at - first.at >= (len(pieces) - 1) * chunk_delay * 0.8, events
    assert events[-1] is done
    assert stored_messages(admin, done.data["session_id"]) == [
        ("human", "stream me"),
        ("ai", answer),
    ]


def test_a_streamed_turn_is_stored_when_the_client_goes_away(
    chat_stream_server: StreamServer,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
) -> None:
    """A client that disconnects mid-answer: the server finishes the turn and stores it."""
    user_id = users.create().user_id
    pieces = [f"piece{i} " for i in range(12)]
    answer = "".join(pieces)
    model.script({"content": answer, "chunks": pieces, "chunk_delay": 0.1})

    with streamed_chat(chat_stream_server, user_id, "I will not wait") as response:
        session_id = response.headers["x-session-id"]
        seen = []
        for event in iter_events(response):
            seen.append(event.name)
            if event.name == "delta":
                break  # and close the connection, the answer half-read
    assert "done" not in seen

    wait_for(
        lambda: len(stored_messages(admin, session_id)) == 2, "the turn to be stored", seconds=20
    )
    assert stored_messages(admin, session_id) == [("human", "I will not wait"), ("ai", answer)]
    # The server is still there for the next request.
    assert httpx.get(f"{chat_stream_server.url}/health").status_code == 200


def test_the_routes_served_follow_route_groups() -> None:
    """export -> the two exports; chat -> the chat turns; /health always; nothing else."""
    from fastapi import FastAPI

    from memchat.api import streamed as stream
    from memchat.config import ConfigError

    app = FastAPI()
    exports = {("GET", "/export"), ("GET", "/chat/export/{session_id}")}
    assert stream.routes_for({"export"}) == exports
    turns = {("POST", "/chat"), ("POST", "/v1/chat/completions")}
    assert stream.routes_for({"chat"}) == turns
    assert stream.routes_for({"chat", "sessions"}) == turns
    assert stream.routes_for({"sessions", "summaries"}) == set()
    with pytest.raises(ConfigError, match="ROUTE_GROUPS"):
        stream.StreamedRoutesOnly(app, {"sessions"})

    chat = stream.StreamedRoutesOnly(app, {"chat"})
    assert chat.serves("POST", "/chat") and chat.serves("GET", "/health")
    assert chat.serves("HEAD", "/health")
    assert not chat.serves("GET", "/chat") and not chat.serves("GET", "/export")
    assert not chat.serves("POST", "/chat/clear-session")

    # Both groups in one server (e.g. by hand, with ROUTE_GROUPS unset): both sets.
    both = stream.StreamedRoutesOnly(app, {"chat", "export", "sessions"})
    assert both.serves("POST", "/chat") and both.serves("GET", f"/chat/export/{SESSION_ID}")
    assert both.serves("GET", "/export") and not both.serves("GET", "/sessions")
    assert both.elsewhere("GET", "/sessions") == "use the API URL"
