"""README.md as a new user reads it: every link leads to a file of this
repository (docs/api.md is the contract), and the shell examples run as
written, in order: no variable is used before an example defines it.

The checks are plain functions, tested here on small made-up READMEs too,
so a check that stopped finding anything would fail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

FENCE = re.compile(r"^(```+|~~~+)([^\n`]*)\n(.*?)^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]+)>")
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
SHELLS = {"sh", "bash", "shell", "console"}
# Variables the shell has before any example runs.
ENVIRONMENT = {"HOME", "PATH", "PWD", "USER", "SHELL", "TMPDIR"}


# ---------------------------------------------------------------- links


def without_code(markdown: str) -> str:
    """The text with fenced blocks and inline code blanked (same lengths)."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    return INLINE_CODE.sub(blank, FENCE.sub(blank, markdown))


def links(markdown: str) -> list[str]:
    """Every link target of the text, outside code, in order."""
    text = without_code(markdown)
    found: list[tuple[int, str]] = []
    for pattern in (LINK, REFERENCE, AUTOLINK, HTML_LINK):
        found += [(m.start(), m.group(1)) for m in pattern.finditer(text)]
    return [target for _, target in sorted(found)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_~]|<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    result: set[str] = set()
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", markdown), re.M):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def link_problems(markdown: str, document: Path, root: Path) -> list[str]:
    """What is wrong with the links of `document` (its text `markdown`):
    a relative link must name an existing file inside `root` (an anchor in a
    Markdown file must be one of its headings); an absolute one may only be
    a web page, never a copy of a document (`.md`) kept elsewhere."""
    problems = []
    for target in links(markdown):
        if SCHEME.match(target) or target.startswith("//"):
            url = urlsplit(target)
            if url.scheme not in ("http", "https") or not url.netloc:
                problems.append(f"{target}: not a web page (link to a file in the repository)")
            elif url.path.lower().endswith((".md", ".markdown")):
                problems.append(f"{target}: a document outside the repository (keep it in docs/)")
            continue
        path_part, _, anchor = target.partition("#")
        if not path_part:
            if anchor not in anchors(markdown):
                problems.append(f"{target}: no such heading")
            continue
        path = (document.parent / unquote(path_part)).resolve()
        if not path.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
            continue
        if not path.is_file():
            problems.append(f"{target}: no such file in the repository")
            continue
        if anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            problems.append(f"{target}: no heading #{anchor} in {path.relative_to(root)}")
    return problems


# ------------------------------------------------------- shell examples


@dataclass
class Example:
    line: int  # in the README
    code: str


def examples(markdown: str) -> list[Example]:
    """The shell the reader is shown, in reading order: fenced sh/bash
    blocks, and inline commands (`curl ...`, `NAME=...`) in the prose and
    tables."""
    found: list[tuple[int, str]] = []
    for match in FENCE.finditer(markdown):
        if match.group(2).strip().lower() in SHELLS:
            found.append((match.start(3), match.group(3)))
    outside = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), markdown)
    for match in INLINE_CODE.finditer(outside):
        code = match.group(2).strip()
        if code.startswith("curl ") or re.match(r"[A-Z_][A-Z0-9_]*=", code):
            found.append((match.start(2), code))
    return [Example(markdown.count("\n", 0, pos) + 1, code) for pos, code in sorted(found)]


@dataclass
class _Frame:
    kind: str  # top | sub ($(...)) | paren ((...)) | dq ("...") | sq ('...')
    at_start: bool = True  # a word here may be an assignment
    assigning: bool = False  # in a command's leading assignments (A=1 B=2 cmd)
    pending: list[str] = field(default_factory=list)


def shell_events(code: str) -> list[tuple[str, str, int]]:
    """("use" | "define", NAME, offset) in the order a shell meets them: an
    assignment takes effect at the end of its command (and not at all in a
    subshell); nothing expands inside single quotes; $(...) nests."""
    events: list[tuple[str, str, int]] = []
    frames = [_Frame("top")]

    def end_command(frame: _Frame, at: int) -> None:
        if frame.kind == "top":
            events.extend(("define", name, at) for name in frame.pending)
        frame.pending.clear()
        frame.at_start, frame.assigning = True, False

    def word(frame: _Frame) -> None:
        if frame.at_start:  # the command's name: the assignments are over
            frame.assigning = False
        frame.at_start = False

    i = 0
    while i < len(code):
        ch, frame = code[i], frames[-1]
        if frame.kind == "sq":
            if ch == "'":
                frames.pop()
            i += 1
            continue
        if ch == "\\":
            i += 2
            continue
        if ch == "$":
            named = re.match(r"\$\{?([A-Za-z_]\w*)", code[i:])
            if code.startswith("$(", i):
                if frame.kind != "dq":
                    word(frame)
                frames.append(_Frame("sub"))
                i += 2
                continue
            if named:
                events.append(("use", named.group(1), i))
                if frame.kind != "dq":
                    word(frame)
                i += named.end()
                continue
        if frame.kind == "dq":
            if ch == '"':
                frames.pop()
            i += 1
            continue
        # Unquoted: at the top, or inside $(...) or (...).
        if frame.at_start:
            assignment = re.match(r"(?:export\s+)?([A-Za-z_]\w*)=", code[i:])
            if assignment:
                frame.pending.append(assignment.group(1))
                frame.at_start, frame.assigning = False, True
                i += assignment.end()
                continue
        if ch == "#" and (i == 0 or code[i - 1].isspace()):
            while i < len(code) and code[i] != "\n":
                i += 1
        elif ch in ";|&\n":
            end_command(frame, i)
            i += 1
        elif ch == ")" and frame.kind in ("sub", "paren"):
            frames.pop()
            i += 1
        elif ch.isspace():
            frame.at_start = frame.at_start or frame.assigning
            i += 1
        else:
            word(frame)
            if ch in "'\"(":
                frames.append(_Frame({"'": "sq", '"': "dq", "(": "paren"}[ch]))
            i += 1
    end_command(frames[0], len(code))
    return events


def configured(markdown: str) -> set[str]:
    """The variables of the README's Configuration table: the reader's to set."""
    names = set()
    for row in re.findall(r"^\|\s*(`[^|]*)\|", markdown, re.M):
        names |= set(re.findall(r"`([A-Z][A-Z0-9_]*)`", row))
    return names


def undefined_variables(markdown: str) -> list[str]:
    """Each variable an example uses before an earlier one (or itself) defines it."""
    defined = ENVIRONMENT | configured(markdown)
    problems = []
    for example in examples(markdown):
        for kind, name, at in shell_events(example.code):
            if kind == "define":
                defined.add(name)
            elif name not in defined:
                line = example.line + example.code.count("\n", 0, at)
                problems.append(f"line {line}: ${name} used before it is defined")
    return problems


# ------------------------------------------------------------- the README


def test_every_link_of_the_readme_is_a_file_of_the_repository() -> None:
    text = README.read_text()
    assert links(text), "no links found: the parser is broken"
    assert link_problems(text, README, ROOT) == []


def test_the_readme_names_its_contract_in_the_repository() -> None:
    targets = [t.partition("#")[0] for t in links(README.read_text())]
    assert "docs/api.md" in targets
    assert (ROOT / "docs" / "api.md").is_file()


def test_every_shell_variable_of_the_examples_is_defined_before_use() -> None:
    text = README.read_text()
    used = {name for e in examples(text) for kind, name, _ in shell_events(e.code) if kind == "use"}
    assert {"H", "J", "SID", "TOKEN"} <= used, used  # the examples were found
    assert undefined_variables(text) == []


def test_setting_up_is_two_commands() -> None:
    text = README.read_text()
    section = text.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    block = next(m.group(3) for m in FENCE.finditer(section))
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    assert [c for c in commands if c] == ["bash infra/dev.sh", "bash infra/test.sh"]


# ------------------------------------------------------- the checks work


def test_link_problems_finds_links_out_of_the_repository(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "api.md").write_text("# API\n\n## Streamed answers (SSE)\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "contract.md").write_text("# Contract\n")
    readme = root / "README.md"
    text = (
        "# Title\n\n"
        "[ok](docs/api.md) [anchor](docs/api.md#streamed-answers-sse) [self](#title)\n"
        "[up](../shared/contract.md) [gone](docs/nope.md) [bad](docs/api.md#nope)\n"
        "[web](https://example.com/guide) [copy](https://example.com/x/api.md)\n"
        "[file](file:///etc/passwd) <https://example.org/contract.md>\n"
        '<a href="../shared/contract.md">html</a>\n\n'
        "[ref]: ../shared/contract.md\n\n"
        "`[in code](../shared/contract.md)`\n"
        "```md\n[in a block](../shared/contract.md)\n```\n"
    )
    problems = link_problems(text, readme, root)
    flagged = [p.split(":")[0] for p in problems]
    assert flagged == [
        "../shared/contract.md",
        "docs/nope.md",
        "docs/api.md#nope",
        "https",  # https://example.com/x/api.md
        "file",
        "https",  # <https://example.org/contract.md>
        "../shared/contract.md",
        "../shared/contract.md",
    ], problems


def test_undefined_variables_follows_the_reading_order() -> None:
    text = (
        "```sh\n"
        'H="Authorization: Bearer $(memchat token)"; J=x\n'
        'curl -s "localhost:8000/chat/export/$SID" -H "$H"  # SID: not yet\n'
        "```\n\n"
        "| endpoint | example |\n| --- | --- |\n"
        '| `GET /x` | `curl -s "localhost:8000/x/$MID" -H "$H"` |\n'
        '| `POST /y` | `curl -s localhost:8000/y -d \'{"id": "$QUOTED"}\' -H "$J"` |\n\n'
        "```sh\n"
        "SID=$(curl -s localhost:8000/chat -H \"$H\" | python -c 'import sys; print(1)')\n"
        'MID=${SID}; echo "$MID $SID $HOME ${LATER:-x}"\n'
        "LATER=1\n"
        "```\n"
    )
    assert undefined_variables(text) == [
        "line 3: $SID used before it is defined",
        "line 8: $MID used before it is defined",
        "line 13: $LATER used before it is defined",
    ]


def test_shell_events_in_order() -> None:
    def events(code: str) -> list[tuple[str, str]]:
        return [(kind, name) for kind, name, _ in shell_events(code)]

    assert events('A=1; B="$A" C=\'$D\' && echo $B ${C} $(echo "$E") # $F') == [
        ("define", "A"),
        ("use", "A"),
        ("define", "B"),
        ("define", "C"),
        ("use", "B"),
        ("use", "C"),
        ("use", "E"),
    ]
    assert events('X=$(curl -H "$X")') == [("use", "X"), ("define", "X")]
    # Assignments in a subshell stay there; after a command's name, A=1 is an argument.
    assert events("(A=1); echo $(B=2) env C=3; echo $A$B$C") == [
        ("use", "A"),
        ("use", "B"),
        ("use", "C"),
    ]
