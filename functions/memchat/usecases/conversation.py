"""A turn's conversation with the model: its answer, and its memory tool's rounds.

The model may call `manage_long_term_memory` (model/tools.py) a bounded
number of rounds (MAX_TOOL_ROUNDS); each call edits the notes in memory, and
the turn stores the edited notes with its messages. A call of another tool
is answered with an error; after the last round the model must answer.

Two more kinds of tool may be offered beside it. The `search_memory` tool
(model/search_tool.py), when the turn opts in: each call searches the
user's earlier exchanges and is kept in `Outcome.searches`. And the
client's own tools (POST /v1/chat/completions): memchat cannot run them, so
a round that calls one ends the conversation there, the calls handed back
to the client (`Outcome.client_calls`) after memchat's own calls of that
round have run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memchat import messages
from memchat.model import search_tool, tools

if TYPE_CHECKING:
    from memchat.model.client import Completion, ModelClient, ToolCall
    from memchat.model.sampling import Sampling
    from memchat.usecases.streaming import TurnListener

# memchat's own tools, run by memchat: a round that calls only these goes on.
OWN_TOOLS = frozenset({tools.TOOL_NAME, search_tool.TOOL_NAME})
NO_ROUNDS_LEFT = (
    "I ran out of steps while updating my notes and could not finish my answer; please ask again."
)


@dataclass
class Outcome:
    """What a conversation produced: the answer, the messages to store, the notes' edits."""

    notes: str  # the notes after the edits
    model: str
    notes_limit: int
    answer: str = ""
    rounds: int = 0  # tool rounds used
    messages: list[dict[str, Any]] = field(default_factory=list)  # to store, in order
    edits: list[tools.NoteEdit] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)  # summed over the rounds
    # Calls of the client's tools that ended the conversation (the client runs them).
    client_calls: list[ToolCall] = field(default_factory=list)
    # Each search_memory call: its query, k and the exchanges it found (by id).
    searches: list[dict[str, Any]] = field(default_factory=list)
    # The memories find_memories showed the model (id: text), and those it
    # chose to forget (deleted with the turn).
    memories_shown: dict[int, str] = field(default_factory=dict)
    forgotten: list[int] = field(default_factory=list)

    @property
    def answer_message(self) -> dict[str, Any]:
        """The stored message that ends the turn: the last assistant message
        (an answer, or the call of a client's tool)."""
        return next(m for m in reversed(self.messages) if m["type"] == "ai")


# Runs one search_memory call: (the tool's result text, the call's log entry).
SearchMemory = Callable[[dict[str, Any]], Awaitable[tuple[str, dict[str, Any]]]]
# The caller's memories matching a text: [(id, text, created_at ISO, kind)].
FindMemories = Callable[[str], Awaitable[list[tuple[int, str, str, str]]]]


async def complete(
    model: ModelClient,
    prompt: list[dict[str, Any]],
    tool_schemas: list[dict[str, Any]] | None = None,
    *,
    allow_tools: bool = True,
    listener: TurnListener | None = None,
    sampling: Sampling | None = None,
) -> Completion:
    """One model call (sampled as the client chose); streamed to the listener
    when there is one."""
    if listener is None:
        return await model.complete(
            prompt, tool_schemas, allow_tools=allow_tools, sampling=sampling
        )
    return await model.complete_streaming(
        prompt, tool_schemas, allow_tools=allow_tools, on_delta=listener.delta, sampling=sampling
    )


async def converse(
    model: ModelClient,
    prompt: list[dict[str, Any]],
    *,
    notes: str,
    notes_limit: int,
    max_rounds: int,
    listener: TurnListener | None = None,
    client_tools: tuple[dict[str, Any], ...] = (),
    search: SearchMemory | None = None,
    sampling: Sampling | None = None,
    find_memories: FindMemories | None = None,
) -> Outcome:
    """Ask the model, running its memory tool calls, until it answers (at most
    `max_rounds` tool rounds) or calls one of `client_tools`. `prompt` grows
    with the rounds."""
    outcome = Outcome(notes=notes, model=model.model, notes_limit=notes_limit)
    schemas = [tools.TOOL_SCHEMA, *([search_tool.TOOL_SCHEMA] if search else []), *client_tools]
    client_names = {tool["function"]["name"] for tool in client_tools}
    for round_number in range(max_rounds + 1):
        completion = await complete(
            model,
            prompt,
            schemas,
            allow_tools=round_number < max_rounds,
            listener=listener,
            sampling=sampling,
        )
        outcome.model = completion.model
        for key, value in completion.usage.items():
            outcome.usage[key] = outcome.usage.get(key, 0) + value
        if not completion.tool_calls or round_number == max_rounds:
            # Tool calls made after the last round are not run; the turn still
            # ends with an answer.
            _answered(outcome, completion, round_number)
            return outcome
        asked = len(outcome.messages)  # where this round's assistant message goes
        await _run_round(outcome, completion, prompt, listener, client_names, search, find_memories)
        if outcome.client_calls:
            outcome.answer = completion.content
            outcome.messages[asked] = messages.ai(
                completion.content,
                tool_calls=[_stored_call(c) for c in completion.tool_calls],
                model=completion.model,
                usage=outcome.usage,
            )
            outcome.rounds = round_number + 1
            return outcome
    raise AssertionError("unreachable")


def _answered(outcome: Outcome, completion: Completion, rounds: int) -> None:
    outcome.answer = completion.content or (NO_ROUNDS_LEFT if completion.tool_calls else "")
    outcome.messages.append(
        messages.ai(outcome.answer, model=completion.model, usage=outcome.usage)
    )
    outcome.rounds = rounds


async def _run_round(
    outcome: Outcome,
    completion: Completion,
    prompt: list[dict[str, Any]],
    listener: TurnListener | None,
    client_names: set[str],
    search: SearchMemory | None,
    find_memories: FindMemories | None,
) -> None:
    """Run one round's tool calls: their messages go to the prompt and the
    store. Calls of the client's tools are not run: they are kept for the client."""
    calls = [_stored_call(c) for c in completion.tool_calls]
    outcome.messages.append(
        messages.ai(completion.content, tool_calls=calls, model=completion.model)
    )
    prompt.append(
        {
            "role": "assistant",
            "content": completion.content or None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in completion.tool_calls
            ],
        }
    )
    for call in completion.tool_calls:
        if call.name in client_names:
            outcome.client_calls.append(call)
            continue
        edits = len(outcome.edits)
        if call.name == search_tool.TOOL_NAME and search is not None:
            result = await _search(call, outcome, search)
        elif call.name == tools.TOOL_NAME and _operation(call) in tools.MEMORY_OPERATIONS:
            result = await _memories(call, outcome, find_memories)
        else:
            result = _run_tool(call, outcome)
        if listener is not None and len(outcome.edits) > edits:
            await listener.notes(outcome.edits[-1].operation)
        outcome.messages.append(messages.tool(result, tool_call_id=call.id, name=call.name))
        prompt.append({"role": "tool", "tool_call_id": call.id, "content": result})


async def _search(call: ToolCall, outcome: Outcome, search: SearchMemory) -> str:
    try:
        arguments = call.parsed()
    except ValueError:
        return "error: arguments must be a JSON object"
    result, entry = await search(arguments)
    outcome.searches.append(entry)
    return result


def _operation(call: ToolCall) -> str:
    try:
        return str(call.parsed().get("operation", ""))
    except ValueError:
        return ""


async def _memories(call: ToolCall, outcome: Outcome, find: FindMemories | None) -> str:
    """find_memories: the memories matching `content`, with their ids;
    forget_memories: those of `content`'s ids that a find showed, forgotten
    when the turn is stored."""
    if find is None:
        return "error: memory is off for this turn"
    arguments = call.parsed()
    content = arguments.get("content")
    if not isinstance(content, str) or not content.strip():
        return "error: content must say what about (find_memories) or which ids (forget_memories)"
    if arguments["operation"] == tools.FIND_MEMORIES:
        found = await find(content)
        outcome.memories_shown.update({memory_id: text for memory_id, text, _, _ in found})
        if not found:
            return "no memory matches"
        return json.dumps(
            [
                {"id": memory_id, "text": text, "time": at, "said_by": _said_by(kind)}
                for memory_id, text, at, kind in found
            ],
            ensure_ascii=False,
        )
    ids = [int(part) for part in re.findall(r"\d+", content)]
    unknown = [i for i in ids if i not in outcome.memories_shown]
    if not ids or unknown:
        return "error: forget_memories takes ids that find_memories showed in this turn" + (
            f"; not shown: {', '.join(map(str, unknown))}" if unknown else ""
        )
    chosen = [i for i in dict.fromkeys(ids) if i not in outcome.forgotten]
    outcome.forgotten.extend(chosen)
    return "forgotten, for good: " + json.dumps(
        [outcome.memories_shown[i] for i in chosen], ensure_ascii=False
    )


def _said_by(kind: str) -> str:
    return "user" if kind == "fact" else "assistant"


def _stored_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "name": call.name, "args": _safe_args(call)}


def _run_tool(call: ToolCall, outcome: Outcome) -> str:
    if call.name != tools.TOOL_NAME:
        return f"error: unknown tool {call.name!r}"
    try:
        arguments = call.parsed()
    except ValueError:
        return "error: arguments must be a JSON object"
    result, edit = tools.run(arguments, outcome.notes, outcome.notes_limit)
    if edit is not None:
        outcome.notes = edit.apply(outcome.notes)
        outcome.edits.append(edit)
    return result


_RAW = "_raw"  # stored arguments that were not a JSON object


def _safe_args(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as stored; kept raw when they are not a JSON object."""
    try:
        return call.parsed()
    except ValueError:
        return {_RAW: call.arguments}


def prompt_round(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored message of a turn's rounds (an assistant's calls or answer, a
    tool's result) as the model is sent it."""
    data = stored.get("data", {})
    if stored.get("type") == "tool":
        return {
            "role": "tool",
            "tool_call_id": str(data.get("tool_call_id", "")),
            "content": messages.text_of(stored),
        }
    text = messages.text_of(stored)
    calls = data.get("tool_calls") or []
    if not calls:
        return {"role": "assistant", "content": text}
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": call_arguments(call)},
            }
            for call in calls
        ],
    }


def call_arguments(stored_call: dict[str, Any]) -> str:
    """A stored call's arguments as JSON text again (the raw text when they
    were not a JSON object; else the same object, as JSON)."""
    args = stored_call.get("args") or {}
    if set(args) == {_RAW} and isinstance(args[_RAW], str):
        return str(args[_RAW])
    return json.dumps(args, ensure_ascii=False)
