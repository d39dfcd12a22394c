"""A turn's conversation with the model: its answer, and its memory tool's rounds.

The model may call `manage_long_term_memory` (model/tools.py) a bounded
number of rounds (MAX_TOOL_ROUNDS); each call edits the notes in memory, and
the turn stores the edited notes with its messages. A call of another tool
is answered with an error; after the last round the model must answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memchat import messages
from memchat.model import tools

if TYPE_CHECKING:
    from memchat.model.client import Completion, ModelClient, ToolCall
    from memchat.usecases.streaming import TurnListener

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


async def complete(
    model: ModelClient,
    prompt: list[dict[str, Any]],
    tool_schemas: list[dict[str, Any]] | None = None,
    *,
    allow_tools: bool = True,
    listener: TurnListener | None = None,
) -> Completion:
    """One model call; streamed to the listener when there is one."""
    if listener is None:
        return await model.complete(prompt, tool_schemas, allow_tools=allow_tools)
    return await model.complete_streaming(
        prompt, tool_schemas, allow_tools=allow_tools, on_delta=listener.delta
    )


async def converse(
    model: ModelClient,
    prompt: list[dict[str, Any]],
    *,
    notes: str,
    notes_limit: int,
    max_rounds: int,
    listener: TurnListener | None = None,
) -> Outcome:
    """Ask the model, running its memory tool calls, until it answers (at most
    `max_rounds` tool rounds). `prompt` grows with the rounds."""
    outcome = Outcome(notes=notes, model=model.model, notes_limit=notes_limit)
    for round_number in range(max_rounds + 1):
        completion = await complete(
            model,
            prompt,
            [tools.TOOL_SCHEMA],
            allow_tools=round_number < max_rounds,
            listener=listener,
        )
        outcome.model = completion.model
        for key, value in completion.usage.items():
            outcome.usage[key] = outcome.usage.get(key, 0) + value
        if not completion.tool_calls or round_number == max_rounds:
            # Tool calls made after the last round are not run; the turn still
            # ends with an answer.
            _answered(outcome, completion, round_number)
            return outcome
        await _run_round(outcome, completion, prompt, listener)
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
) -> None:
    """Run one round's tool calls: their messages go to the prompt and the store."""
    calls = [{"id": c.id, "name": c.name, "args": _safe_args(c)} for c in completion.tool_calls]
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
        edits = len(outcome.edits)
        result = _run_tool(call, outcome)
        if listener is not None and len(outcome.edits) > edits:
            await listener.notes(outcome.edits[-1].operation)
        outcome.messages.append(messages.tool(result, tool_call_id=call.id, name=call.name))
        prompt.append({"role": "tool", "tool_call_id": call.id, "content": result})


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


def _safe_args(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as stored; kept raw when they are not a JSON object."""
    try:
        return call.parsed()
    except ValueError:
        return {"_raw": call.arguments}
