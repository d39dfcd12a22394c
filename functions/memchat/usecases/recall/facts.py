"""Fact keys by the rule (MEMORY_RECALL_FACTS=rule): a message that says
several things gets a recall key per sentence in which the user speaks of
themselves (the chat model's keys: memchat.prompts.facts, the backfill).
The same sentences, of either side and however many a message has, are what
durable memory keeps of it (memory_sentences)."""

from __future__ import annotations

import re

from memchat.prompts.facts import FACT_MAX_CHARS

# A sentence ends at . ! or ? followed by space and a capital (or a quote).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
# What the user says about themselves: first-person words.
_FIRST_PERSON = re.compile(r"\b(I|I'm|I've|I'd|I'll|my|me|mine|we|our)\b")
# The same words whatever their case ("My sister...", "We moved..."): what
# memory keeps. The fact keys' rule above still misses a sentence that
# starts with one; changing it moves both recall benchmarks (to measure).
_FIRST_PERSON_ANY_CASE = re.compile(r"\b(i|i'm|i've|i'd|i'll|my|me|mine|we|our)\b", re.IGNORECASE)
FACT_MIN_CHARS = 20
# A message keeps at most this many (a long imported document would give
# thousands, each an embedding).
FACT_KEYS_PER_MESSAGE = 100


def _sentences(message: str) -> list[str]:
    return [part.strip() for part in _SENTENCE_END.split(message) if part.strip()]


def _first_person(sentences: list[str], words: re.Pattern[str] = _FIRST_PERSON) -> list[str]:
    """Those of `sentences` in which the speaker speaks of themselves (one of
    `words`), 20-400 characters, in order, each once, at most
    FACT_KEYS_PER_MESSAGE."""
    found = [
        sentence
        for sentence in sentences
        if FACT_MIN_CHARS <= len(sentence) <= FACT_MAX_CHARS and words.search(sentence)
    ]
    return list(dict.fromkeys(found))[:FACT_KEYS_PER_MESSAGE]


def memory_sentences(message: str) -> list[str]:
    """What durable memory keeps of a stored message (memchat.memories), the
    user's or the assistant's: each sentence in which its speaker speaks of
    themselves ("I moved to Berlin in March"), as fact_sentences finds them,
    a message of one sentence included; then, when such a message has more
    than that sentence and at most 400 characters, the message whole, as
    the sentences around one say what it is about ("The support group was
    amazing. I went yesterday."). The whole comes last, so each sentence
    keeps its place (its ordinal) in the message's memories."""
    found = _first_person(_sentences(message), _FIRST_PERSON_ANY_CASE)
    whole = message.strip()
    if found and len(whole) <= FACT_MAX_CHARS and found != [whole]:
        return [*found, whole]
    return found


def fact_sentences(user_message: str) -> list[str]:
    """The extra recall keys of a stored user message: when it says several
    things, each sentence in which the user speaks of themselves ("By the
    way, I got my engagement ring resized"), 20-400 characters, in order,
    each once, at most FACT_KEYS_PER_MESSAGE. A message of one sentence has
    none (its own embedding is that sentence's). Each key is embedded and
    points at its message: a question about one of the things said then
    finds the message, however much else it says (memchat.message_facts;
    LongMemEval's fact-augmented keys, by a rule instead of a model)."""
    sentences = _sentences(user_message)
    if len(sentences) < 2:
        return []
    return _first_person(sentences)
