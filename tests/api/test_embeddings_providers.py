"""ModelClient's embeddings from any OpenAI-compatible provider, of any size.

`embed_many` (the backfill's batches: one request, the texts' order kept),
the query and document prefixes (e5 models), a provider of its own
(EMBEDDING_BASE_URL and EMBEDDING_API_KEY: another server than the chat
model's, its own key) and the model each embedding is recorded with. The
real `openai` client against the fake server.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from memchat.config import load_settings
from memchat.model import offline
from memchat.model.client import OFFLINE_EMBEDDING_MODEL, EmbeddingUnavailable, ModelClient
from memchat.model.embeddings import local_embedding
from tests.conftest import JWT_SECRET, UNUSED_DATABASE
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.logs import assert_not_logged

MODEL_CLIENT_SETTINGS = {"embedding_dimensions": 64}
TEXTS = ["my favourite colour is teal", "we fly to Lisbon in May", "the cat is called Miso"]


@pytest.fixture
def client(model: FakeOpenAI, model_client_for: Callable[..., ModelClient]) -> ModelClient:
    return model_client_for(model.url)


@pytest.fixture
def other_provider() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    yield server
    server.close()


# ------------------------------------------------------------ batches


async def test_embed_many_is_one_request_in_the_texts_order(
    client: ModelClient, model: FakeOpenAI
) -> None:
    vectors = await client.embed_many(TEXTS, "document")
    assert vectors == [pytest.approx(local_embedding(text, 64)) for text in TEXTS]
    assert model.embedding_requests == [
        {
            "model": "text-embedding-3-small",
            "input": TEXTS,
            "dimensions": 64,
            "encoding_format": "base64",
        }
    ]


async def test_embed_many_puts_answers_in_place_by_their_index(
    client: ModelClient, model: FakeOpenAI
) -> None:
    """A provider may answer out of order; `index` says whose each is."""
    shuffled = [
        {"object": "embedding", "index": i, "embedding": local_embedding(TEXTS[i], 64)}
        for i in (2, 0, 1)
    ]
    model.script_embeddings({"override": {"data": shuffled}})
    vectors = await client.embed_many(TEXTS, "document")
    assert vectors == [pytest.approx(local_embedding(text, 64)) for text in TEXTS]


async def test_embed_many_of_nothing_sends_nothing(client: ModelClient, model: FakeOpenAI) -> None:
    assert await client.embed_many([], "document") == []
    assert model.embedding_requests == []


def _data(*indices: Any) -> list[dict[str, Any]]:
    return [{"index": i, "embedding": local_embedding("x", 64)} for i in indices]


BAD_BATCHES: dict[str, dict[str, Any]] = {
    "one-short": {"override": {"data": _data(0, 1)}},
    "one-too-many": {"override": {"data": _data(0, 1, 2, 3)}},
    "an-index-twice": {"override": {"data": _data(0, 1, 1)}},
    "an-index-out-of-range": {"override": {"data": _data(0, 1, 3)}},
    "some-indices-missing": {"override": {"data": _data(0, None, 2)}},
    "an-index-not-a-number": {"override": {"data": _data(0, "1", 2)}},
    "an-index-a-bool": {"override": {"data": _data(0, True, 2)}},
    "a-vector-too-short": {"vector": [0.1] * 63},
    "http-500": {"status": 500},
    "http-400": {"status": 400, "error": "input too long"},
}


@pytest.mark.parametrize("reply", BAD_BATCHES.values(), ids=BAD_BATCHES.keys())
async def test_a_bad_batch_is_embedding_unavailable_after_one_request(
    client: ModelClient,
    model: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
    reply: dict[str, Any],
) -> None:
    model.script_embeddings(reply)
    with (
        caplog.at_level(logging.WARNING, logger="memchat.model.client"),
        pytest.raises(EmbeddingUnavailable) as raised,
    ):
        await client.embed_many(TEXTS, "document")
    assert raised.value.reason
    assert len(model.embedding_requests) == 1
    for text in TEXTS:
        assert_not_logged(caplog, text)


async def test_a_blank_text_fails_the_batch_before_any_request(
    client: ModelClient, model: FakeOpenAI
) -> None:
    with pytest.raises(EmbeddingUnavailable, match="text 1 of the batch is empty"):
        await client.embed_many(["teal", " \n", "Lisbon"], "document")
    assert model.embedding_requests == []


async def test_a_batch_waits_the_model_calls_timeout_not_the_turns(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient]
) -> None:
    """A batch of many texts may take longer than a turn's embedding may:
    OPENAI_TIMEOUT_SECONDS bounds it, not EMBEDDING_TIMEOUT_SECONDS."""
    # The first batch takes twice a turn's limit and stays 0.6 s inside its
    # own: room for a busy machine's first connection.
    client = model_client_for(model.url, embedding_timeout_seconds=0.2, openai_timeout_seconds=1.0)
    model.script_embeddings({"delay": 0.4}, {"delay": 0.4}, {"delay": 1.5})
    assert len(await client.embed_many(TEXTS, "document")) == 3
    with pytest.raises(EmbeddingUnavailable, match=r"timeout after 0\.2 s"):
        await client.embed(TEXTS[0], "query")
    with pytest.raises(EmbeddingUnavailable, match=r"timeout after 1 s"):
        await client.embed_many(TEXTS, "document")


# ------------------------------------------------------------ prefixes


async def test_queries_and_documents_get_their_prefixes(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient]
) -> None:
    client = model_client_for(
        model.url, embedding_query_prefix="query: ", embedding_document_prefix="passage: "
    )
    query = await client.embed("what is my colour?", "query")
    documents = await client.embed_many(TEXTS[:2], "document")
    inputs = [r["input"] for r in model.embedding_requests]
    assert inputs == ["query: what is my colour?", [f"passage: {t}" for t in TEXTS[:2]]]
    assert query == pytest.approx(local_embedding("query: what is my colour?", 64))
    assert documents[0] == pytest.approx(local_embedding(f"passage: {TEXTS[0]}", 64))


async def test_no_prefix_by_default_and_a_blank_text_gets_none(
    client: ModelClient, model: FakeOpenAI, model_client_for: Callable[..., ModelClient]
) -> None:
    await client.embed(TEXTS[0], "query")
    await client.embed(TEXTS[0], "document")
    assert [r["input"] for r in model.embedding_requests] == [TEXTS[0], TEXTS[0]]
    prefixed = model_client_for(model.url, embedding_query_prefix="query: ")
    with pytest.raises(EmbeddingUnavailable, match="empty"):
        await prefixed.embed("  ", "query")  # the prefix does not make it text


# ------------------------------------------------------------ another provider


async def test_a_provider_of_its_own_gets_the_embeddings_and_its_key(
    model: FakeOpenAI,
    other_provider: FakeOpenAI,
    model_client_for: Callable[..., ModelClient],
) -> None:
    client = model_client_for(
        model.url,
        embedding_base_url=other_provider.url,
        embedding_api_key="embedding-key",
        openai_embedding_model="e5-small",
    )
    assert client.embedding_model == "e5-small"
    await client.embed(TEXTS[0], "query")
    await client.embed_many(TEXTS, "document")
    answer = await client.complete([{"role": "user", "content": "hi"}])
    assert answer.content == "echo: hi"
    assert len(other_provider.embedding_requests) == 2 and model.embedding_requests == []
    assert other_provider.embedding_authorizations == ["Bearer embedding-key"] * 2
    assert model.calls == 1 and other_provider.calls == 0


async def test_by_default_embeddings_share_the_chat_models_provider_and_key(
    client: ModelClient, model: FakeOpenAI
) -> None:
    await client.embed(TEXTS[0], "query")
    assert model.embedding_authorizations == ["Bearer test-key"]
    assert client.embedding_model == "text-embedding-3-small"


async def test_a_separate_key_alone_goes_to_the_chat_models_url(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient]
) -> None:
    client = model_client_for(model.url, embedding_api_key="only-for-embeddings")
    await client.embed(TEXTS[0], "query")
    assert model.embedding_authorizations == ["Bearer only-for-embeddings"]


@pytest.fixture
async def offline_with(other_provider: FakeOpenAI) -> AsyncIterator[Callable[..., ModelClient]]:
    clients: list[ModelClient] = []

    def build(**overrides: object) -> ModelClient:
        settings = load_settings(
            database_url=UNUSED_DATABASE,
            supabase_jwt_secret=JWT_SECRET,
            openai_api_key=None,
            offline_model=True,
            embedding_dimensions=64,
            **overrides,
        )
        clients.append(ModelClient.for_settings(settings))
        return clients[-1]

    yield build
    for client in clients:
        await client.close()


async def test_the_offline_responders_embeddings_are_recorded_as_its_own(
    offline_with: Callable[..., ModelClient], other_provider: FakeOpenAI
) -> None:
    """Its feature hashing is no text-embedding-3-small: vectors it makes are
    never compared with a real model's."""
    client = offline_with()
    assert client.embedding_model == OFFLINE_EMBEDDING_MODEL
    vector = await client.embed(TEXTS[0], "query")
    assert vector == pytest.approx(local_embedding(TEXTS[0], 64))
    assert other_provider.embedding_requests == []
    assert (await client.complete([{"role": "user", "content": "hi"}])).content.startswith(
        offline.LABEL
    )


async def test_offline_chat_with_a_real_embeddings_provider(
    offline_with: Callable[..., ModelClient], other_provider: FakeOpenAI
) -> None:
    """`memchat dev --embeddings local` with no key: the offline responder
    answers, the embeddings come from the provider over HTTP."""
    client = offline_with(
        embedding_base_url=other_provider.url,
        embedding_api_key="local",
        openai_embedding_model="all-MiniLM-L6-v2",
    )
    assert client.embedding_model == "all-MiniLM-L6-v2"
    await client.embed(TEXTS[0], "query")
    assert [r["model"] for r in other_provider.embedding_requests] == ["all-MiniLM-L6-v2"]
    assert other_provider.embedding_authorizations == ["Bearer local"]
    assert (await client.complete([{"role": "user", "content": "hi"}])).content.startswith(
        offline.LABEL
    )
