"""Long-term notes: one Markdown document per (user, agent).

The operations of the `manage_long_term_memory` tool, as pure functions on
the text. Sections are Markdown ATX headers; a section runs until the next
header of the same or a higher level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")

OPERATIONS = (
    "read",
    "overwrite",
    "append",
    "prepend",
    "replace_section_by_header",
    "delete_section_by_header",
    "delete_all_notes",
)


class NotesError(ValueError):
    """An operation that cannot be applied; the message goes back to the model."""


@dataclass(frozen=True)
class Section:
    start: int  # index of the header line
    end: int  # index one past the last line of the section
    level: int


def _normalise(header: str) -> str:
    match = _HEADER.match(header.strip())
    text = match.group(2) if match else header.strip()
    return " ".join(text.split()).casefold()


def find_section(lines: list[str], header: str) -> Section | None:
    wanted = _normalise(header)
    for index, line in enumerate(lines):
        match = _HEADER.match(line)
        if match and _normalise(match.group(2)) == wanted:
            level = len(match.group(1))
            end = index + 1
            while end < len(lines):
                other = _HEADER.match(lines[end])
                if other and len(other.group(1)) <= level:
                    break
                end += 1
            return Section(index, end, level)
    return None


def _header_line(header: str) -> str:
    header = header.strip()
    return header if _HEADER.match(header) else f"## {header}"


def _join(*parts: str) -> str:
    return "\n\n".join(p.strip("\n") for p in parts if p.strip())


def _body(content: str, header: str) -> str:
    """The section body; a model often repeats the section's header as its first line."""
    lines = content.strip("\n").split("\n")
    first = _HEADER.match(lines[0])
    if first and _normalise(first.group(2)) == _normalise(header):
        lines = lines[1:]
    return "\n".join(lines).strip("\n")


def apply(notes: str, operation: str, *, content: str = "", header: str = "") -> str:
    """Return the notes after `operation`; raises NotesError when it cannot apply."""
    if operation == "read":
        return notes
    if operation in ("overwrite", "append", "prepend") and not content.strip():
        # An edit that forgot its content must not wipe the notes or report a change.
        raise NotesError(f"{operation} needs content (delete_all_notes clears the notes)")
    if operation == "overwrite":
        return content.strip("\n")
    if operation == "append":
        return _join(notes, content)
    if operation == "prepend":
        return _join(content, notes)
    if operation == "delete_all_notes":
        return ""
    if operation in ("replace_section_by_header", "delete_section_by_header"):
        if not header.strip():
            raise NotesError(f"{operation} needs a header")
        lines = notes.split("\n")
        section = find_section(lines, header)
        if operation == "delete_section_by_header":
            if section is None:
                raise NotesError(f"no section with header {header.strip()!r}")
            kept = lines[: section.start] + lines[section.end :]
            return "\n".join(kept).strip("\n")
        body = _body(content, header)
        if section is None:
            return _join(notes, _header_line(header) + "\n" + body)
        new_lines = [body] if body else []
        if section.end < len(lines):
            new_lines.append("")
        replaced = lines[: section.start + 1] + new_lines + lines[section.end :]
        return "\n".join(replaced).strip("\n")
    raise NotesError(f"unknown operation {operation!r}; use one of {', '.join(OPERATIONS)}")
