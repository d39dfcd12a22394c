"""Long-term notes: one Markdown document per (user, agent).

The operations of the `manage_long_term_memory` tool, as pure functions on
the text. Sections are Markdown ATX headers; a section runs until the next
header of the same or a higher level.
"""

from __future__ import annotations

from dataclasses import dataclass

_BLANKS = " \t"
_CLOSING = " \t#"  # what may trail a header's text: spaces, tabs, closing #s

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


@dataclass(frozen=True)
class Header:
    level: int  # the number of #s, 1 to 6
    text: str  # what follows them, closing #s and trailing blanks dropped


def parse_header(line: str) -> Header | None:
    """The ATX header on `line`, or None: 1 to 6 #s, at least one space or
    tab, then the text, less any trailing spaces, tabs and closing #s (but
    never less than its first character).

    Linear in the line's length, where a backtracking regex for the same rule
    is quadratic on a long line of #s or blanks. It answers exactly what
    `^(#{1,6})[ \t]+(.+?)[ \t#]*$` matched before, oddities included ("#  "
    is a header whose text is one space), so stored notes keep their sections.
    """
    if line.endswith("\n"):  # `$` matched before one final newline
        line = line[:-1]
    if "\n" in line:
        return None
    text = line.lstrip("#")
    level = len(line) - len(text)
    if not 1 <= level <= 6:
        return None
    title = text.lstrip(_BLANKS)
    blanks = len(text) - len(title)
    if not blanks:
        return None
    if not title:
        # Only blanks after the #s: the text is the last blank, if one is left.
        return Header(level, text[-1]) if blanks > 1 else None
    kept = max(1, len(title.rstrip(_CLOSING)))
    return Header(level, title[:kept])


def _normalise(header: str) -> str:
    parsed = parse_header(header.strip())
    text = parsed.text if parsed else header.strip()
    return " ".join(text.split()).casefold()


def find_section(lines: list[str], header: str) -> Section | None:
    wanted = _normalise(header)
    for index, line in enumerate(lines):
        parsed = parse_header(line)
        if parsed and _normalise(parsed.text) == wanted:
            end = index + 1
            while end < len(lines):
                other = parse_header(lines[end])
                if other and other.level <= parsed.level:
                    break
                end += 1
            return Section(index, end, parsed.level)
    return None


def _header_line(header: str) -> str:
    header = header.strip()
    return header if parse_header(header) else f"## {header}"


def _join(*parts: str) -> str:
    return "\n\n".join(p.strip("\n") for p in parts if p.strip())


def _body(content: str, header: str) -> str:
    """The section body; a model often repeats the section's header as its first line."""
    lines = content.strip("\n").split("\n")
    first = parse_header(lines[0])
    if first and _normalise(first.text) == _normalise(header):
        lines = lines[1:]
    return "\n".join(lines).strip("\n")


def _same(line: str) -> str:
    return " ".join(line.split()).casefold()


def _new_lines(content: str, section: list[str]) -> str:
    """`content` less the lines the section it joins has already (compared
    without regard to case or spacing): "remember I like tea" said twice
    adds the line once."""
    present = {_same(line) for line in section if line.strip()}
    kept = [line for line in content.strip("\n").split("\n") if _same(line) not in present]
    return "\n".join(kept) if any(line.strip() for line in kept) else ""


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
        lines = notes.split("\n")
        headers = [i for i, line in enumerate(lines) if parse_header(line)]
        added = _new_lines(content, lines[headers[-1] :] if headers else lines)
        return _join(notes, added) if added else notes
    if operation == "prepend":
        lines = notes.split("\n")
        first = next((i for i, line in enumerate(lines) if parse_header(line)), len(lines))
        added = _new_lines(content, lines[:first])
        return _join(added, notes) if added else notes
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
