"""Recall across conversations, through the API: the real openai client
embeds each message at the local test server's /v1/embeddings (a
deterministic bag-of-words embedder), the database ranks the caller's
earlier messages by meaning, and the hits reach the prompt."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from memchat.config import ConfigError
from memchat.prompts.memory import MEMORY_OPEN, NOTES_PREAMBLE, RECALL_PREAMBLE
from memchat.usecases.cleanup import Cleanup
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat, kinds, memory_text, remembered, system_texts
from tests.utils.fake_openai import FakeOpenAI

FACT = "my favourite colour is teal"
QUESTION = "what is my favourite colour?"


def recalled(request: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(question, answer) of each exchange the model was sent, oldest first."""
    return [(e.question, e.answer) for e in remembered(request).recalled]


def embeddings_of(admin: psycopg.Connection, user_id: uuid.UUID) -> int:
    (count,) = admin.execute(
        "select count(*) from memchat.message_embeddings where user_id = %s", (user_id,)
    ).fetchone()
    return int(count)


async def test_a_fact_from_one_session_is_recalled_in_a_new_one(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    first = await chat(api, auth, FACT)
    (fact_id,) = admin.execute(
        "select id from public.chat_message_history where session_id = %s"
        " and message->>'type' = 'human'",
        (uuid.UUID(first["session_id"]),),
    ).fetchone()

    model.script_embeddings({"delay": 0.2})  # the question's embedding takes 200 ms
    clock = time.perf_counter()
    body = await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()))
    wall_ms = (time.perf_counter() - clock) * 1000

    # The answer came with it.
    assert recalled(model.requests[-1]) == [(FACT, f"echo: {FACT}")]
    memory = body["memory"]
    assert memory["recall_status"] == "ok"
    assert [(r["session_id"], r["message_id"]) for r in memory["recalled"]] == [
        (first["session_id"], fact_id)
    ]
    assert 0.3 <= memory["recalled"][0]["score"] <= 1
    assert memory["context_tokens"] > 0
    # The embedding, requested as the context started loading, came 200 ms
    # later: the load and the wait for recall after it cover that (in ms),
    # within the request.
    assert 150 <= memory["retrieval_ms"] + memory["recall_ms"] < wall_ms, (memory, wall_ms)
    assert embeddings_of(admin, user_id) == 2  # each user message, once


async def test_recall_sits_after_the_notes_in_the_memory_block_before_the_window(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    admin.execute(
        "insert into public.agent_long_term_memory (user_id, agent_name, notes)"
        " values (%s, 'default', '- likes tea')",
        (user_id,),
    )
    await chat(api, auth, FACT)
    sid = str(uuid.uuid4())
    await chat(api, auth, "hello there", session_id=sid)
    await chat(api, auth, QUESTION, session_id=sid)
    request = model.requests[-1]
    assert kinds(request) == ["system", "memory", "user", "assistant", "user"]
    block = memory_text(request) or ""
    assert block.startswith(MEMORY_OPEN)
    assert 0 < block.index(NOTES_PREAMBLE) < block.index(RECALL_PREAMBLE)
    assert [q for q, _ in recalled(request)] == [FACT]
    # Recalled text is never in a system message.
    assert not any(FACT in text for text in system_texts(request))


async def test_another_agent_recalls_nothing_of_it(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    await chat(api, auth, FACT, agent_name="painter")
    body = await chat(api, auth, QUESTION, agent_name="cook")
    assert body["memory"]["recalled"] == [] and body["memory"]["recall_status"] == "ok"
    assert recalled(model.requests[-1]) == []


async def test_another_user_recalls_nothing_of_it(api: ApiClient, model: FakeOpenAI) -> None:
    _, alice = api.new_user()
    _, bob = api.new_user()
    await chat(api, alice, FACT)
    body = await chat(api, bob, QUESTION)
    assert body["memory"]["recalled"] == []
    assert recalled(model.requests[-1]) == []


async def test_what_is_in_the_window_is_not_recalled_again(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI
) -> None:
    api = custom_api(memory_max_history_messages=2)
    _, auth = api.new_user()
    first = await chat(api, auth, FACT)
    sid = first["session_id"]
    in_window = await chat(api, auth, QUESTION, session_id=sid)
    assert in_window["memory"]["recalled"] == []  # the fact is in the window
    await chat(api, auth, "something else entirely", session_id=sid)
    older = await chat(api, auth, QUESTION, session_id=sid)
    # Now the fact (and the earlier question) have left the window: recalled.
    assert FACT in [q for q, _ in recalled(model.requests[-1])]
    assert {r["session_id"] for r in older["memory"]["recalled"]} == {sid}


async def test_near_duplicates_collapse_into_one_hit(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    for _ in range(3):
        await chat(api, auth, FACT, session_id=str(uuid.uuid4()))
    body = await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()), recall_k=3)
    assert len(body["memory"]["recalled"]) == 1
    assert [q for q, _ in recalled(model.requests[-1])] == [FACT]


async def test_the_duplicate_score_is_a_setting(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI
) -> None:
    # The fact said again with a word more: 0.86 similar to it (the test
    # embedder), two memories at the default 0.95, one at 0.85.
    again = f"{FACT}, really"
    found = {}
    for score in (0.95, 0.85):
        api = custom_api(memory_recall_duplicate_score=score)
        _, auth = api.new_user()
        for text in (FACT, again):
            await chat(api, auth, text, session_id=str(uuid.uuid4()))
        await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()), recall_k=3)
        found[score] = sorted(question for question, _ in recalled(model.requests[-1]))
    assert found == {0.95: sorted([FACT, again]), 0.85: [FACT]}


async def test_k_bounds_the_hits_best_first(custom_api: Callable[..., ApiClient]) -> None:
    # By meaning alone (no word match to fuse), best first is by similarity.
    api = custom_api(memory_recall_words=False)
    _, auth = api.new_user()
    facts = [
        "my favourite colour is teal",
        "my favourite food is ramen",
        "my favourite city is lisbon",
        "my favourite season is autumn",
    ]
    for fact in facts:
        await chat(api, auth, fact, session_id=str(uuid.uuid4()))
    body = await chat(api, auth, "my favourite colour and city", recall_k=2)
    scores = [r["score"] for r in body["memory"]["recalled"]]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True)


async def test_a_minimum_score_drops_weak_hits(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI
) -> None:
    api = custom_api(memory_recall_min_score=0.99)
    _, auth = api.new_user()
    await chat(api, auth, FACT)
    body = await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()))
    assert body["memory"]["recalled"] == [] and body["memory"]["recall_status"] == "ok"


async def test_recall_k_zero_reads_nothing_but_the_message_is_embedded(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    await chat(api, auth, FACT)
    body = await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()), recall_k=0)
    assert body["memory"]["recall_status"] == "disabled" and body["memory"]["recalled"] == []
    assert recalled(model.requests[-1]) == []
    assert embeddings_of(admin, user_id) == 2  # later turns can recall it


async def test_memory_off_neither_embeds_nor_recalls(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    await chat(api, auth, FACT)
    before = len(model.embedding_requests)
    body = await chat(api, auth, QUESTION, use_memory=False)
    assert body["memory"]["recall_status"] == "disabled"
    assert body["memory"]["recalled"] == [] and body["memory"]["context_tokens"] == 0
    assert len(model.embedding_requests) == before
    assert recalled(model.requests[-1]) == []
    assert embeddings_of(admin, user_id) == 1


async def test_memory_recall_k_zero_turns_recall_off(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    api = custom_api(memory_recall_k=0)
    user_id, auth = api.new_user()
    await chat(api, auth, FACT)
    body = await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()))
    assert body["memory"]["recall_status"] == "disabled"
    assert model.embedding_requests == [] and embeddings_of(admin, user_id) == 0


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param({"status": 500}, id="500"),
        pytest.param({"delay": 3}, id="timeout"),
        pytest.param({"dimensions": 1536}, id="wrong-size"),
    ],
)
async def test_an_embedding_failure_answers_without_recall(
    custom_api: Callable[..., ApiClient],
    model: FakeOpenAI,
    admin: psycopg.Connection,
    failure: dict[str, Any],
) -> None:
    api = custom_api(embedding_timeout_seconds=0.5)
    user_id, auth = api.new_user()
    await chat(api, auth, FACT)
    model.script_embeddings(failure)
    body = await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()))
    assert body["answer"] == f"echo: {QUESTION}"
    assert body["memory"]["recall_status"] == "failed" and body["memory"]["recalled"] == []
    assert recalled(model.requests[-1]) == []
    assert embeddings_of(admin, user_id) == 1  # the second message is stored without one
    (stored,) = admin.execute(
        "select count(*) from public.chat_message_history where user_id = %s", (user_id,)
    ).fetchone()
    assert stored == 4


async def test_a_replay_neither_recalls_nor_embeds_again(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    first = await chat(api, auth, FACT, client_message_id="k1")
    again = await chat(api, auth, FACT, client_message_id="k1", session_id=first["session_id"])
    assert again["answer"] == first["answer"] and again["memory"]["recalled"] == []
    assert embeddings_of(admin, user_id) == 1


# -------------------------------------------------------------- lifecycle


async def test_clear_session_removes_its_embeddings(
    api: ApiClient, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    first = await chat(api, auth, FACT)
    await chat(api, auth, "and another thing", session_id=first["session_id"])
    assert embeddings_of(admin, user_id) == 2
    cleared = await api.post(
        "/chat/clear-session", json={"session_id": first["session_id"]}, headers=auth
    )
    assert cleared.status_code == 200
    assert embeddings_of(admin, user_id) == 0
    body = await chat(api, auth, QUESTION)
    assert body["memory"]["recalled"] == []


async def test_delete_me_removes_every_embedding(api: ApiClient, admin: psycopg.Connection) -> None:
    user_id, auth = api.new_user()
    for agent in ("a", "b"):
        await chat(api, auth, FACT, agent_name=agent)
    assert embeddings_of(admin, user_id) == 2
    assert (await api.delete("/me", headers=auth)).status_code == 200
    assert embeddings_of(admin, user_id) == 0


async def test_the_ttl_cleanup_removes_expired_embeddings_and_recall_skips_them_before(
    api: ApiClient, admin: psycopg.Connection, cleanup_url: str
) -> None:
    _, auth = api.new_user()
    first = await chat(api, auth, FACT)
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute' where id = %s",
        (uuid.UUID(first["session_id"]),),
    )
    expired = await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()))
    assert expired["memory"]["recalled"] == []  # expired, not yet cleaned: not recalled
    Cleanup(cleanup_url, batch_size=1000, pause_factor=1.0).run()
    (left,) = admin.execute(
        "select count(*) from memchat.message_embeddings where session_id = %s",
        (uuid.UUID(first["session_id"]),),
    ).fetchone()
    assert left == 0


async def test_exports_carry_no_vectors(api: ApiClient) -> None:
    _, auth = api.new_user()
    first = await chat(api, auth, FACT)
    for url in (f"/chat/export/{first['session_id']}", "/export", "/export?format=ndjson"):
        text = (await api.get(url, headers=auth)).text
        assert "embedding" not in text and FACT in text


# ------------------------------------------------------------ the column


def test_a_mismatched_embedding_size_fails_at_start(
    database_url: str, fake_openai: FakeOpenAI
) -> None:
    app = ApiClient(make_settings(database_url, fake_openai.url, embedding_dimensions=1536)).app
    with pytest.raises(ConfigError, match=r"EMBEDDING_DIMENSIONS is 1536 .* vector\(512\)"):
        app.state.memchat.chat.recall.check_at_start()


async def test_a_mismatch_found_on_the_first_turn_turns_recall_off(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """When the database was down at start, the first turn checks; a mismatch
    answers without recall rather than failing every turn."""
    api = custom_api(embedding_dimensions=1536)
    user_id, auth = api.new_user()
    model.script_embeddings({"dimensions": 1536})
    body = await chat(api, auth, FACT)
    assert body["memory"]["recall_status"] == "failed"
    assert api.app.state.memchat.chat.recall.column_fits is False
    assert embeddings_of(admin, user_id) == 0


# ------------------------------------------------------------ the budget


async def test_the_token_budget_drops_in_order_and_reports_its_tokens(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    api = custom_api(memory_max_context_tokens=400)  # the window takes ~270
    user_id, auth = api.new_user()
    admin.execute(
        "insert into public.agent_long_term_memory (user_id, agent_name, notes)"
        " values (%s, 'default', %s)",
        (user_id, "\n".join(f"- note {i}" for i in range(100))),
    )
    await chat(api, auth, FACT)
    sid = str(uuid.uuid4())
    for i in range(3):
        await chat(api, auth, f"turn {i} " + "filler words " * 40, session_id=sid)

    body = await chat(api, auth, QUESTION, session_id=sid)

    memory = body["memory"]
    assert memory["context_truncated"] is True
    assert memory["messages_in_context"] == 2  # never fewer than the newest two
    assert memory["recalled"] == []  # dropped before the notes were cut
    notes = remembered(model.requests[-1]).notes
    assert "- note 0" in notes and "- note 99" not in notes
    assert recalled(model.requests[-1]) == []
    assert 0 < memory["context_tokens"] <= 400


async def test_context_tokens_count_what_memory_added(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI
) -> None:
    from memchat.model.tokens import count_message, counter_for_model

    api = custom_api(openai_model="gpt-4o-mini")
    _, auth = api.new_user()
    first = await chat(api, auth, "hello there")
    body = await chat(api, auth, "and again", session_id=first["session_id"])
    counter = counter_for_model("gpt-4o-mini")
    memory_messages = model.requests[-1]["messages"][1:-1]  # not the system prompt or the new one
    assert body["memory"]["context_tokens"] == sum(
        count_message(counter, m["content"]) for m in memory_messages
    )


# -------------------------------------------------------------- models and prefixes


async def test_each_turn_records_the_model_of_its_embedding(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    api = custom_api(openai_embedding_model="nomic-embed-text")
    user_id, auth = api.new_user()
    await chat(api, auth, FACT)
    models = admin.execute(
        "select model from memchat.message_embeddings where user_id = %s", (user_id,)
    ).fetchall()
    assert models == [("nomic-embed-text",)]
    assert [r["model"] for r in model.embedding_requests] == ["nomic-embed-text"]


async def test_after_a_model_change_the_old_models_embeddings_are_not_recalled(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI
) -> None:
    """The fake server embeds alike whatever the model is called: only the
    recorded model keeps the old vectors out (`memchat db reembed` makes
    them again)."""
    before = custom_api(openai_embedding_model="model-one")
    _, auth = before.new_user()
    old = await chat(before, auth, FACT)
    after = custom_api(openai_embedding_model="model-two")
    body = await chat(after, auth, QUESTION, session_id=str(uuid.uuid4()))
    assert body["memory"]["recall_status"] == "ok" and body["memory"]["recalled"] == []
    # Its own turns are recalled again.
    new = await chat(after, auth, FACT, session_id=str(uuid.uuid4()))
    body = await chat(after, auth, QUESTION, session_id=str(uuid.uuid4()), recall_k=3)
    sessions = {r["session_id"] for r in body["memory"]["recalled"]}
    assert new["session_id"] in sessions and old["session_id"] not in sessions


async def test_with_prefixes_the_query_searches_and_the_document_is_stored(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """e5 models: the new message is embedded twice, as "query: ..." to search
    with and as "passage: ..." to store; without prefixes, once (above)."""
    from memchat.model.embeddings import local_embedding

    api = custom_api(embedding_query_prefix="query: ", embedding_document_prefix="passage: ")
    user_id, auth = api.new_user()
    first = await chat(api, auth, FACT)
    body = await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()))

    assert sorted(r["input"] for r in model.embedding_requests) == sorted(
        [f"query: {FACT}", f"passage: {FACT}", f"query: {QUESTION}", f"passage: {QUESTION}"]
    )
    assert [r["session_id"] for r in body["memory"]["recalled"]] == [first["session_id"]]
    (stored,) = admin.execute(
        "select e.embedding::text from memchat.message_embeddings e"
        " join public.chat_message_history h on h.id = e.message_id and h.user_id = e.user_id"
        " where e.user_id = %s and h.message->'data'->>'content' = %s",
        (user_id, FACT),
    ).fetchone()
    vector = [float(x) for x in stored.strip("[]").split(",")]
    assert vector == pytest.approx(local_embedding(f"passage: {FACT}", 512), abs=1e-6)


async def test_a_short_follow_up_searches_with_the_previous_exchange(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    earlier = await chat(api, auth, "my sister Ana lives in Lisbon near the river")
    session = str(uuid.uuid4())
    await chat(api, auth, "tell me something about my sister Ana", session_id=session)
    body = await chat(api, auth, "and where?", session_id=session)
    # "and where?" alone shares nothing with the earlier session; with the
    # previous exchange it does.
    assert [r["session_id"] for r in body["memory"]["recalled"]] == [earlier["session_id"]]
    # The query embedded was the widened one; the stored embedding is the message's own.
    assert model.embedding_requests[-1]["input"] in (
        "tell me something about my sister Ana\necho: tell me something about my sister Ana"
        "\nand where?",
        [
            "tell me something about my sister Ana\necho: tell me something about my sister Ana"
            "\nand where?"
        ],
    )


async def test_a_message_long_enough_is_searched_alone(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    session = str(uuid.uuid4())
    await chat(api, auth, "tell me something about my sister Ana", session_id=session)
    before = len(model.embedding_requests)
    await chat(api, auth, "what does she do for work these days?", session_id=session)
    assert len(model.embedding_requests) == before + 1  # the message's own, only


async def test_a_recalled_exchange_brings_the_one_before_it_into_the_prompt(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    first = await chat(api, auth, "I adopted a puppy named Rex")
    await chat(api, auth, "what should a young dog eat", session_id=first["session_id"])
    await chat(api, auth, "what should a young dog eat?", session_id=str(uuid.uuid4()))
    recalled_exchanges = remembered(model.requests[-1]).recalled
    (hit,) = [e for e in recalled_exchanges if e.question == "what should a young dog eat"]
    assert hit.before == ("I adopted a puppy named Rex", "echo: I adopted a puppy named Rex")


async def test_a_recalled_exchange_brings_the_one_after_it_into_the_prompt(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    first = await chat(api, auth, "what should a young dog eat")
    await chat(api, auth, "he is called Rex and loves carrots", session_id=first["session_id"])
    await chat(api, auth, "what should a young dog eat?", session_id=str(uuid.uuid4()))
    (hit,) = remembered(model.requests[-1]).recalled
    assert (hit.question, hit.before) == ("what should a young dog eat", None)
    assert hit.after == (
        "he is called Rex and loves carrots",
        "echo: he is called Rex and loves carrots",
    )


async def test_the_exchange_after_a_hit_is_not_repeated_from_the_window(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI
) -> None:
    api = custom_api(memory_max_history_messages=2)
    _, auth = api.new_user()
    sid = (await chat(api, auth, "what should a young dog eat"))["session_id"]
    await chat(api, auth, "he is called Rex and loves carrots", session_id=sid)
    await chat(api, auth, "what should a young dog eat?", session_id=sid)
    # The hit is the session's first exchange, the window its second: the
    # prompt shows that one once, in the window.
    (hit,) = remembered(model.requests[-1]).recalled
    assert (hit.question, hit.after) == ("what should a young dog eat", None)
    assert "he is called Rex and loves carrots" in [
        m["content"] for m in model.requests[-1]["messages"] if m["role"] == "user"
    ]
