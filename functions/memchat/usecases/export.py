"""Export: one session or a whole account as JSON, NDJSON or Markdown, streamed.

The database builds each message's JSON text (store.export); this
module only frames it, so an export of any size streams in batches and its
memory stays flat. Everything is read in one snapshot (store.snapshot), opened inside the
generator so it lives while the response streams. The generator is started
before the response is: a missing session (404) or an unreachable database
(503) is an error response, never a broken 200.

Example:
    export = await export_session(db, caller, session_id, ExportFormat.NDJSON)
    return StreamingResponse(export.chunks, media_type=export.media_type)
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from memchat import messages, store
from memchat.errors import SessionNotFound

if TYPE_CHECKING:
    from memchat.store.db import Database

# Chunks are gathered up to about this many characters before they are sent,
# so an account with many small sessions does not go out a few bytes at a time.
CHUNK_CHARS = 64 * 1024


class ExportFormat(StrEnum):
    JSON = "json"
    NDJSON = "ndjson"
    MARKDOWN = "markdown"

    @property
    def media_type(self) -> str:
        return {
            ExportFormat.JSON: "application/json",
            ExportFormat.NDJSON: "application/x-ndjson",
            ExportFormat.MARKDOWN: "text/markdown; charset=utf-8",
        }[self]

    @property
    def extension(self) -> str:
        return "md" if self is ExportFormat.MARKDOWN else self.value


@dataclass(frozen=True)
class Export:
    """A started export: what to call it and the rest of its text."""

    filename: str
    media_type: str
    chunks: AsyncIterator[str]


async def export_session(
    db: Database, caller: store.Caller, session_id: uuid.UUID, fmt: ExportFormat
) -> Export:
    """One session with all its messages, oldest first.

    Raises SessionNotFound (unknown or another user's id) before anything streams.
    """
    chunks = await _started(_session_chunks(db, caller, session_id, _renderer(fmt)))
    return Export(f"memchat-session-{session_id}.{fmt.extension}", fmt.media_type, chunks)


async def export_account(db: Database, caller: store.Caller, fmt: ExportFormat) -> Export:
    """Every session with its messages, the active-session pointers, the
    notes and the memories."""
    exported_at = datetime.now(UTC)
    chunks = await _started(_account_chunks(db, caller, exported_at, _renderer(fmt)))
    return Export(f"memchat-export-{exported_at:%Y-%m-%d}.{fmt.extension}", fmt.media_type, chunks)


async def _session_chunks(
    db: Database, caller: store.Caller, session_id: uuid.UUID, out: Renderer
) -> AsyncGenerator[str, None]:
    async with store.snapshot(db, caller, whole_account=False) as reader:
        info = await reader.session(session_id)
        if info is None:
            raise SessionNotFound()
        yield out.begin_session(info.as_dict(), standalone=True)
        async for batch in reader.messages(info.id):
            yield out.messages(str(info.id), batch)
        yield out.end_session()


async def _account_chunks(
    db: Database, caller: store.Caller, exported_at: datetime, out: Renderer
) -> AsyncGenerator[str, None]:
    async with store.snapshot(db, caller, whole_account=True) as reader:
        yield out.begin_account(str(caller.user_id), exported_at.isoformat())
        async for sessions in reader.sessions():
            for info in sessions:
                yield out.begin_session(info.as_dict(), standalone=False)
                async for batch in reader.messages(info.id):
                    yield out.messages(str(info.id), batch)
                yield out.end_session()
        active_sessions, notes = await reader.account_extras()
        yield out.end_account(active_sessions, notes)
        async for batch in reader.memories():
            yield out.memories(batch)
        yield out.close()


async def _started(chunks: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    """Run the export up to its first chunk now, so its errors come before the 200."""
    first = await anext(chunks)
    return _gathered(first, chunks)


async def _gathered(first: str, chunks: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    pending = [first]
    size = len(first)
    try:
        async for chunk in chunks:
            pending.append(chunk)
            size += len(chunk)
            if size >= CHUNK_CHARS:
                yield "".join(pending)
                pending.clear()
                size = 0
        if pending:
            yield "".join(pending)
    finally:
        # Ends the transaction now when the client went away mid-stream.
        await chunks.aclose()


# ---------------------------------------------------------------- formats


def dumps(value: Any) -> str:
    """Compact JSON, as the export writes every value (the database's
    timestamps as the strings they arrive as)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


class Renderer(Protocol):
    """Turns the export's parts into text; messages arrive as JSON text."""

    def begin_account(self, user_id: str, exported_at: str) -> str: ...
    def begin_session(self, session: dict[str, Any], *, standalone: bool) -> str: ...
    def messages(self, session_id: str, batch: list[str]) -> str: ...
    def end_session(self) -> str: ...
    def end_account(
        self, active_sessions: list[dict[str, Any]], notes: list[dict[str, Any]]
    ) -> str: ...
    def memories(self, batch: list[str]) -> str: ...
    def close(self) -> str: ...


def _renderer(fmt: ExportFormat) -> Renderer:
    renderers: dict[ExportFormat, type[Renderer]] = {
        ExportFormat.JSON: JsonRenderer,
        ExportFormat.NDJSON: NdjsonRenderer,
        ExportFormat.MARKDOWN: MarkdownRenderer,
    }
    return renderers[fmt]()


class JsonRenderer:
    """One JSON document, written as it streams."""

    def __init__(self) -> None:
        self._sessions = 0
        self._messages = 0
        self._memories = 0

    def begin_account(self, user_id: str, exported_at: str) -> str:
        head = dumps({"user_id": user_id, "exported_at": exported_at})
        return head[:-1] + ',"sessions":['

    def begin_session(self, session: dict[str, Any], *, standalone: bool) -> str:
        self._messages = 0
        if standalone:
            return '{"session":' + dumps(session) + ',"messages":['
        comma = "," if self._sessions else ""
        self._sessions += 1
        return comma + dumps(session)[:-1] + ',"messages":['

    def messages(self, session_id: str, batch: list[str]) -> str:
        comma = "," if self._messages else ""
        self._messages += len(batch)
        return comma + ",".join(batch)

    def end_session(self) -> str:
        return "]}"

    def end_account(
        self, active_sessions: list[dict[str, Any]], notes: list[dict[str, Any]]
    ) -> str:
        return (
            '],"active_sessions":'
            + dumps(active_sessions)
            + ',"long_term_memory":'
            + dumps(notes)
            + ',"memories":['
        )

    def memories(self, batch: list[str]) -> str:
        comma = "," if self._memories else ""
        self._memories += len(batch)
        return comma + ",".join(batch)

    def close(self) -> str:
        return "]}"


class NdjsonRenderer:
    """One JSON object per line, each with a "type"."""

    def begin_account(self, user_id: str, exported_at: str) -> str:
        return _line({"type": "export", "user_id": user_id, "exported_at": exported_at})

    def begin_session(self, session: dict[str, Any], *, standalone: bool) -> str:
        return _line({"type": "session", **session})

    def messages(self, session_id: str, batch: list[str]) -> str:
        # Each item is a JSON object's text (never a raw newline in it): splice
        # the two fields in rather than parse and re-serialise every message.
        prefix = '{"type":"message","session_id":"' + session_id + '",'
        return "".join(prefix + message[1:] + "\n" for message in batch)

    def end_session(self) -> str:
        return ""

    def end_account(
        self, active_sessions: list[dict[str, Any]], notes: list[dict[str, Any]]
    ) -> str:
        lines = [_line({"type": "active_session", **a}) for a in active_sessions]
        lines += [_line({"type": "long_term_memory", **n}) for n in notes]
        return "".join(lines)

    def memories(self, batch: list[str]) -> str:
        return "".join('{"type":"memory",' + memory[1:] + "\n" for memory in batch)

    def close(self) -> str:
        return ""


def _line(value: dict[str, Any]) -> str:
    return dumps(value) + "\n"


class MarkdownRenderer:
    """A document to read: a heading per session, then its messages."""

    def begin_account(self, user_id: str, exported_at: str) -> str:
        return f"memchat export of user `{user_id}`, made {exported_at}.\n\n"

    def begin_session(self, session: dict[str, Any], *, standalone: bool) -> str:
        title = " ".join((session.get("title") or "Untitled conversation").split())
        facts = [
            f"- Session: `{session['id']}`",
            f"- Agent: `{session['agent_name']}`",
            f"- Status: {session['status']}, {session['message_count']} messages",
            f"- Created: {session['created_at']}",
            f"- Last active: {session['last_active_at']}",
            f"- Expires: {session['expires_at']}",
        ]
        return f"# {title}\n\n" + "\n".join(facts) + "\n\n"

    def messages(self, session_id: str, batch: list[str]) -> str:
        return "".join(_markdown_message(json.loads(text)) for text in batch)

    def end_session(self) -> str:
        return "---\n\n"

    def end_account(
        self, active_sessions: list[dict[str, Any]], notes: list[dict[str, Any]]
    ) -> str:
        parts = ["# Active sessions\n\n"]
        parts += [
            f"- `{a['agent_name']}`: `{a['active_session_id']}` (since {a['last_active_at']})\n"
            for a in active_sessions
        ] or ["None.\n"]
        parts.append("\n# Long-term notes\n\n")
        for n in notes:
            parts.append(
                f"## {n['agent_name']}\n\n_version {n['version']}, updated {n['updated_at']}_"
                f"\n\n{n['notes']}\n\n"
            )
            for earlier in n.get("earlier_versions") or []:
                parts.append(
                    f"### {n['agent_name']}, version {earlier['version']}"
                    f" ({earlier['created_at']})\n\n{earlier['notes']}\n\n"
                )
        if not notes:
            parts.append("None.\n")
        parts.append("\n# Memories\n\n")
        return "".join(parts)

    def __init__(self) -> None:
        self._memories = 0

    def memories(self, batch: list[str]) -> str:
        self._memories += len(batch)
        lines = []
        for text in batch:
            memory = json.loads(text)
            said = "the user" if memory["kind"] == "fact" else "the assistant"
            lines.append(
                f"- {' '.join(memory['text'].split())} _({said}, {memory['created_at']},"
                f" `{memory['agent_name']}`, session `{memory['session_id']}`)_\n"
            )
        return "".join(lines)

    def close(self) -> str:
        return "" if self._memories else "None.\n"


def _markdown_message(message: dict[str, Any]) -> str:
    meta = message.get("metadata") or {}
    role = message.get("role", "")
    head = f"**{role}**"
    if role == "tool" and meta.get("name"):
        head += f" `{meta['name']}`"
    parts = [f"{head} · {message.get('created_at', '')}\n\n"]
    text = messages.content_text(message.get("content"))
    if text:
        parts.append(text + "\n\n")
    for call in meta.get("tool_calls") or []:
        arguments = json.dumps(call.get("args", {}), ensure_ascii=False)
        parts.append(f"→ `{call.get('name', '?')}({arguments})`\n\n")
    return "".join(parts)
