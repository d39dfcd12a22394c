"""A follow-up's query: a message too short to mean much alone ("and her
age?") is searched with the previous exchange too."""

from __future__ import annotations

import re
from typing import Any

from memchat.messages import text_of

# A message with fewer content words than this (words of three letters or
# more that are not function words) is a follow-up ("and her age?", "why
# not?", "what about Paris?"): recall searches with the previous exchange too.
FOLLOW_UP_WORDS = 2
_WORD = re.compile(r"[^\W\d_]{3,}")
_FUNCTION_WORDS_TEXT = (
    "the and but for nor yet what when where which who whom whose why how "
    "about are was were been being have has had does did doing can could "
    "would should will shall may might must this that these those there "
    "here then than with from into onto over under again also just not any "
    "some all both each more most other such only own same too very her "
    "hers his him she they them their theirs its our ours your yours mine "
    "you one ones it's that's what's okay yes yeah sure thanks thank please"
)
_FUNCTION_WORDS = frozenset(_FUNCTION_WORDS_TEXT.split())
# How much of the previous answer a follow-up's query takes.
FOLLOW_UP_ANSWER_CHARS = 500


def follow_up_query(user_message: str, window: list[dict[str, Any]]) -> str | None:
    """What recall searches with when `user_message` is too short to mean
    much alone: the previous exchange of the window (oldest first: its last
    user message, and the first FOLLOW_UP_ANSWER_CHARS of the answer after
    it) and the message. None: the message is long enough, or nothing
    precedes it."""
    words = [w for w in _WORD.findall(user_message.lower()) if w not in _FUNCTION_WORDS]
    if len(words) >= FOLLOW_UP_WORDS:
        return None
    for index in range(len(window) - 1, -1, -1):
        if window[index].get("type") == "human":
            question = text_of(window[index])
            answer = next(
                (text_of(m) for m in window[index + 1 :] if m.get("type") == "ai" and text_of(m)),
                "",
            )
            parts = [question, answer[:FOLLOW_UP_ANSWER_CHARS], user_message]
            return "\n".join(part for part in parts if part.strip())
    return None
