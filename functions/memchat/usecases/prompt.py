"""What memory adds to a prompt, within a token budget.

A turn's prompt is: the system prompt, the long-term notes, the exchanges
recalled from earlier conversations (one labelled block), the session's
rolling summary (one labelled block), the window (the session's last
messages, oldest first), then the new message. Memory's part (notes,
recall, summary, window) must fit MEMORY_MAX_CONTEXT_TOKENS, counted with
the model's tokenizer (memchat.model.tokens). When it does not, `fit` drops,
in this order: the oldest window messages (never the newest two), then the
lowest-scored recalled exchanges, then the summary, then the end of the
notes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memchat import messages

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
        """The system messages and the window, in prompt order."""
        out: list[dict[str, Any]] = []
        if self.notes:
            out.append({"role": "system", "content": notes_block(self.notes)})
        if self.hits:
            out.append({"role": "system", "content": recall_block(self.hits)})
        if self.summary:
            out.append({"role": "system", "content": summary_block(self.summary)})
        out.extend(self.window)
        return out


def notes_block(notes: str) -> str:
    return f"{messages.NOTES_PREAMBLE}\n{notes}"


def summary_block(summary: str) -> str:
    return f"{messages.SUMMARY_PREAMBLE}\n{summary}"


def recall_block(hits: Sequence[Hit]) -> str:
    """The recalled exchanges as one labelled block, oldest first (see messages.py)."""
    parts = [messages.RECALL_PREAMBLE]
    for hit in sorted(hits, key=lambda h: h.created_at):
        title = f' "{hit.title}"' if hit.title else ""
        day = hit.created_at.date().isoformat()
        lines = [
            f"[{day} · conversation{title} · {str(hit.session_id)[:8]}]",
            f"User: {hit.question}",
        ]
        if hit.answer:
            lines.append(f"Assistant: {hit.answer}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


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
    characters, dropping the oldest first (never the newest two).
    """
    from memchat.model.tokens import count_message

    result = MemoryPrompt(notes=notes, hits=list(hits), window=list(window), summary=summary)
    window_tokens = [count_message(counter, m["content"]) for m in result.window]
    notes_tokens = count_message(counter, notes_block(notes)) if notes else 0
    recall_tokens = _recall_tokens(counter, result.hits)
    summary_tokens = count_message(counter, summary_block(summary)) if summary else 0

    def over() -> bool:
        return notes_tokens + recall_tokens + summary_tokens + sum(window_tokens) > budget

    def window_too_long() -> bool:
        chars = sum(len(m["content"]) for m in result.window)
        return max_window_chars is not None and chars > max_window_chars

    while len(result.window) > KEEP_NEWEST and (over() or window_too_long()):
        result.window.pop(0)
        window_tokens.pop(0)
        result.dropped.append("window")
    while over() and result.hits:
        result.hits.remove(min(result.hits, key=lambda h: h.score))
        recall_tokens = _recall_tokens(counter, result.hits)
        result.dropped.append("recall")
    if over() and summary:
        result.summary, summary_tokens = "", 0
        result.dropped.append("summary")
    if over() and notes:
        result.notes, notes_tokens = _cut_notes(
            counter, notes, budget - recall_tokens - sum(window_tokens)
        )
        result.dropped.append("notes")
    result.truncated = bool(result.dropped)
    result.tokens = notes_tokens + recall_tokens + summary_tokens + sum(window_tokens)
    return result


def _cut_notes(counter: TokenCounter, notes: str, room: int) -> tuple[str, int]:
    """The longest start of `notes` whose block fits `room` tokens, and its tokens."""
    from memchat.model.tokens import count_message

    keep = room - count_message(counter, notes_block(""))
    while keep > 0:
        cut = counter.truncate(notes, keep)
        tokens = count_message(counter, notes_block(cut))
        if tokens <= room:
            return cut, tokens
        # Tokens can merge across the block's seams: shave the excess and retry.
        keep -= tokens - room
    return "", 0


def _recall_tokens(counter: TokenCounter, hits: Sequence[Hit]) -> int:
    from memchat.model.tokens import count_message

    return count_message(counter, recall_block(hits)) if hits else 0
