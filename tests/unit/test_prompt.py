"""Memory's part of the prompt within a token budget (memchat.usecases.prompt),
counted with the real o200k_base tokenizer."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from memchat import messages
from memchat.model.tokens import TokenCounter, count_message, counter_for_model
from memchat.store import Hit
from memchat.usecases import prompt

START = datetime(2026, 11, 1, 9, 30, tzinfo=UTC)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    found = counter_for_model("gpt-4o-mini")
    assert found.exact and found.name == "o200k_base"
    return found


def hit(question: str, score: float, *, day: int = 0, answer: str | None = "ok") -> Hit:
    return Hit(
        message_id=day + 1,
        session_id=uuid.UUID(int=day + 1),
        created_at=START + timedelta(days=day),
        score=score,
        title=f"talk {day}",
        question=question,
        answer=answer,
    )


def window(*texts: str) -> list[dict[str, str]]:
    roles = ["user", "assistant"]
    return [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]


def tokens_of(counter: TokenCounter, memory: prompt.MemoryPrompt) -> int:
    return sum(count_message(counter, str(m["content"])) for m in memory.messages())


def test_everything_fits_and_the_tokens_are_what_the_prompt_carries(
    counter: TokenCounter,
) -> None:
    memory = prompt.fit(
        counter,
        budget=4000,
        notes="- likes tea",
        hits=[hit("my favourite colour is teal", 0.8)],
        window=window("hello", "hi there"),
    )
    assert not memory.truncated and memory.dropped == []
    assert memory.tokens == tokens_of(counter, memory)
    roles = [m["role"] for m in memory.messages()]
    assert roles == ["system", "system", "user", "assistant"]
    assert memory.messages()[0]["content"] == f"{messages.NOTES_PREAMBLE}\n- likes tea"
    assert memory.messages()[1]["content"].startswith(messages.RECALL_PREAMBLE)


def test_the_recall_block_labels_each_exchange_oldest_first() -> None:
    block = prompt.recall_block([hit("second", 0.9, day=3), hit("first", 0.5, day=1, answer=None)])
    assert block.splitlines() == [
        messages.RECALL_PREAMBLE,
        "",
        f'[2026-11-02 · conversation "talk 1" · {str(uuid.UUID(int=2))[:8]}]',
        "User: first",
        "",
        f'[2026-11-04 · conversation "talk 3" · {str(uuid.UUID(int=4))[:8]}]',
        "User: second",
        "Assistant: ok",
    ]


def test_the_oldest_window_messages_go_first_but_never_the_newest_two(
    counter: TokenCounter,
) -> None:
    long = "word " * 300  # ~300 tokens each
    memory = prompt.fit(
        counter,
        budget=700,
        notes="- likes tea",
        hits=[hit("tea", 0.9)],
        window=window(long + "1", long + "2", long + "3", long + "4"),
    )
    assert [m["content"][-1] for m in memory.window] == ["3", "4"]
    assert memory.dropped == ["window", "window"]
    assert memory.hits and memory.notes == "- likes tea"
    assert memory.truncated and memory.tokens <= 700


def test_then_the_lowest_scored_hits(counter: TokenCounter) -> None:
    hits = [hit("alpha " * 50, 0.9, day=1), hit("beta " * 50, 0.4, day=2), hit("gamma", 0.6, day=3)]
    full = prompt.fit(counter, budget=100_000, notes="", hits=hits, window=window("a", "b", "c"))
    budget = full.tokens - 20  # dropping "beta" (the lowest) is enough
    memory = prompt.fit(counter, budget=budget, notes="", hits=hits, window=window("a", "b", "c"))
    assert [h.score for h in memory.hits] == [0.9, 0.6]
    assert len(memory.window) == 2  # the oldest window message went first
    assert memory.dropped == ["window", "recall"]
    assert memory.tokens <= budget


def test_then_the_end_of_the_notes(counter: TokenCounter) -> None:
    notes = "\n".join(f"- fact number {i}" for i in range(200))
    memory = prompt.fit(
        counter, budget=300, notes=notes, hits=[hit("x", 0.9)], window=window("q", "a")
    )
    assert memory.hits == [] and memory.dropped == ["recall", "notes"]
    assert notes.startswith(memory.notes) and 0 < len(memory.notes) < len(notes)
    assert memory.tokens <= 300 and memory.tokens == tokens_of(counter, memory)


def test_an_over_long_newest_message_does_not_empty_the_window(counter: TokenCounter) -> None:
    huge = "lorem ipsum " * 2000
    memory = prompt.fit(
        counter, budget=500, notes="- n", hits=[], window=window("old", "older", "q", huge)
    )
    assert [m["content"] for m in memory.window] == ["q", huge]
    assert memory.notes == "" and memory.truncated
    assert memory.tokens == tokens_of(counter, memory)  # over budget, but honest


def test_the_window_character_cap_still_applies(counter: TokenCounter) -> None:
    memory = prompt.fit(
        counter,
        budget=100_000,
        notes="",
        hits=[],
        window=window("a" * 600, "b" * 300, "c" * 300),
        max_window_chars=1000,
    )
    assert [m["content"][0] for m in memory.window] == ["b", "c"] and memory.truncated


def test_an_empty_memory_adds_no_tokens(counter: TokenCounter) -> None:
    memory = prompt.fit(counter, budget=100, notes="", hits=[], window=[])
    assert memory.messages() == [] and memory.tokens == 0 and not memory.truncated


def test_the_summary_sits_before_the_window_and_goes_after_recall_before_the_notes(
    counter: TokenCounter,
) -> None:
    summary = "The user planned a trip to Lisbon. " * 20
    notes = "\n".join(f"- note {i}" for i in range(30))
    args = {
        "notes": notes,
        "hits": [hit("tea", 0.9)],
        "window": window("q", "a"),
        "summary": summary,
    }
    full = prompt.fit(counter, budget=100_000, **args)
    assert [m["content"].split("\n", 1)[0] for m in full.messages()][:3] == [
        messages.NOTES_PREAMBLE,
        messages.RECALL_PREAMBLE,
        messages.SUMMARY_PREAMBLE,
    ]
    assert full.messages()[2]["content"] == f"{messages.SUMMARY_PREAMBLE}\n{summary}"

    without_summary = full.tokens - count_message(counter, prompt.summary_block(summary))
    memory = prompt.fit(counter, budget=without_summary, **args)
    assert memory.dropped == ["recall", "summary"]
    assert memory.summary == "" and memory.notes == notes  # the notes were kept whole
    assert memory.tokens <= without_summary
