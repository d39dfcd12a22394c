"""The local embeddings server's bounds (memchat.model.embedding_server),
over real HTTP against a real EmbeddingServer in this process: an input or a
request over its characters refused (413, OpenAI's error shape), a long
input embedded as its start, and a small request answered between the
forward passes of a large one instead of after it.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import openai
import pytest

from memchat.model import minilm
from memchat.model.embedding_server import MAX_INPUT_CHARS, MAX_REQUEST_CHARS, EmbeddingServer

MODEL = minilm.NAME
FOX = "The quick brown fox jumps over the lazy dog. "  # 10 word pieces
QUERY = "what is my favourite colour?"


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddingServer]:
    running = EmbeddingServer(minilm.load(), port=0)
    running.start()
    yield running
    running.close()


def post(server: EmbeddingServer, inputs: str | list[str], **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "input": inputs, **extra}
    return httpx.post(f"{server.url}/embeddings", json=body, timeout=120)


def refusal(response: httpx.Response) -> dict[str, Any]:
    """The error of a 413 in OpenAI's shape."""
    assert response.status_code == 413, response.text[:200]
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "input"
    return error


def vectors(response: httpx.Response) -> list[list[float]]:
    assert response.status_code == 200, response.text[:200]
    return [item["embedding"] for item in response.json()["data"]]


def test_an_input_over_the_bound_is_refused_naming_it(server: EmbeddingServer) -> None:
    over = "x" * (MAX_INPUT_CHARS + 1)
    error = refusal(post(server, ["fine", "also fine", over, "fine"]))
    assert error["code"] == "input_too_long"
    assert error["message"].startswith(f"input[2] is {MAX_INPUT_CHARS + 1} characters;")
    assert f"at most {MAX_INPUT_CHARS}" in error["message"]

    # A string alone, ten million characters of it: refused without being read.
    error = refusal(post(server, FOX * 222_223))
    assert error["message"].startswith("input is 10000035 characters;")

    # The openai client sees the status and the message.
    client = openai.OpenAI(base_url=server.url, api_key="local", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError, match=r"input\[1\] is") as raised:
        client.embeddings.create(model=MODEL, input=["fine", over])
    assert raised.value.status_code == 413

    # At the bound: embedded.
    assert len(vectors(post(server, ["fine", "x " * (MAX_INPUT_CHARS // 2)]))) == 2


def test_a_request_over_the_total_bound_is_refused_naming_it(server: EmbeddingServer) -> None:
    each = FOX * (MAX_INPUT_CHARS // len(FOX))  # each within the bound
    count = MAX_REQUEST_CHARS // len(each) + 1
    error = refusal(post(server, [each] * count))
    assert error["code"] == "request_too_large"
    assert error["message"] == (
        f"the inputs are {count * len(each)} characters in all; a request may have at most"
        f" {MAX_REQUEST_CHARS} (send them in several requests)"
    )


def test_a_long_input_within_the_bound_is_embedded_as_its_start(
    server: EmbeddingServer,
) -> None:
    long = FOX * (MAX_INPUT_CHARS // len(FOX))
    start = FOX * 26  # 260 word pieces: more than the model reads of either
    served = post(server, long)
    assert served.json()["usage"]["prompt_tokens"] == minilm.MAX_TOKENS
    assert vectors(served) == vectors(post(server, start))
    expected = server.model.embed([long])[0].tolist()
    assert vectors(served)[0] == pytest.approx(expected, abs=1e-6)

    # Words past a long run of spaces are read: the start holds too few word pieces.
    padded = "my car is teal" + " " * (MAX_INPUT_CHARS - 100) + "and so is my bike"
    assert vectors(post(server, padded)) == vectors(post(server, " ".join(padded.split())))


def send_with_its_body_read(server: EmbeddingServer, inputs: list[str]) -> socket.socket:
    """POST `inputs` on a socket of its own, the body sent once the server has
    its headers and asks for it (Expect: 100-continue): the request is in the
    server's hands when this returns. Read the answer from the socket."""
    address = urlsplit(server.url)
    assert address.hostname is not None and address.port is not None
    body = json.dumps({"model": MODEL, "input": inputs, "encoding_format": "base64"}).encode()
    sock = socket.create_connection((address.hostname, address.port), timeout=600)
    head = (
        "POST /v1/embeddings HTTP/1.1\r\n"
        f"Host: {address.netloc}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Expect: 100-continue\r\n\r\n"
    )
    sock.sendall(head.encode())
    interim = b""
    while not interim.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        assert byte, interim
        interim += byte
    assert interim.startswith(b"HTTP/1.1 100"), interim
    sock.sendall(body)
    return sock


def test_a_small_request_is_answered_while_a_large_one_is_in_progress(
    server: EmbeddingServer,
) -> None:
    # 64 texts of 256 word pieces: 16 forward passes, each a turn. Each query
    # waits for the pass in progress, so five of them are answered long
    # before the large request's last pass.
    large = [f"{n}. " + FOX * 40 for n in range(64)]
    finished: list[str] = []
    answers: dict[str, Any] = {}
    sock = send_with_its_body_read(server, large)

    def read_large() -> None:
        response = http.client.HTTPResponse(sock)
        response.begin()
        answers["large"] = (response.status, json.loads(response.read()))
        finished.append("large")

    reader = threading.Thread(target=read_large, daemon=True)
    reader.start()
    try:
        with httpx.Client(timeout=600) as client:
            for _ in range(5):
                answer = client.post(
                    f"{server.url}/embeddings", json={"model": MODEL, "input": QUERY}
                )
                finished.append("small")
                answers.setdefault("small", []).append(vectors(answer)[0])
        reader.join(timeout=600)
    finally:
        sock.close()
    assert finished == ["small"] * 5 + ["large"]

    status, body = answers["large"]
    assert status == 200
    assert [item["index"] for item in body["data"]] == list(range(64))
    expected = server.model.embed([QUERY, large[0], large[63]])
    for vector in answers["small"]:
        assert vector == pytest.approx(expected[0].tolist(), abs=1e-6)
    for at, want in ((0, expected[1]), (63, expected[2])):
        got = np.frombuffer(base64.b64decode(body["data"][at]["embedding"]), dtype="<f4")
        assert got.tolist() == pytest.approx(want.tolist(), abs=1e-6)
