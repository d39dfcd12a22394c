"""The 1 MB request body limit, for bodies that say their length and for
chunked ones that do not: the server stops reading soon after the limit
(counted in chunks the client got to send, not in time) and answers the
contract's 413.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest

from memchat import bootstrap
from memchat.api.middleware import MAX_BODY_BYTES
from memchat.config import Settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.store_data import snapshot

CHUNK = 64 * 1024
HUGE = 200 * 1024 * 1024  # what a careless or hostile client sends
# The chunk that takes the body past the limit is the last one read.
CHUNKS_TO_PASS_THE_LIMIT = MAX_BODY_BYTES // CHUNK + 1


class Upload:
    """A body of `total` bytes in CHUNK pieces, counting the pieces handed out."""

    def __init__(self, total: int = HUGE) -> None:
        self.chunks = total // CHUNK
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        for _ in range(self.chunks):
            self.sent += 1
            yield b"x" * CHUNK

    async def stream(self) -> AsyncIterator[bytes]:
        for chunk in self:
            yield chunk


def assert_too_large(response: httpx.Response) -> None:
    body = assert_error(response, 413, "payload_too_large")
    assert str(MAX_BODY_BYTES) in body["detail"]
    assert response.headers["connection"] == "close"


async def test_a_chunked_body_is_refused_after_about_1_mb(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    upload = Upload()
    r = await api.post(
        "/chat", content=upload.stream(), headers={**auth, "Content-Type": "application/json"}
    )
    assert "content-length" not in r.request.headers  # chunked: no length to check first
    assert_too_large(r)
    # The transport hands the app chunks as it asks for them (it does not
    # buffer the body), so this counts what the app read.
    assert upload.sent == CHUNKS_TO_PASS_THE_LIMIT, upload.sent
    assert model.calls == 0
    assert snapshot(admin, user_id)["chat_sessions"] == []


@pytest.mark.parametrize("method", ["PUT", "POST"], ids=["memory", "clear-session"])
async def test_every_body_is_limited(api: ApiClient, method: str) -> None:
    _, auth = api.new_user()
    upload = Upload()
    path = "/memory" if method == "PUT" else "/chat/clear-session"
    r = await api.request(
        method, path, content=upload.stream(), headers={**auth, "Content-Type": "application/json"}
    )
    assert_too_large(r)
    assert upload.sent == CHUNKS_TO_PASS_THE_LIMIT


def exact_body(size: int) -> bytes:
    """A /chat body of exactly `size` bytes (its message over MAX_MESSAGE_CHARS)."""
    frame = len(json.dumps({"message": ""}))
    return json.dumps({"message": "x" * (size - frame)}).encode()


async def chunked(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 1000):
        yield body[start : start + 1000]


async def test_a_chunked_body_of_exactly_the_limit_is_read(api: ApiClient) -> None:
    _, auth = api.new_user()
    headers = {**auth, "Content-Type": "application/json"}
    body = exact_body(MAX_BODY_BYTES)
    assert len(body) == MAX_BODY_BYTES
    r = await api.post("/chat", content=chunked(body), headers=headers)
    # Read whole and parsed: refused for the message's length, not the body's.
    detail = assert_error(r, 413, "payload_too_large")["detail"]
    assert detail.startswith("message is ")

    r = await api.post("/chat", content=chunked(exact_body(MAX_BODY_BYTES + 1)), headers=headers)
    assert_too_large(r)


async def test_a_small_chunked_body_is_served(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    body = json.dumps({"message": "hello in pieces"}).encode()

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 5):
            yield body[start : start + 5]

    r = await api.post(
        "/chat", content=pieces(), headers={**auth, "Content-Type": "application/json"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["answer"] == "echo: hello in pieces"


# -------------------------------------------------- the ASGI app directly


async def call_app(app: Any, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes, int, int]:
    """POST /chat with an endless body, by hand: (status, body, chunks read,
    chunks read after the response started)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/chat",
        "raw_path": b"/chat",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"memchat.test"), (b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("memchat.test", 80),
    }
    reads = reads_after_start = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal reads, reads_after_start
        reads += 1
        reads_after_start += bool(sent)
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    start, *bodies = sent
    assert start["type"] == "http.response.start"
    body = b"".join(m.get("body", b"") for m in bodies)
    return start["status"], body, reads, reads_after_start


async def test_the_app_reads_no_further_than_the_chunk_past_the_limit(api: ApiClient) -> None:
    _, auth = api.new_user()
    token = auth["Authorization"].encode()
    status, body, reads, late = await call_app(
        api.app, [(b"authorization", token), (b"transfer-encoding", b"chunked")]
    )
    assert status == 413
    assert json.loads(body)["error"] == "payload_too_large"
    assert reads == CHUNKS_TO_PASS_THE_LIMIT and late == 0


async def test_a_declared_length_over_the_limit_is_refused_unread(api: ApiClient) -> None:
    status, body, reads, _ = await call_app(api.app, [(b"content-length", str(HUGE).encode())])
    assert status == 413
    assert json.loads(body)["error"] == "payload_too_large"
    assert reads == 0


# ---------------------------------------------------- under a real server


def free_listening_socket() -> socket.socket:
    sock = socket.socket()
    # A small receive buffer, so the kernel holds little of what the client sent.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CHUNK)
    sock.bind(("127.0.0.1", 0))
    return sock


async def test_under_uvicorn_the_connection_is_closed_soon_after_the_limit(
    settings: Settings,
) -> None:
    """As the export function serves the app: uvicorn would otherwise read
    (and throw away) all 200 MB; with `Connection: close` on the 413 it stops.
    What the client got to send includes what the sockets' buffers held."""
    import uvicorn

    app = bootstrap.app(settings)
    sock = free_listening_socket()
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            await asyncio.sleep(0.01)
        upload = Upload()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/chat"
        r = await asyncio.to_thread(
            httpx.post, url, content=iter(upload), headers={"Content-Type": "application/json"}
        )
        assert_too_large(r)
        assert upload.sent * CHUNK < 16 * MAX_BODY_BYTES, upload.sent
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)
        sock.close()
        await app.state.memchat.close()
