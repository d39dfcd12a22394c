"""What memory adds to a prompt, within a token budget.

A turn's prompt is: the system prompt (memchat's instructions only), the
memory block, the window (the session's last messages, oldest first), then
the new message. Memory's part (the block and the window) must fit
MEMORY_MAX_CONTEXT_TOKENS, counted with the model's tokenizer
(memchat.model.tokens) exactly as it is sent. When it does not, `fit`
drops, in this order: the oldest window messages (never the newest two),
then the recalled exchanges' neighbours (last recalled first, the
exchange after it before the one before it), then the recalled exchanges
themselves (last recalled first: recall returns them best first), then the
summary, then the end of the notes.

The block itself (its texts, how remembered text is quoted, reading it
back) is memchat.prompts.memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from memchat.prompts.memory import memory_block

if TYPE_CHECKING:
    from memchat.model.tokens import TokenCounter
    from memchat.store import Hit

# The window's newest messages are what the new message most likely refers to.
KEEP_NEWEST = 2


@dataclass
class MemoryPrompt:
    """Memory's part of a prompt, fitted to the budget."""

    notes: str
    hits: list[Hit]  # best first
    window: list[dict[str, Any]]  # OpenAI messages, oldest first
    summary: str = ""
    tokens: int = 0  # what memory adds, in the model's tokens
    truncated: bool = False  # something was left out to fit
    dropped: list[str] = field(default_factory=list)  # what, for the logs

    def messages(self) -> list[dict[str, Any]]:
        """The memory block (a user message; none when memory is empty), then
        the window, in prompt order. No system message."""
        block = memory_block(self.notes, self.hits, self.summary)
        out: list[dict[str, Any]] = [{"role": "user", "content": block}] if block else []
        out.extend(self.window)
        return out


def fit(
    counter: TokenCounter,
    *,
    budget: int,
    notes: str,
    hits: Sequence[Hit],
    window: Sequence[dict[str, Any]],
    summary: str = "",
    max_window_chars: int | None = None,
) -> MemoryPrompt:
    """Notes, hits (best first), the summary and the window (oldest first)
    within `budget` tokens.

    `max_window_chars` (MEMORY_MAX_CONTEXT_CHARS) also caps the window's
    characters, dropping the oldest first (never the newest two), and each
    message's: a longer one (an imported document) is cut to its start.
    """
    from memchat.model.tokens import count_message

    if max_window_chars is not None:
        window = [_cut_message(m, max_window_chars) for m in window]
    result = MemoryPrompt(notes=notes, hits=list(hits), window=list(window), summary=summary)
    window_tokens = [count_message(counter, m["content"]) for m in result.window]
    block_tokens = _block_tokens(counter, result.notes, result.hits, result.summary)

    def over() -> bool:
        return block_tokens + sum(window_tokens) > budget

    def window_too_long() -> bool:
        chars = sum(len(m["content"]) for m in result.window)
        return max_window_chars is not None and chars > max_window_chars

    while len(result.window) > KEEP_NEWEST and (over() or window_too_long()):
        result.window.pop(0)
        window_tokens.pop(0)
        result.dropped.append("window")
    while over() and any(hit.before or hit.after for hit in result.hits):
        last = max(i for i, hit in enumerate(result.hits) if hit.before or hit.after)
        weakest = result.hits[last]
        if weakest.after:
            result.hits[last] = replace(weakest, after=None)
        else:
            result.hits[last] = replace(weakest, before=None)
        block_tokens = _block_tokens(counter, result.notes, result.hits, result.summary)
        result.dropped.append("neighbour")
    while over() and result.hits:
        result.hits.pop()  # best first: the last is the weakest
        block_tokens = _block_tokens(counter, result.notes, result.hits, result.summary)
        result.dropped.append("recall")
    if over() and result.summary:
        result.summary = ""
        block_tokens = _block_tokens(counter, result.notes, result.hits, result.summary)
        result.dropped.append("summary")
    if over() and result.notes:
        result.notes, block_tokens = _cut_notes(
            counter, result.notes, result.hits, budget - sum(window_tokens)
        )
        result.dropped.append("notes")
    result.truncated = bool(result.dropped)
    result.tokens = block_tokens + sum(window_tokens)
    return result


CUT_MARK = " […]"


def _cut_message(message: dict[str, Any], max_chars: int) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, str) or len(content) <= max_chars:
        return message
    return {**message, "content": content[: max_chars - len(CUT_MARK)] + CUT_MARK}


def _block_tokens(counter: TokenCounter, notes: str, hits: Sequence[Hit], summary: str) -> int:
    """The tokens the memory block's message takes (0 when there is none)."""
    from memchat.model.tokens import count_message

    block = memory_block(notes, hits, summary)
    return count_message(counter, block) if block else 0


def _cut_notes(
    counter: TokenCounter, notes: str, hits: Sequence[Hit], room: int
) -> tuple[str, int]:
    """The longest start of `notes` whose block (with `hits`) fits `room`
    tokens, and the block's tokens; ("", tokens without notes) when none does.

    Quoting makes the block's cost grow unevenly with the notes' length
    (each newline costs an escape), so the cut is searched, in the notes'
    own tokens, rather than computed.
    """
    best = ("", _block_tokens(counter, "", hits, ""))
    low, high = 1, counter.count(notes)
    while low <= high:
        keep = (low + high) // 2
        cut = counter.truncate(notes, keep)
        tokens = _block_tokens(counter, cut, hits, "")
        if tokens <= room:
            best, low = (cut, tokens), keep + 1
        else:
            high = keep - 1
    return best
