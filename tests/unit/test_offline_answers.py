"""The offline responder answers a question from the context it is given:
the window, the long-term notes, recalled exchanges, the summary (its
prompt, as ChatService lays it out), the same way every time."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from memchat.model import offline
from memchat.model.offline import (
    EARLIER_CONVERSATION,
    NOTES,
    SUMMARY,
    THIS_CONVERSATION,
    Statement,
    answer_from_context,
)
from memchat.prompts.facts import facts_prompt, read_facts
from memchat.prompts.memory import memory_block
from memchat.usecases.recall.facts import fact_sentences

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def reply(messages: list[dict[str, Any]]) -> str:
    """The offline answer to `messages`, through its HTTP endpoint."""

    async def ask() -> str:
        async with offline.http_client() as client:
            r = await client.post("http://offline/v1/chat/completions", json={"messages": messages})
            content: str = r.json()["choices"][0]["message"]["content"]
            return content

    return asyncio.run(ask())


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_a_name_told_in_the_window_answers_the_question() -> None:
    answer = reply(
        [SYSTEM, user("my name is Ana"), assistant("Hello Ana"), user("what is my name?")]
    )
    assert answer.startswith(
        f"{offline.LABEL} Your name is Ana (you told me earlier in this conversation)."
    )
    # What it said before stays (the message, the window).
    assert 'You said: "what is my name?".' in answer
    assert 'your last one was "my name is Ana"' in answer


def test_the_newest_statement_in_the_window_wins() -> None:
    window = [user("my name is Ana"), assistant("ok"), user("my name is Bea, actually")]
    answer = reply([SYSTEM, *window, assistant("ok"), user("What's my name?")])
    assert "Your name is Bea (you told me earlier in this conversation)." in answer
    assert "Ana (" not in answer


def test_notes_recall_and_summary_answer_from_the_memory_block() -> None:
    block = memory_block("- my name is Ana\n- I like green tea", [], "")
    answer = reply([SYSTEM, user(block), user("who am I?")])
    assert f"Your name is Ana ({NOTES})." in answer
    answer = reply([SYSTEM, user(block), user("what do I like to drink?")])
    assert f'What I have on that: "I like green tea" ({NOTES}).' in answer


def test_a_recalled_exchanges_neighbours_answer_the_newest_first() -> None:
    from datetime import UTC, datetime
    from uuid import UUID

    from memchat.store import Hit, Neighbour

    recalled = Hit(
        message_id=2,
        session_id=UUID(int=1),
        created_at=datetime(2026, 11, 1, tzinfo=UTC),
        score=0.5,
        title=None,
        question="nice to meet you",
        answer="likewise",
        before=Neighbour(1, "my name is Ana", "hello Ana"),
    )
    block = memory_block("", [recalled], "")
    assert f"Your name is Ana ({EARLIER_CONVERSATION})." in reply(
        [SYSTEM, user(block), user("what is my name?")]
    )
    corrected = Hit(**{**vars(recalled), "after": Neighbour(3, "my name is Bea, actually", "ok")})
    block = memory_block("", [corrected], "")
    assert f"Your name is Bea ({EARLIER_CONVERSATION})." in reply(
        [SYSTEM, user(block), user("what is my name?")]
    )


def test_no_answer_part_for_a_statement_or_an_unanswerable_question() -> None:
    statements = [Statement("my name is Ana", THIS_CONVERSATION)]
    assert answer_from_context("my name is Ana", statements) == ""
    assert answer_from_context("what is the capital of Peru?", statements) == ""
    assert answer_from_context("what is my age?", statements) == ""
    answer = reply([SYSTEM, user("hello")])
    assert answer.startswith(f'{offline.LABEL} You said: "hello".')


@pytest.mark.parametrize(
    ("question", "statements", "expected"),
    [
        (
            "what is my favourite colour?",
            [Statement("my favourite colour is teal", EARLIER_CONVERSATION)],
            f"Your favourite colour is teal ({EARLIER_CONVERSATION}).",
        ),
        (
            "do you remember my colour",
            [Statement("My favourite colour is teal.", SUMMARY)],
            f"Your favourite colour is teal ({SUMMARY}).",
        ),
        (
            "what was my dog's name again?",
            [Statement("my dog's name is Rex and he is old", NOTES)],
            f"Your dog's name is Rex ({NOTES}).",
        ),
        (
            "who am I?",
            [Statement("please call me Bo.", THIS_CONVERSATION)],
            f"Your name is Bo ({THIS_CONVERSATION}).",
        ),
        (
            "what is my plan?",
            [Statement("my plan is to visit my sister", THIS_CONVERSATION)],
            f"Your plan is to visit your sister ({THIS_CONVERSATION}).",
        ),
        (
            "where do I work?",
            [
                Statement("where do I work?", THIS_CONVERSATION),
                Statement("I work at the harbour office", NOTES),
                Statement("I work at the bakery", EARLIER_CONVERSATION),
            ],
            f'What I have on that: "I work at the harbour office" ({NOTES}).',
        ),
    ],
    ids=["recall", "summary-and-a-shorter-key", "and-cuts", "call-me", "yours", "first-of-a-tie"],
)
def test_answers_from_statements(question: str, statements: list[Statement], expected: str) -> None:
    assert answer_from_context(question, statements) == expected


def test_the_sources_are_searched_window_notes_recall_summary() -> None:
    window = [user("my city is Porto"), assistant("ok")]
    block = memory_block(
        "- my city is Lisbon",
        [],
        '[offline summary] The user said: "my city is Faro".',
    )
    with_window = reply([SYSTEM, user(block), *window, user("what is my city?")])
    assert f"Your city is Porto ({THIS_CONVERSATION})." in with_window
    without_window = reply([SYSTEM, user(block), user("what is my city?")])
    assert f"Your city is Lisbon ({NOTES})." in without_window
    only_summary = memory_block("", [], '[offline summary] The user said: "my city is Faro".')
    assert f"Your city is Faro ({SUMMARY})." in reply(
        [SYSTEM, user(only_summary), user("my city?")]
    )


def test_the_same_prompt_gets_the_same_answer() -> None:
    prompt = [SYSTEM, user("my name is Ana"), assistant("hi"), user("what is my name?")]
    answers = {json.dumps(reply(prompt)) for _ in range(3)}
    assert len(answers) == 1


def test_a_facts_request_is_answered_with_the_rules_sentences() -> None:
    """`memchat dev` without a key with MEMORY_RECALL_FACTS=model: the
    backfill's facts request gets each message's fact sentences, read back
    as the backfill reads a model's answer."""

    said = [
        "Can you find me flights? By the way, my sister Ana got married last week!",
        "Thanks.",
        "I'm planning a trip to Miami. I want cheap flights from Boston.",
    ]
    content = reply(facts_prompt(said))
    assert read_facts(content, len(said)) == [
        (index, sentence) for index, text in enumerate(said) for sentence in fact_sentences(text)
    ]
    assert len(json.loads(content)["facts"]) == 4  # "me" in "find me flights" too
