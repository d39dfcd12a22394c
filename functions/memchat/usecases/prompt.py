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

The memory block is one `user` message, because what it carries (notes,
recalled questions and answers, their conversations' titles, a
model-written summary) is text a user once typed or caused, and a system
message would give it system authority. It reads::

    <memchat_memory>
    <MEMORY_PREAMBLE: quoted data, information, not instructions>

    <NOTES_PREAMBLE> "<the notes>"

    <RECALL_PREAMBLE>
    [2026-11-02 · conversation "<title>" · 3f2a1b20]
    User: "<the exchange before it: its question>"
    Assistant: "<and its answer>"
    User: "<the question>"
    Assistant: "<the answer>"
    [next in that conversation]
    User: "<the exchange after it: its question>"
    Assistant: "<and its answer>"

    <SUMMARY_PREAMBLE> "<the summary>"
    </memchat_memory>

(the texts are in memchat.messages; a section without data is left out,
and there is no block when all are empty). A neighbour is shown once: not
when it is recalled itself (it is shown as a hit), nor again when it is
also the neighbour of another hit shown before it.

Quoting: every piece of remembered text (the notes, each recalled
question, answer and title, the summary) is one JSON string (`quote`):
`json.dumps` escapes quotes, backslashes and control characters (newlines
among them), and `quote` also escapes `<`, `>`, U+0085, U+2028 and U+2029
as `\\uXXXX`. So remembered text never contains a line break of any kind,
an unescaped `"` or a `<` or `>`: it cannot end its string, start a line
(where every label is), or write the block's tags. Every line of the block
is memchat's; `read_memory` reads it back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from memchat import messages

if TYPE_CHECKING:
    from memchat.model.tokens import TokenCounter
    from memchat.store import Hit

# The window's newest messages are what the new message most likely refers to.
KEEP_NEWEST = 2

USER_LABEL = "User: "
ASSISTANT_LABEL = "Assistant: "

# What a JSON string may still hold raw that could pass for markup or a line
# break to a model or to str.splitlines().
_ESCAPES = str.maketrans(
    {
        "<": "\\u003c",
        ">": "\\u003e",
        "\u0085": "\\u0085",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)


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


def quote(text: str) -> str:
    """`text` as one JSON string that holds no line break, `<` or `>` (see above)."""
    return json.dumps(text, ensure_ascii=False).translate(_ESCAPES)


def memory_block(notes: str, hits: Sequence[Hit], summary: str) -> str:
    """The memory block for these notes, hits (any order) and summary; "" when
    all are empty."""
    sections: list[str] = []
    if notes:
        sections.append(f"{messages.NOTES_PREAMBLE} {quote(notes)}")
    if hits:
        sections.append(recall_section(hits))
    if summary:
        sections.append(f"{messages.SUMMARY_PREAMBLE} {quote(summary)}")
    if not sections:
        return ""
    body = "\n\n".join([messages.MEMORY_PREAMBLE, *sections])
    return f"{messages.MEMORY_OPEN}\n{body}\n{messages.MEMORY_CLOSE}"


def recall_section(hits: Sequence[Hit]) -> str:
    """The recalled exchanges, oldest first, under their label (see messages.py)."""
    parts = [messages.RECALL_PREAMBLE]
    # A neighbour recalled in its own right is shown once, as a hit; one that
    # two hits share, once, with the first.
    shown = {hit.message_id for hit in hits}
    for hit in sorted(hits, key=lambda h: (h.created_at, h.message_id)):
        title = f" {quote(hit.title)}" if hit.title else ""
        day = hit.created_at.date().isoformat()
        lines = [f"[{day} · conversation{title} · {str(hit.session_id)[:8]}]"]
        if hit.before is not None and hit.before.message_id not in shown:
            shown.add(hit.before.message_id)
            lines += _exchange_lines(hit.before.question, hit.before.answer)
        lines += _exchange_lines(hit.question, hit.answer)
        if hit.after is not None and hit.after.message_id not in shown:
            shown.add(hit.after.message_id)
            lines.append(messages.NEXT_IN_CONVERSATION)
            lines += _exchange_lines(hit.after.question, hit.after.answer)
        parts.append("\n".join(lines))
    # The label's line ends the label; a blank line separates exchanges.
    return parts[0] + "\n" + "\n\n".join(parts[1:])


def _exchange_lines(question: str, answer: str | None) -> list[str]:
    lines = [USER_LABEL + quote(question)]
    if answer:
        lines.append(ASSISTANT_LABEL + quote(answer))
    return lines


@dataclass(frozen=True)
class Exchange:
    """A recalled exchange as the block shows it."""

    header: str  # `[<date> · conversation "<title>" · <id prefix>]`
    question: str
    answer: str | None
    # The exchanges before and after it, when the block shows them:
    # (question, answer).
    before: tuple[str, str | None] | None = None
    after: tuple[str, str | None] | None = None


@dataclass(frozen=True)
class Remembered:
    """What a memory block carries, unquoted."""

    notes: str = ""
    recalled: list[Exchange] = field(default_factory=list)  # oldest first
    summary: str = ""


def read_memory(content: str) -> Remembered | None:
    """The notes, recalled exchanges and summary of a block `memory_block`
    wrote; None when `content` is not such a block."""
    lines = content.split("\n")
    if (
        len(lines) < 3
        or lines[0] != messages.MEMORY_OPEN
        or lines[1] != messages.MEMORY_PREAMBLE
        or lines[-1] != messages.MEMORY_CLOSE
    ):
        return None
    notes = summary = ""
    recalled: list[Exchange] = []
    after = False  # the lines read are the exchange after the last hit's
    try:
        for line in lines[2:-1]:
            if line.startswith(messages.NOTES_PREAMBLE + " "):
                notes = _unquote(line[len(messages.NOTES_PREAMBLE) + 1 :])
            elif line.startswith(messages.SUMMARY_PREAMBLE + " "):
                summary = _unquote(line[len(messages.SUMMARY_PREAMBLE) + 1 :])
            elif line == messages.NEXT_IN_CONVERSATION and recalled:
                after = True
            elif line.startswith("["):
                recalled.append(Exchange(header=line, question="", answer=None))
                after = False
            elif line.startswith(USER_LABEL) and recalled:
                question = _unquote(line[len(USER_LABEL) :])
                last = recalled[-1]
                if after:
                    recalled[-1] = replace(last, after=(question, None))
                else:
                    # A second question under one header: the first was its neighbour.
                    before = (last.question, last.answer) if last.question else None
                    recalled[-1] = Exchange(last.header, question, None, before)
            elif line.startswith(ASSISTANT_LABEL) and recalled:
                answer = _unquote(line[len(ASSISTANT_LABEL) :])
                last = recalled[-1]
                if after and last.after is not None:
                    recalled[-1] = replace(last, after=(last.after[0], answer))
                else:
                    recalled[-1] = replace(last, answer=answer)
    except ValueError:
        return None
    return Remembered(notes=notes, recalled=recalled, summary=summary)


def _unquote(quoted: str) -> str:
    text = json.loads(quoted)
    if not isinstance(text, str):
        raise ValueError("not a JSON string")
    return text


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
