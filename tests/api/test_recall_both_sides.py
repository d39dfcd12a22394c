"""Recall finds an exchange by what either side said: the assistant's answers
are keys of their exchange by meaning (embedded by the backfill, off the
turn's path) as by words; an assistant message no user message came before
is an exchange of its own; a user message nobody answered shows no answer.

The fake model's embeddings are bags of hashed words
(memchat.model.embeddings.local_embedding): two texts are near when they
share words. Words are off in the meaning cases (MEMORY_RECALL_WORDS=0), so
that only an embedding can find what they look for.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from memchat.usecases.backfill import Embedder
from tests.api import test_memory_search as search_tests
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat
from tests.utils.fake_openai import FakeOpenAI

DAY = datetime(2024, 3, 1, 12, tzinfo=UTC)
# The search tests' fixtures (the queue emptied first, the worker's backfill)
# and helpers.
empty_queue = search_tests.empty_queue
embedder = search_tests.embedder
import_sessions, search = search_tests.import_sessions, search_tests.search


def at(minutes: int) -> datetime:
    return DAY + timedelta(minutes=minutes)


async def test_an_answer_is_found_by_its_meaning(
    custom_api: Callable[..., ApiClient], embedder: Embedder
) -> None:
    api = custom_api(memory_recall_words=False, memory_recall_min_score=0.4)
    _, auth = api.new_user()
    await import_sessions(
        api,
        auth,
        [
            ("user", "what should I cook tonight?", at(0)),
            ("assistant", "Try a Thai green curry with lemongrass and basil.", at(1)),
        ],
        [
            ("user", "what should I read next?", at(60)),
            ("assistant", "A novel by Kazuo Ishiguro: Klara and the Sun.", at(61)),
        ],
    )
    await embedder.run()
    hits = (await search(api, auth, "green curry lemongrass basil")).json()["hits"]
    assert [h["question"] for h in hits] == ["what should I cook tonight?"]
    assert hits[0]["answer"] == "Try a Thai green curry with lemongrass and basil."
    assert hits[0]["score"] > 0.5
    hits = (await search(api, auth, "Ishiguro novel Klara")).json()["hits"]
    assert [h["question"] for h in hits] == ["what should I read next?"]


async def test_a_turns_answer_is_embedded_by_the_backfill(
    custom_api: Callable[..., ApiClient], embedder: Embedder, model: FakeOpenAI
) -> None:
    api = custom_api(memory_recall_words=False, memory_recall_min_score=0.4)
    _, auth = api.new_user()
    model.script({"content": "Try a Thai green curry with lemongrass and basil."})
    await chat(api, auth, "what should I cook tonight?")
    # Until the backfill has run, only the question is a key.
    assert (await search(api, auth, "green curry lemongrass basil")).json()["hits"] == []
    assert (await api.get("/sessions/import/status", headers=auth)).json()["recall_ready"] is False
    run = await embedder.run()
    assert run.embedded == 1
    hits = (await search(api, auth, "green curry lemongrass basil")).json()["hits"]
    assert [h["question"] for h in hits] == ["what should I cook tonight?"]
    assert (await api.get("/sessions/import/status", headers=auth)).json()["recall_ready"] is True


async def test_an_assistant_message_that_opens_a_session_is_a_hit_of_its_own(
    custom_api: Callable[..., ApiClient], embedder: Embedder
) -> None:
    api = custom_api(memory_recall_min_score=0.4)
    _, auth = api.new_user()
    await import_sessions(
        api,
        auth,
        [
            ("assistant", "Reminder: your dentist appointment is on Friday at nine.", at(0)),
            ("user", "thanks, what else is on this week?", at(1)),
            ("assistant", "Nothing else is planned.", at(2)),
        ],
    )
    await embedder.run()
    # Found by its words, and by its own embedding.
    for words in (True, False):
        api = custom_api(memory_recall_min_score=0.4, memory_recall_words=words)
        hits = (await search(api, auth, "dentist appointment Friday")).json()["hits"]
        assert hits[0]["question"] == ""
        assert hits[0]["answer"] == "Reminder: your dentist appointment is on Friday at nine."
        assert hits[0]["created_at"].startswith("2024-03-01T12:00:00")
        assert hits[0]["after"]["question"] == "thanks, what else is on this week?"


async def test_a_question_nobody_answered_shows_no_answer(
    custom_api: Callable[..., ApiClient], embedder: Embedder
) -> None:
    api = custom_api(memory_recall_min_score=-1)
    _, auth = api.new_user()
    await import_sessions(
        api,
        auth,
        [
            ("user", "is the museum open on Mondays?", at(0)),
            ("user", "never mind: where is the nearest bakery?", at(1)),
            ("assistant", "Two streets north, on Rua Augusta.", at(2)),
            ("assistant", "It opens at seven.", at(3)),
        ],
    )
    await embedder.run()
    hits = {
        h["question"]: h for h in (await search(api, auth, "museum bakery", k=5)).json()["hits"]
    }
    assert hits["is the museum open on Mondays?"]["answer"] is None
    answer = hits["never mind: where is the nearest bakery?"]["answer"]
    assert answer == "Two streets north, on Rua Augusta.\n\nIt opens at seven."
