"""Reading Server-Sent Events (text/event-stream): bytes in, events out, incrementally.

The one reader of the project, on the receiving side of every stream: the
model provider's answer (memchat.model.client), POST /chat's events in the
terminal client (`memchat chat`), and the tests. The writing side of
POST /chat is memchat.api.sse.

As the HTML specification reads a stream ("Parsing an event stream"): one
leading byte order mark is dropped; lines end in CR, LF or CRLF, wherever
the chunks split them; a line starting with `:` is a comment; `field: value`
sets a field (one space after the colon dropped); several `data` lines join
with LF; a blank line dispatches the event, if it has data; an event's name
defaults to `message`; `id` is carried over to the events after it, and
`retry` is kept. Unlike the specification, `data` stays bytes, so that a
reader of JSON keeps JSON's own decoding (`Event.text` is the decoded text),
and a line that is no SSE field (no colon, or an unknown field's name) is
handed over as an `UnknownLine` in its place among the events: ignored as
the specification says by who reads any stream, an error for who expects
a real event stream (the model client, the tests).

Example:
    reader = SSEReader()
    for chunk in response.iter_bytes():
        for item in reader.feed(chunk):
            if isinstance(item, Event):
                handle(item.name, json.loads(item.data))
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
_FIELDS = (b"data", b"event", b"id", b"retry")


@dataclass(frozen=True)
class Event:
    """One dispatched event."""

    name: str  # the `event` field; "message" without one
    data: bytes  # its `data` lines, joined with LF
    id: str = ""  # the last `id` the stream set, at or before this event

    @property
    def text(self) -> str:
        """`data` as text (UTF-8, an invalid byte replaced)."""
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class Comment:
    """A `:` line (a keep-alive, say): no event, but a sign of life."""

    text: str  # after the colon, less one leading space


@dataclass(frozen=True)
class UnknownLine:
    """A line that is neither a comment nor `data:`, `event:`, `id:` or
    `retry:` (HTML, bare JSON...): the specification ignores it (a known
    name without a colon is that field, empty), a strict reader refuses it."""

    line: bytes


Item = Event | Comment | UnknownLine


class SSEReader:
    """An event stream read chunk by chunk: `feed` returns what each chunk
    completes (events, comments, unknown lines), in the stream's order."""

    def __init__(self) -> None:
        self.last_event_id = ""
        self.retry_ms: int | None = None  # the last valid `retry` field
        self._buffer = bytearray()
        self._started = False  # past a possible byte order mark
        self._name = ""
        self._data: list[bytes] = []
        self._in_block = False  # a line since the last blank one

    @property
    def between_events(self) -> bool:
        """Whether the stream so far ends where an event may end: after a blank
        line (or before anything). A stream that closes otherwise was cut."""
        return not self._in_block and not self._buffer

    def feed(self, chunk: bytes) -> list[Item]:
        """The events and comments whose last line this chunk completes."""
        self._buffer += chunk
        if not self._started:
            if len(self._buffer) < len(_BOM) and _BOM.startswith(self._buffer):
                return []  # perhaps a byte order mark split between chunks
            self._started = True
            if self._buffer.startswith(_BOM):
                del self._buffer[: len(_BOM)]
        items: list[Item] = []
        start = 0
        for match in _LINE_END.finditer(self._buffer):
            if match.group() == b"\r" and match.end() == len(self._buffer):
                break  # perhaps the CR of a CRLF split between two chunks
            self._line(bytes(self._buffer[start : match.start()]), items)
            start = match.end()
        del self._buffer[:start]
        return items

    def flush(self) -> list[Item]:
        """At the stream's end: its last line ended, and the event it was in
        dispatched although no blank line closed it.

        The specification drops an unfinished event; a reader that wants a
        cut event to fail where it is read (a JSON chunk cut short) flushes.
        """
        items: list[Item] = []
        for raw in (bytes(self._buffer).removesuffix(b"\r"), b""):
            self._line(raw, items)
        self._buffer.clear()
        return items

    def _line(self, raw: bytes, items: list[Item]) -> None:
        if not raw:
            if self._data:
                name = self._name or "message"
                items.append(Event(name, b"\n".join(self._data), self.last_event_id))
            self._name, self._data, self._in_block = "", [], False
            return
        self._in_block = True
        if raw.startswith(b":"):
            items.append(Comment(raw[1:].removeprefix(b" ").decode("utf-8", "replace")))
            return
        field, colon, value = raw.partition(b":")
        if not colon or field not in _FIELDS:
            items.append(UnknownLine(raw))
        value = value.removeprefix(b" ")
        if field == b"data":
            self._data.append(value)
        elif field == b"event":
            self._name = value.decode("utf-8", "replace")
        elif field == b"id" and b"\0" not in value:
            self.last_event_id = value.decode("utf-8", "replace")
        elif field == b"retry" and value.isdigit():
            self.retry_ms = int(value)
