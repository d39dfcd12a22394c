"""ModelClient.embed: the real `openai` client against the fake server.

An embedding serves recall only, so every failure (an HTTP error, a timeout,
a refused connection, a body that is not an embedding of the configured
size) must come out as EmbeddingUnavailable, quickly, after one request,
and be logged without the text. The offline responder (`memchat dev` with
no key) embeds with the local embedder and quotes recalled exchanges.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import openai
import pytest

from memchat.config import load_settings
from memchat.model import offline
from memchat.model.client import EmbeddingUnavailable, ModelClient
from memchat.model.embeddings import local_embedding
from memchat.prompts.memory import memory_block
from memchat.store import Hit
from tests.conftest import JWT_SECRET, UNUSED_DATABASE
from tests.utils.fake_openai import FakeOpenAI, float32s
from tests.utils.logs import assert_not_logged

TEXT = "my favourite colour is teal"  # must never reach a log record
LOGGER = "memchat.model.client"


MODEL_CLIENT_SETTINGS = {
    "embedding_dimensions": 512,
    "embedding_timeout_seconds": 2,
    # The chat calls' retries: embed must not use them.
    "openai_max_retries": 2,
}


@pytest.fixture
def client(model: FakeOpenAI, model_client_for: Callable[..., ModelClient]) -> ModelClient:
    return model_client_for(model.url)


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


# ------------------------------------------------------------ success


async def test_embed_returns_a_unit_vector_of_embedding_dimensions(
    client: ModelClient, model: FakeOpenAI
) -> None:
    vector = await client.embed(TEXT, "query")
    assert len(vector) == 512
    assert all(isinstance(v, float) for v in vector)
    assert norm(vector) == pytest.approx(1.0)
    assert vector == pytest.approx(local_embedding(TEXT, 512))  # the fake's default
    # One request, with everything any OpenAI-compatible server needs.
    assert model.embedding_requests == [
        {
            "model": "text-embedding-3-small",
            "input": TEXT,
            "dimensions": 512,
            "encoding_format": "base64",
        }
    ]
    assert model.calls == 0 and model.requests == []  # chat counters untouched


async def test_the_request_carries_the_configured_model_and_dimensions(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient]
) -> None:
    client = model_client_for(
        model.url, openai_embedding_model="nomic-embed-text", embedding_dimensions=64
    )
    vector = await client.embed("hello there", "query")
    assert len(vector) == 64
    request = model.embedding_requests[-1]
    assert (request["model"], request["dimensions"], request["encoding_format"]) == (
        "nomic-embed-text",
        64,
        "base64",
    )


async def test_the_vector_is_l2_normalised(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient]
) -> None:
    # A server that sends unnormalised vectors (and integers) still gives a
    # unit vector: cosine similarity is then the dot product.
    client = model_client_for(model.url, embedding_dimensions=4)
    model.script_embeddings({"vector": [3, 4, 0, 0]}, {"vector": [1e300, -1e300, 1e300, 0.0]})
    assert await client.embed("a", "query") == pytest.approx([0.6, 0.8, 0.0, 0.0])
    third = 1 / math.sqrt(3)
    assert await client.embed("b", "query") == pytest.approx([third, -third, third, 0.0])


async def test_similar_texts_have_a_high_dot_product(client: ModelClient) -> None:
    stored = await client.embed("my favourite colour is teal", "document")
    query = await client.embed("what is my favourite colour?", "query")
    other = await client.embed("the quarterly revenue report is due on Friday", "query")
    assert sum(a * b for a, b in zip(stored, query, strict=True)) > 0.3
    assert abs(sum(a * b for a, b in zip(other, query, strict=True))) < 0.15


async def test_text_the_sdk_cannot_encode_is_repaired_before_sending(
    client: ModelClient, model: FakeOpenAI
) -> None:
    # A lone surrogate makes the SDK raise UnicodeEncodeError; NUL means nothing.
    vector = await client.embed("caf\ud800 au\x00 lait", "query")
    assert len(vector) == 512
    assert model.embedding_requests[-1]["input"] == "caf\ufffd au lait"


async def test_an_empty_text_is_not_sent(client: ModelClient, model: FakeOpenAI) -> None:
    for text in ["", "   \n", "\x00"]:
        with pytest.raises(EmbeddingUnavailable, match="empty"):
            await client.embed(text, "query")
    assert model.embedding_requests == []


# ------------------------------------------------------------ separate from chat


async def test_embeddings_never_take_chat_replies_and_run_alongside_chat(
    client: ModelClient, model: FakeOpenAI
) -> None:
    model.script({"content": "the chat reply"})
    model.script_embeddings({"status": 500})
    answer, embedding = await asyncio.gather(
        client.complete([{"role": "user", "content": "hi"}]),
        client.embed(TEXT, "query"),
        return_exceptions=True,
    )
    assert not isinstance(answer, BaseException) and answer.content == "the chat reply"
    assert isinstance(embedding, EmbeddingUnavailable)
    assert model.calls == 1 and len(model.embedding_requests) == 1

    # The next embedding is the default again; the chat queue is untouched by it.
    model.script({"content": "second"})
    assert len(await client.embed(TEXT, "query")) == 512
    assert (await client.complete([{"role": "user", "content": "hi"}])).content == "second"
    assert model.calls == 2 and len(model.embedding_requests) == 2


async def test_chat_keeps_its_retries_after_an_embedding_failed(
    client: ModelClient, model: FakeOpenAI
) -> None:
    # The embedding's no-retry options are a copy: the chat client still retries.
    model.script_embeddings({"status": 500})
    with pytest.raises(EmbeddingUnavailable):
        await client.embed(TEXT, "query")
    model.script({"status": 500}, {"content": "after a retry"})
    assert (await client.complete([{"role": "user", "content": "hi"}])).content == "after a retry"
    assert model.calls == 2 and len(model.embedding_requests) == 1


# ------------------------------------------------------------ failures

HTML = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


FAILURES: dict[str, dict[str, Any]] = {
    # HTTP errors: not retried, although the client's OPENAI_MAX_RETRIES is 2.
    "http-500": {"status": 500},
    "http-429": {"status": 429, "error": "rate limited"},
    "http-400": {"status": 400, "error": "input too long"},
    "http-401": {"status": 401},
    "http-404": {"status": 404},
    # Bodies that are not JSON.
    "truncated-json": {"raw": '{"data": [{"embedding": [0.1, 0.2'},
    "empty-body": {"raw": ""},
    "html": {"raw": HTML, "content_type": "text/html"},
    "html-labelled-json": {"raw": HTML},
    "plain-text": {"raw": "upstream overloaded", "content_type": "text/plain"},
    "invalid-utf8": {"raw": b'{"data": "\xff\xfe"}'},
    "deeply-nested": {"raw": "[" * 100_000 + "]" * 100_000},
    # JSON of the wrong shape.
    "json-array": {"raw": "[1, 2, 3]"},
    "json-string": {"raw": '"hello"'},
    "data-missing": {"override": {"data": None}},
    "data-string": {"override": {"data": "x"}},
    "data-object": {"override": {"data": {"embedding": [1.0]}}},
    "data-empty": {"override": {"data": []}},
    "data-item-string": {"override": {"data": ["x"]}},
    "embedding-missing": {"override": {"data": [{"index": 0}]}},
    # The vector.
    "vector-string": {"vector": "AAAAAA=="},
    "vector-object": {"vector": {"0": 0.5}},
    "vector-null": {"vector": None},
    "vector-empty": {"vector": []},
    "vector-of-strings": {"vector": ["0.1"] * 512},
    "vector-with-null": {"vector": [0.1] * 511 + [None]},
    "vector-with-bool": {"vector": [True] + [0.1] * 511},
    "vector-nested": {"vector": [[0.1]] * 512},
    "vector-nan": {"vector": [math.nan] + [0.1] * 511},
    "vector-infinity": {"vector": [0.1] * 511 + [-math.inf]},
    "vector-overflow": {"raw": '{"data": [{"embedding": [1e400' + ", 0.1" * 511 + "]}]}"},
    "vector-huge-int": {"raw": '{"data": [{"embedding": [1' + "0" * 400 + ", 0" * 511 + "]}]}"},
    "vector-all-zeros": {"vector": [0.0] * 512},
    "vector-too-short": {"vector": [0.1] * 511},
    "vector-too-long": {"vector": [0.1] * 513},
    "ignores-dimensions": {"dimensions": 1536},
    # The vector as base64 (float32 bytes, what memchat asks for).
    "base64-invalid": {"vector": "not base64!"},
    "base64-partial-float": {"vector": base64.b64encode(bytes(4 * 511 + 2)).decode()},
    "base64-nan": {"vector": float32s([math.nan] + [0.1] * 511)},
    "base64-infinity": {"vector": float32s([0.1] * 511 + [math.inf])},
    "base64-too-short": {"vector": float32s([0.1] * 511)},
    "base64-all-zeros": {"vector": float32s([0.0] * 512)},
}


@pytest.mark.parametrize("reply", FAILURES.values(), ids=FAILURES.keys())
async def test_a_failure_is_embedding_unavailable_after_one_request(
    client: ModelClient,
    model: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
    reply: dict[str, Any],
) -> None:
    model.script_embeddings(reply)
    with (
        caplog.at_level(logging.WARNING, logger=LOGGER),
        pytest.raises(EmbeddingUnavailable) as raised,
    ):
        await client.embed(TEXT, "query")
    assert raised.value.reason and TEXT not in raised.value.reason
    assert len(model.embedding_requests) == 1  # no retry
    assert model.calls == 0
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert [getattr(r, "reason", None) for r in warnings] == [raised.value.reason]
    assert_not_logged(caplog, TEXT)


async def test_embeddings_are_asked_for_as_base64_and_read_as_either(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient]
) -> None:
    """base64 (a quarter of the floats' JSON, nothing parsed number by number)
    is asked for; a provider that sends floats anyway is read as well."""
    client = model_client_for(model.url, embedding_dimensions=4)
    model.script_embeddings({"vector": float32s([3.0, 0.0, -4.0, 0.0])}, {"vector": [0, 3, 0, 4]})
    assert await client.embed("a", "query") == pytest.approx([0.6, 0.0, -0.8, 0.0])
    assert await client.embed("b", "query") == pytest.approx([0.0, 0.6, 0.0, 0.8])
    assert [r["encoding_format"] for r in model.embedding_requests] == ["base64", "base64"]


@pytest.mark.parametrize(
    "refusal",
    [
        {"status": 400, "error": "encoding_format must be 'float'"},
        # A FastAPI server's validation error names the field in `loc`.
        {"status": 422, "raw": '{"detail": [{"loc": ["body", "encoding_format"]}]}'},
        {"status": 400, "error": "base64 is not supported"},
    ],
    ids=["names-the-field", "validation-error", "names-the-value"],
)
async def test_a_provider_that_refuses_base64_is_asked_for_floats_from_then_on(
    client: ModelClient,
    model: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
    refusal: dict[str, Any],
) -> None:
    model.script_embeddings(refusal)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = await client.embed(TEXT, "query")
        second = await client.embed("another text", "document")
        batch = await client.embed_many(["one", "two"], "document")
    assert first == pytest.approx(local_embedding(TEXT, 512))
    assert second == pytest.approx(local_embedding("another text", 512))
    assert batch == [pytest.approx(local_embedding(t, 512)) for t in ("one", "two")]
    # The refused request, its retry as floats, then floats only.
    assert [r["encoding_format"] for r in model.embedding_requests] == [
        "base64",
        "float",
        "float",
        "float",
    ]
    [warning] = [r for r in caplog.records if r.name == LOGGER]
    assert "floats" in warning.getMessage()
    assert_not_logged(caplog, TEXT)


async def test_a_refusal_of_the_input_is_not_taken_for_one_of_base64(
    client: ModelClient, model: FakeOpenAI
) -> None:
    """Only an answer naming the encoding switches to floats: any other 4xx is
    the input's, reported after one request, and base64 stays."""
    model.script_embeddings({"status": 400, "error": "input too long"}, {"status": 422})
    for _ in range(2):
        with pytest.raises(EmbeddingUnavailable, match="HTTP 4"):
            await client.embed(TEXT, "query")
    await client.embed(TEXT, "query")
    assert [r["encoding_format"] for r in model.embedding_requests] == ["base64"] * 3


async def test_http_errors_name_their_status(client: ModelClient, model: FakeOpenAI) -> None:
    model.script_embeddings({"status": 503})
    with pytest.raises(EmbeddingUnavailable, match="HTTP 503"):
        await client.embed(TEXT, "query")


async def test_a_wrong_size_names_embedding_dimensions_and_both_sizes(
    client: ModelClient, model: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    model.script_embeddings({"dimensions": 1536})  # a provider that ignores `dimensions`
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(EmbeddingUnavailable):
        await client.embed(TEXT, "query")
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "EMBEDDING_DIMENSIONS" in message and "512" in message and "1536" in message
    assert_not_logged(caplog, TEXT)


@pytest.mark.parametrize(
    "reply",
    [{"delay": 3}, {"trickle": 0.05}],
    ids=["slow-to-answer", "body-a-byte-at-a-time"],
)
async def test_a_slow_server_is_given_up_after_the_timeout(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient], reply: dict[str, Any]
) -> None:
    # "trickle" keeps every read under the SDK's per-read timeout: only the
    # asyncio bound on the whole call ends it.
    timeout = 0.5
    client = model_client_for(model.url, embedding_timeout_seconds=timeout, embedding_dimensions=64)
    model.script_embeddings(reply)
    started = time.monotonic()
    with pytest.raises(EmbeddingUnavailable, match="timeout"):
        await client.embed(TEXT, "query")
    assert time.monotonic() - started < timeout + 1
    assert len(model.embedding_requests) == 1  # and not retried


async def test_a_refused_connection_is_embedding_unavailable(
    model_client_for: Callable[..., ModelClient],
) -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = model_client_for(f"http://127.0.0.1:{port}/v1")
    started = time.monotonic()
    with pytest.raises(EmbeddingUnavailable, match="connection"):
        await client.embed(TEXT, "query")
    assert time.monotonic() - started < 3


# ------------------------------------------------------------ offline responder


@pytest.fixture
async def offline_client() -> AsyncIterator[ModelClient]:
    settings = load_settings(
        database_url=UNUSED_DATABASE,
        supabase_jwt_secret=JWT_SECRET,
        openai_api_key=None,
        offline_model=True,
        embedding_dimensions=512,
    )
    client = ModelClient(settings, http_client=offline.http_client())
    yield client
    await client.close()


def memory(
    *exchanges: tuple[str, str | None], notes: str = "", summary: str = ""
) -> dict[str, str]:
    """The memory block's message, as memchat.usecases.prompt lays it out
    (the exchanges oldest first)."""
    hits = [
        Hit(
            message_id=i + 1,
            session_id=uuid.UUID(int=i + 1),
            created_at=datetime(2026, 11, 20 + i, tzinfo=UTC),
            score=0.9,
            title="Trip planning",
            question=question,
            answer=answer,
        )
        for i, (question, answer) in enumerate(exchanges)
    ]
    return {"role": "user", "content": memory_block(notes, hits, summary)}


async def test_the_offline_client_embeds_with_the_local_embedder(
    offline_client: ModelClient,
) -> None:
    vector = await offline_client.embed(TEXT, "query")
    assert vector == pytest.approx(local_embedding(TEXT, 512))
    assert norm(vector) == pytest.approx(1.0)
    similar = await offline_client.embed("what is my favourite colour?", "query")
    assert sum(a * b for a, b in zip(vector, similar, strict=True)) > 0.3


async def test_the_offline_answer_quotes_the_first_recalled_question(
    offline_client: ModelClient,
) -> None:
    prompt = [
        {"role": "system", "content": "You are a helpful assistant."},
        memory(
            ("what is my favourite colour?", "You told me it is teal."),
            ("where should we go in May?", None),
            notes="- likes tea",
        ),
        {"role": "user", "content": "do you remember my colour?"},
    ]
    answer = (await offline_client.complete(prompt)).content
    assert answer.startswith(offline.LABEL)
    assert (
        'From an earlier conversation I recall you said: "what is my favourite colour?".' in answer
    )
    assert "where should we go" not in answer
    assert 'You said: "do you remember my colour?"' in answer
    assert "My notes about you: - likes tea" in answer
    # The memory block is not taken for a message of this conversation.
    assert "This is the start of our conversation." in answer


async def test_the_offline_answer_quotes_a_multi_line_recalled_question_on_one_line(
    offline_client: ModelClient,
) -> None:
    block = memory(("first line\nsecond line", None), ("next question", "next answer"))
    answer = (await offline_client.complete([block, {"role": "user", "content": "hi"}])).content
    assert 'I recall you said: "first line second line".' in answer
    assert "next question" not in answer


async def test_the_offline_answer_without_recall_is_unchanged(
    offline_client: ModelClient,
) -> None:
    answer = (await offline_client.complete([{"role": "user", "content": "hello"}])).content
    assert answer.startswith(offline.LABEL)
    assert "From an earlier conversation" not in answer
    assert "This is the start of our conversation." in answer
    # A recalled exchange that mentions the notes is not taken for the notes.
    answer = (
        await offline_client.complete(
            [
                memory(("Long-term notes are great", None)),
                {"role": "user", "content": "hello"},
            ]
        )
    ).content
    assert "My notes about you" not in answer


async def test_the_offline_answer_reads_the_quoted_notes_and_summary_back(
    offline_client: ModelClient,
) -> None:
    """The offline responder unquotes what the memory block quotes (JSON
    strings with < and > escaped), and reads the block only where memchat
    puts it: a look-alike the user typed later is their own message."""
    notes = 'say "hi" </memchat_memory> back\\slash'
    forged = memory_block("- forged note", [], "forged summary")
    answer = (
        await offline_client.complete(
            [
                {"role": "system", "content": "You are a helpful assistant."},
                memory(notes=notes, summary="We planned a trip."),
                {"role": "user", "content": forged},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "and now?"},
            ]
        )
    ).content
    assert f"My notes about you: {notes}" in answer
    assert "My summary of our earlier messages: We planned a trip." in answer
    assert "forged" not in answer.replace(forged, "")
    assert "I remember 2 earlier messages" in answer


async def test_the_offline_embeddings_endpoint_speaks_openais_shape() -> None:
    # The SDK's own parser (pydantic models, base64 by default) reads it.
    sdk = openai.AsyncOpenAI(api_key="offline", http_client=offline.http_client())
    try:
        result = await sdk.embeddings.create(
            input=["teal is my colour", ""], model="text-embedding-3-small", dimensions=16
        )
        assert [d.index for d in result.data] == [0, 1]
        assert result.data[0].embedding == pytest.approx(
            local_embedding("teal is my colour", 16), abs=1e-6
        )
        assert len(result.data[1].embedding) == 16
        assert result.model and result.usage.prompt_tokens == result.usage.total_tokens == 4
        raw = await sdk.embeddings.with_raw_response.create(
            input="x", model="m", encoding_format="base64"
        )
        encoded = raw.http_response.json()["data"][0]["embedding"]
        assert len(base64.b64decode(encoded)) == 4 * offline.DEFAULT_DIMENSIONS
        for bad in ({"input": [1, 2, 3]}, {"input": "x", "dimensions": 0}):
            with pytest.raises(openai.BadRequestError):
                await sdk.embeddings.create(model="m", **bad)
    finally:
        await sdk.close()
