"""Fact keys written by the chat model (MEMORY_RECALL_FACTS=model): the
request the backfill makes of a session's messages (memchat.prompts.facts) and
how the model's answer is read, whatever it writes."""

from __future__ import annotations

import json

import pytest

from memchat.prompts.facts import (
    FACT_MAX_CHARS,
    FACTS_INSTRUCTIONS,
    FACTS_MESSAGES_PER_CALL,
    FACTS_PER_MESSAGE,
    FACTS_PROMPT_CHARS,
    facts_calls,
    facts_max_tokens,
    facts_prompt,
    numbered_messages,
    read_facts,
)


def answer(*items: object) -> str:
    return json.dumps({"facts": list(items)})


def test_the_prompt_numbers_each_message_on_one_line() -> None:
    prompt = facts_prompt(["I moved to Lisbon.\nIt is sunny.", "  my   dog is  Rex "])
    assert prompt == [
        {"role": "system", "content": FACTS_INSTRUCTIONS},
        {"role": "user", "content": "[1] I moved to Lisbon. It is sunny.\n[2] my dog is Rex"},
    ]
    assert numbered_messages(prompt[1]["content"]) == [
        "I moved to Lisbon. It is sunny.",
        "my dog is Rex",
    ]


def test_a_long_message_is_cut_in_its_prompt() -> None:
    (_, user) = facts_prompt(["x" * (FACTS_PROMPT_CHARS + 50)])
    assert user["content"] == "[1] " + "x" * FACTS_PROMPT_CHARS


def test_requests_hold_a_bounded_number_of_messages_and_characters() -> None:
    short = ["I like tea."] * (FACTS_MESSAGES_PER_CALL + 3)
    assert facts_calls(short) == [
        list(range(FACTS_MESSAGES_PER_CALL)),
        list(range(FACTS_MESSAGES_PER_CALL, FACTS_MESSAGES_PER_CALL + 3)),
    ]
    third = "y" * (FACTS_PROMPT_CHARS // 3)
    huge = "z" * (FACTS_PROMPT_CHARS * 2)  # counted as cut
    assert facts_calls([third, third, third, third, huge, "a"]) == [[0, 1, 2], [3], [4], [5]]
    assert facts_calls([]) == []


def test_what_a_request_may_write_grows_with_its_messages() -> None:
    assert facts_max_tokens(1) < facts_max_tokens(2) < facts_max_tokens(FACTS_MESSAGES_PER_CALL)


def test_facts_are_read_with_their_messages_in_the_answers_order() -> None:
    content = answer(
        {"message": 2, "fact": "The user's dog is called Rex."},
        {"message": 1, "fact": "The user moved to Lisbon in March 2023."},
        {"message": 2, "fact": "  The user walks   Rex daily. "},
    )
    assert read_facts(content, 2) == [
        (1, "The user's dog is called Rex."),
        (0, "The user moved to Lisbon in March 2023."),
        (1, "The user walks Rex daily."),
    ]


def test_no_facts_is_an_answer() -> None:
    assert read_facts('{"facts": []}', 3) == []


@pytest.mark.parametrize(
    "content",
    [
        "```json\n" + answer({"message": 1, "fact": "The user owns a red bike."}) + "\n```",
        'Here they are: [{"message": 1, "fact": "The user owns a red bike."}]',
        '{"message": "1", "fact": "The user owns a red bike."}',
        '{"facts": [{"message": "[1]", "fact": "The user owns a red bike."}]}',
        # Cut short by its token budget: the whole items are kept.
        '{"facts": [{"message": 1, "fact": "The user owns a red bike."}, {"message": 2, "fa',
    ],
    ids=["fenced", "a-bare-list-after-words", "one-item-alone", "bracketed-number", "cut-short"],
)
def test_an_answer_wrapped_or_cut_keeps_its_whole_items(content: str) -> None:
    assert read_facts(content, 2) == [(0, "The user owns a red bike.")]


@pytest.mark.parametrize(
    "content",
    ["Sorry, I cannot help with that.", "", '{"summary": "the user likes tea"}', "[1, 2]"],
)
def test_an_answer_with_nothing_to_read_is_none(content: str) -> None:
    assert read_facts(content, 2) is None


def test_items_naming_no_message_or_no_text_are_left_out() -> None:
    good = {"message": 1, "fact": "The user plays chess on Sundays."}
    content = answer(
        {"message": 0, "fact": "numbered from one"},
        {"message": 3, "fact": "beyond the prompt's messages"},
        {"message": True, "fact": "a boolean is not a number"},
        {"message": 1.0, "fact": "a float is not a number"},
        {"message": 1, "fact": 42},
        {"message": 1, "fact": "short"},
        {"message": 1, "fact": "x" * (FACT_MAX_CHARS + 1)},
        {"fact": "no message"},
        "not an item",
        good,
        good,  # once
    )
    assert read_facts(content, 2) == [(0, good["fact"])]


def test_a_message_keeps_a_bounded_number_of_facts() -> None:
    many = [{"message": 1, "fact": f"The user owns bike number {i}."} for i in range(20)]
    found = read_facts(answer(*many), 1)
    assert found is not None and len(found) == FACTS_PER_MESSAGE
    assert found[0] == (0, "The user owns bike number 0.")
