"""The `manage_long_term_memory` tool: its schema and how a call applies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memchat import notes

TOOL_NAME = "manage_long_term_memory"
# The operations on durable memory (memchat.memories), run by the conversation.
FIND_MEMORIES, FORGET_MEMORIES = "find_memories", "forget_memories"
MEMORY_OPERATIONS = (FIND_MEMORIES, FORGET_MEMORIES)

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Read or edit your long-term notes about this user: durable facts and "
            "preferences worth remembering across conversations. The notes are one "
            "Markdown document; sections start with Markdown headers (e.g. '## Preferences'). "
            "Keep them short and factual; never store secrets. Besides the notes, memchat "
            "remembers what was said in past conversations: find_memories (content: what "
            "about) lists those memories with their ids; when the user asks you to forget "
            "something, find it, then forget_memories (content: the ids, comma-separated) "
            "deletes them for good, and tell the user what was forgotten."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "operation": {
                    "type": "string",
                    "enum": [*notes.OPERATIONS, *MEMORY_OPERATIONS],
                },
                "content": {
                    "type": "string",
                    "description": "Text for overwrite, append, prepend and "
                    "replace_section_by_header; what about, for find_memories; the ids, "
                    "for forget_memories.",
                },
                "header": {
                    "type": "string",
                    "description": "Section header for the *_section_by_header operations.",
                },
            },
            "required": ["operation"],
            "additionalProperties": False,
        },
    },
}


@dataclass(frozen=True)
class NoteEdit:
    """One applied edit, kept so it can be replayed on newer notes."""

    operation: str
    content: str
    header: str

    def apply(self, text: str) -> str:
        return notes.apply(text, self.operation, content=self.content, header=self.header)


def run(arguments: dict[str, Any], current: str, max_chars: int) -> tuple[str, NoteEdit | None]:
    """Apply one tool call to `current`; returns (tool result text, edit or None).

    A content or header longer than `max_chars` is refused as it is, before
    any of it is parsed; an edit whose result is over `max_chars` is refused
    too (one that shrinks notes stored under a larger limit is not). Errors
    are returned as text for the model to read, never raised.
    """
    operation = str(arguments.get("operation", ""))
    content = arguments.get("content") or ""
    header = arguments.get("header") or ""
    if not isinstance(content, str) or not isinstance(header, str):
        return "error: content and header must be strings", None
    if operation == "read":
        return current or "(no notes yet)", None
    # Refused before anything parses them: the model's arguments are as long
    # as it likes, and no edit may bring in more text than the notes can hold.
    for name, value in (("content", content), ("header", header)):
        if len(value) > max_chars:
            return (
                f"error: the {name} is {len(value)} characters, over the notes limit of "
                f"{max_chars}; send a shorter {name}",
                None,
            )
    edit = NoteEdit(operation, content, header)
    try:
        updated = edit.apply(current)
    except notes.NotesError as exc:
        return f"error: {exc}", None
    if updated == current:
        return "ok: the notes say that already; nothing changed", None
    if len(updated) > max_chars:
        return (
            f"error: the notes would be {len(updated)} characters, over the limit of "
            f"{max_chars}; condense them (e.g. overwrite with a shorter version)",
            None,
        )
    return f"ok: notes updated ({len(updated)} characters)", edit
