"""Fact keys by the rule (MEMORY_RECALL_FACTS=rule): a message that says
several things gets a recall key per sentence in which the user speaks of
themselves (the chat model's keys: memchat.prompts.facts, the backfill)."""

from __future__ import annotations

import re

from memchat.prompts.facts import FACT_MAX_CHARS

# A sentence ends at . ! or ? followed by space and a capital (or a quote).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
# What the user says about themselves: first-person words.
_FIRST_PERSON = re.compile(r"\b(I|I'm|I've|I'd|I'll|my|me|mine|we|our)\b")
FACT_MIN_CHARS = 20
# A message keeps at most this many (a long imported document would give
# thousands, each an embedding).
FACT_KEYS_PER_MESSAGE = 100


def fact_sentences(user_message: str) -> list[str]:
    """The extra recall keys of a stored user message: when it says several
    things, each sentence in which the user speaks of themselves ("By the
    way, I got my engagement ring resized"), 20-400 characters, in order,
    each once, at most FACT_KEYS_PER_MESSAGE. A message of one sentence has
    none (its own embedding is that sentence's). Each key is embedded and
    points at its message: a question about one of the things said then
    finds the message, however much else it says (memchat.message_facts;
    LongMemEval's fact-augmented keys, by a rule instead of a model)."""
    sentences = [part.strip() for part in _SENTENCE_END.split(user_message) if part.strip()]
    if len(sentences) < 2:
        return []
    found = [
        sentence
        for sentence in sentences
        if FACT_MIN_CHARS <= len(sentence) <= FACT_MAX_CHARS and _FIRST_PERSON.search(sentence)
    ]
    return list(dict.fromkeys(found))[:FACT_KEYS_PER_MESSAGE]
