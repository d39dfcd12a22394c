"""A tiny offline stand-in for an OpenAI-compatible server.

`memchat dev` with no OPENAI_API_KEY answers from this, so a newcomer can
try the whole flow (sessions, history, long-term notes, recall) with no key.
It is served through the real `openai` client via an in-process HTTP
transport (its requests addressed to HOST, which no network has, and left
out of httpx2's request log), and every answer says that it is the offline
responder.

It serves `POST /chat/completions` (an answer built from the prompt: a
question answered from what the prompt carries (`answer_from_context`:
"my name is Ana", then "what is my name?"), the last message, the history,
and what the memory block carries (the notes, the first recalled exchange,
the summary: memchat.usecases.prompt); with
`"stream": true`, streamed as OpenAI does, word by word; the summary
worker's and the backfill's requests answered in kind: a summary of what
the user said, the rule's fact sentences as written facts) and
`POST /embeddings` (the local feature-hashing embedder of
`memchat.model.embeddings`: it matches shared words, not meaning).
"""

from __future__ import annotations

import array
import asyncio
import base64
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx  # the HTTP library of the openai SDK (>= 3)

from memchat.model.embeddings import local_embedding
from memchat.prompts import suggestions
from memchat.prompts.facts import FACTS_INSTRUCTIONS, numbered_messages
from memchat.prompts.memory import Remembered, read_memory
from memchat.prompts.summary import SUMMARY_INSTRUCTIONS

LABEL = "[offline responder: set OPENAI_API_KEY for real answers]"
# text-embedding-3-small's size, when a request does not ask for one.
DEFAULT_DIMENSIONS = 1536
MAX_DIMENSIONS = 16000
_QUOTE_CHARS = 200
# Between two streamed chunks: enough for `memchat dev` to show an answer grow.
STREAM_PAUSE_SECONDS = 0.02
_ARGUMENT_PIECE = 16


def _reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
    if _system_message(messages, SUMMARY_INSTRUCTIONS.split("{", 1)[0]):
        return {"role": "assistant", "content": _summary(messages)}
    if _system_message(messages, FACTS_INSTRUCTIONS):
        return {"role": "assistant", "content": _facts_written(messages)}
    if _system_message(messages, suggestions.INSTRUCTIONS):
        return {"role": "assistant", "content": _follow_ups(messages)}
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return {"role": "assistant", "content": f"{LABEL} Noted, I will remember that."}
    user_text = str(last.get("content", ""))
    lowered = user_text.strip().lower()
    if lowered.startswith("remember "):
        fact = user_text.strip()[len("remember ") :].strip()
        arguments = json.dumps({"operation": "append", "content": f"- {fact}"})
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": "manage_long_term_memory", "arguments": arguments},
                }
            ],
        }
    memory, earlier_messages = _memory(messages[:-1])
    history = [m for m in earlier_messages if m.get("role") in ("user", "assistant")]
    recalled = _one_line(memory.recalled[0].question) if memory.recalled else ""
    earlier = [m["content"] for m in history if m.get("role") == "user"]
    parts = [LABEL]
    answer = answer_from_context(user_text, _statements(memory, earlier))
    if answer:
        parts.append(answer)
    parts.append(f'You said: "{user_text}".')
    if recalled:
        parts.append(f'From an earlier conversation I recall you said: "{recalled}".')
    if memory.summary:
        parts.append("My summary of our earlier messages: " + memory.summary[:300])
    parts.append(
        f'I remember {len(history)} earlier messages; your last one was "{earlier[-1]}".'
        if earlier
        else "This is the start of our conversation."
    )
    if memory.notes:
        parts.append("My notes about you: " + memory.notes.replace("\n", " "))
    parts.append('(Say "remember <fact>" to add to my long-term notes.)')
    return {"role": "assistant", "content": " ".join(parts)}


# ------------------------------------------------- answering from the context
#
# A question is answered from what the prompt carries, the way a model would
# use it, in a simple deterministic way: a fact "my <key> is <value>" (or
# "call me <name>") whose key the question asks about ("what is my <key>?",
# "who am I?"), else the statement sharing the most words with the question.
# Statements are taken newest and most trusted first: this conversation's
# messages (newest first), the long-term notes (last line first), the
# recalled earlier conversations (in the block's order), the summary.

THIS_CONVERSATION = "you told me earlier in this conversation"
NOTES = "from my long-term notes"
EARLIER_CONVERSATION = "you told me in an earlier conversation"
SUMMARY = "from my summary of our earlier messages"


@dataclass(frozen=True)
class Statement:
    text: str
    source: str  # one of the four above: where the statement was found


_FACT = re.compile(
    r"\bmy\s+([a-z0-9][a-z0-9' -]{0,40}?)\s+(?:is|are|was)\s+(.+?)\s*(?:[.!?;,]|$)", re.I
)
_CALL_ME = re.compile(r"\b(?:call me|i am called|i'm called)\s+(.+?)\s*(?:[.!?;,]|$)", re.I)
_ASKS_MY = re.compile(r"\bmy\s+([a-z0-9][a-z0-9' -]*)", re.I)
_WHO_AM_I = re.compile(r"\bwho am i\b", re.I)
_QUESTION_START = re.compile(
    r"^(?:what|what's|whats|who|where|when|which|how|why|do|does|did|can|could|is|are"
    r"|tell me)\b",
    re.I,
)
_WORD = re.compile(r"[a-z0-9']+")
_AND = re.compile(r"\s+(?:and|but)\s+", re.I)
# Words that say nothing about what a question is about.
_STOP_WORDS = frozenset(
    (  # noqa: SIM905 (a list literal of 60 words would take 60 lines)
        "the and are was were what what's whats who where when which how why does did can could"
        " you your yours tell about this that these those there their them they have has had"
        " for with from into onto not but all any some just know remember again please"
        " i'm i've me my mine our ours its it's is am be"
    ).split()
)
_FILLER = frozenset({"again", "now", "then", "please", "is", "was", "are", "today"})
_SWAP = {"my": "your", "i": "you", "me": "you", "i'm": "you're", "mine": "yours", "am": "are"}


def answer_from_context(message: str, statements: list[Statement]) -> str:
    """The answer to `message` from `statements`, or "" when it is not a
    question or nothing there answers it."""
    text = " ".join(message.split())
    if not (text.endswith("?") or _QUESTION_START.match(text)):
        return ""
    key = "name" if _WHO_AM_I.search(text) else _asked_key(text)
    if key:
        for statement in statements:
            for fact_key, value in _facts(statement.text):
                if _same_key(key, fact_key):
                    return f"Your {fact_key} is {_as_yours(value)} ({statement.source})."
    best = _most_shared_words(text, statements)
    if best is None:
        return ""
    return f'What I have on that: "{_one_line(best.text)}" ({best.source}).'


def _statements(memory: Remembered, earlier: list[Any]) -> list[Statement]:
    """What the context says, newest and most trusted first (see above)."""
    found = [Statement(str(text), THIS_CONVERSATION) for text in reversed(earlier)]
    note_lines = [line.strip().lstrip("-*").strip() for line in memory.notes.splitlines()]
    found += [Statement(line, NOTES) for line in reversed(note_lines) if line]
    for exchange in memory.recalled:
        asked = [exchange.after, (exchange.question, exchange.answer), exchange.before]
        found += [Statement(pair[0], EARLIER_CONVERSATION) for pair in asked if pair]
    summary = memory.summary.removeprefix("[offline summary] ")
    pieces = re.findall(r'"([^"]+)"', summary) or re.split(r"(?<=[.!?])\s+", summary)
    found += [Statement(piece.strip(), SUMMARY) for piece in pieces if piece.strip()]
    return [s for s in found if not s.text.startswith(LABEL)]


def _asked_key(question: str) -> str:
    """What "my ..." the question asks about ("what is my name again?": name)."""
    match = _ASKS_MY.search(question.rstrip("?!. "))
    if match is None:
        return ""
    words = match.group(1).lower().split()[:4]
    while words and words[-1] in _FILLER:
        words.pop()
    return " ".join(words)


def _facts(text: str) -> list[tuple[str, str]]:
    """The (key, value) facts a statement gives: "my <key> is <value>", "call me <name>"."""
    facts = [(m.group(1).lower().strip(), m.group(2)) for m in _FACT.finditer(text)]
    facts += [("name", m.group(1)) for m in _CALL_ME.finditer(text)]
    # "my name is Ana and I live in Porto": the name is Ana.
    values = [(key, _AND.split(value, 1)[0].strip()) for key, value in facts]
    return [(key, value) for key, value in values if value]


def _same_key(asked: str, told: str) -> bool:
    """ "colour" asks about "favourite colour", and the other way round."""
    return asked == told or told.endswith(" " + asked) or asked.endswith(" " + told)


def _as_yours(value: str) -> str:
    """The value as said back to the user ("my sister": "your sister")."""
    return " ".join(_SWAP.get(word.lower(), word) for word in value.split())


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 2 and w not in _STOP_WORDS}


def _most_shared_words(question: str, statements: list[Statement]) -> Statement | None:
    """The statement (not itself a question) sharing the most content words
    with the question; the first such one on a tie; None when none shares any."""
    asked = _content_words(question)
    best, best_count = None, 0
    for statement in statements:
        if statement.text.rstrip().endswith("?"):
            continue
        count = len(asked & _content_words(statement.text))
        if count > best_count:
            best, best_count = statement, count
    return best


# What the worker sends (usecases/summarize.py): the summary so far, then the
# new messages as "User: ..." / "Assistant: ..." lines.
_SUMMARY_SO_FAR = "Summary so far:"
_NEW_MESSAGES = "New messages:"
_SUMMARY_LIMIT = 600


def _summary(messages: list[dict[str, Any]]) -> str:
    """A stand-in summary: what the user said, newest last, within a bound."""
    text = str(messages[-1].get("content", "")) if messages else ""
    before, _, new = text.partition(_NEW_MESSAGES)
    earlier = before.replace(_SUMMARY_SO_FAR, "").strip()
    said = [
        line[len("User: ") :].strip()[:80] for line in new.splitlines() if line.startswith("User: ")
    ]
    points = [p for p in (earlier.removeprefix("[offline summary] "),) if p and p != "(none yet)"]
    if said:
        points.append("The user said: " + "; ".join(f'"{s}"' for s in said) + ".")
    summary = " ".join(points) or "Nothing to summarize yet."
    return "[offline summary] " + summary[-_SUMMARY_LIMIT:]


def _facts_written(messages: list[dict[str, Any]]) -> str:
    """A stand-in for model-written fact keys: the rule's sentences of each
    numbered message (fact_sentences), in the JSON asked for."""
    # The rule is recall's (a use case's), so imported here, not at load.
    from memchat.usecases.recall.facts import fact_sentences

    text = str(messages[-1].get("content", "")) if messages else ""
    facts = [
        {"message": number, "fact": sentence}
        for number, said in enumerate(numbered_messages(text), 1)
        for sentence in fact_sentences(said)
    ]
    return json.dumps({"facts": facts})


def _follow_ups(messages: list[dict[str, Any]]) -> str:
    """Stand-in follow-ups, in the JSON asked for: questions about the words
    the user's last message is about (its longest words, from the end)."""
    said = suggestions.conversation_of(str(messages[-1].get("content", "")) if messages else "")
    question = next((text for role, text in reversed(said) if role == "user"), "")
    words = [w.strip(".,!?;:\"'()") for w in question.split()]
    unique = list(dict.fromkeys(w for w in words if len(w) > 3))
    topic = " ".join(sorted(unique, key=len, reverse=True)[:2])
    if not topic:
        return json.dumps({"suggestions": []})
    return json.dumps(
        {
            "suggestions": [
                f"Tell me more about {topic}?",
                f"What should I remember about {topic}?",
                f"What else is related to {topic}?",
            ]
        }
    )


def _system_message(messages: list[dict[str, Any]], preamble: str) -> str:
    """The content of the first system message that starts with `preamble`."""
    return next(
        (
            m["content"]
            for m in messages
            if m.get("role") == "system"
            and isinstance(m.get("content"), str)
            and m["content"].startswith(preamble)
        ),
        "",
    )


def _memory(
    messages: list[dict[str, Any]],
) -> tuple[Remembered, list[dict[str, Any]]]:
    """What the memory block carries, and the messages without it.

    The block is the first message after the system prompt (ChatService's
    layout); a user message that merely looks like one later in the window
    is the user's own text, not memory.
    """
    first = next((i for i, m in enumerate(messages) if m.get("role") != "system"), None)
    if first is not None and messages[first].get("role") == "user":
        content = messages[first].get("content")
        memory = read_memory(content) if isinstance(content, str) else None
        if memory is not None:
            return memory, messages[:first] + messages[first + 1 :]
    return Remembered(), messages


def _one_line(question: str) -> str:
    """A recalled question on one line, within _QUOTE_CHARS."""
    question = " ".join(question.split())
    if len(question) > _QUOTE_CHARS:
        question = question[: _QUOTE_CHARS - 1].rstrip() + "\u2026"
    return question


def _error(status: int, message: str) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"message": message, "type": "invalid_request_error"}}
    )


def _embeddings(body: dict[str, Any]) -> httpx.Response:
    """OpenAI's embeddings response for `body`, from the local embedder."""
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
        return _error(400, "input must be a string or a non-empty list of strings")
    dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        return _error(400, "dimensions must be an integer")
    if not 1 <= dimensions <= MAX_DIMENSIONS:
        return _error(400, f"dimensions must be between 1 and {MAX_DIMENSIONS}")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        return _error(400, "encoding_format must be 'float' or 'base64'")
    data = []
    for index, text in enumerate(inputs):
        vector: list[float] | str = local_embedding(text, dimensions)
        if encoding == "base64":  # float32 bytes, as the SDK decodes them
            vector = base64.b64encode(array.array("f", vector).tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = sum(len(text.split()) for text in inputs)  # a stand-in for a token count
    return httpx.Response(
        200,
        json={
            "object": "list",
            "data": data,
            "model": "memchat-offline",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
    )


def _handle(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if not path.endswith(("/chat/completions", "/embeddings")):
        return httpx.Response(404, json={"error": {"message": "not found"}})
    body = json.loads(request.content)
    if path.endswith("/embeddings"):
        return _embeddings(body)
    message = _reply(body.get("messages", []))
    if body.get("tool_choice") == "none" and message.get("tool_calls"):
        message = {"role": "assistant", "content": f"{LABEL} (no tool rounds left)"}
    if body.get("stream") is True:
        include_usage = (body.get("stream_options") or {}).get("include_usage") is True
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream; charset=utf-8"},
            content=_stream(message, include_usage),
        )
    completion = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "memchat-offline",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
    return httpx.Response(200, json=completion)


def _stream(message: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
    """`message` as OpenAI streams it: Server-Sent Events, one chunk each."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"content": word} for word in re.findall(r"\S+\s*|\s+", message["content"] or "")]
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": function["name"], "arguments": ""},
                    }
                ]
            }
        )
        arguments = function["arguments"]
        deltas += [
            {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            for piece in (
                arguments[i : i + _ARGUMENT_PIECE]
                for i in range(0, len(arguments), _ARGUMENT_PIECE)
            )
        ]
    base: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "memchat-offline",
    }
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        for delta in deltas
    ]
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if include_usage:
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        chunks.append({**base, "choices": [], "usage": usage})

    async def events() -> AsyncIterator[bytes]:
        for i, chunk in enumerate(chunks):
            if i:
                await asyncio.sleep(STREAM_PAUSE_SECONDS)
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return events()


# Where the offline responder's requests are addressed once they reach its
# client (whatever base URL the settings name): a host no network has, so
# whatever names such a request says it stayed in this process.
HOST = "offline-responder.memchat.invalid"


def http_client() -> httpx.AsyncClient:
    """An httpx client whose every request is answered in-process."""
    _quiet_request_lines()
    return httpx.AsyncClient(
        transport=httpx.MockTransport(_handle), event_hooks={"request": [_in_process]}
    )


async def _in_process(request: httpx.Request) -> None:
    request.url = request.url.copy_with(scheme="http", host=HOST, port=None)


class _InProcessRequests(logging.Filter):
    """Drops httpx2's "HTTP Request: POST <url> ..." line for the offline
    responder's requests: it reports a network call that never happened.
    Every other request's line (a real provider's) is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) > 1 and f"//{HOST}/" in str(args[1]))


def _quiet_request_lines() -> None:
    http_logger = logging.getLogger("httpx2")
    if not any(isinstance(f, _InProcessRequests) for f in http_logger.filters):
        http_logger.addFilter(_InProcessRequests())
