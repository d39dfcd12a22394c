"""The long-term notes operations (memchat.notes): pure functions on Markdown."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator

import pytest

from memchat import notes
from memchat.notes import apply as notes_apply
from tests.utils.cpu import cpu_per_call

DOC = "\n".join(
    [
        "# Ada",
        "Intro line",
        "",
        "## Profile",
        "Name: Ada",
        "### Family",
        "- brother Tom",
        "",
        "## Preferences",
        "- tea",
    ]
)


def test_operations_are_the_tools_enum() -> None:
    assert notes.OPERATIONS == (
        "read",
        "overwrite",
        "append",
        "prepend",
        "replace_section_by_header",
        "delete_section_by_header",
        "delete_all_notes",
    )


def test_read_returns_the_notes_unchanged() -> None:
    assert notes.apply(DOC, "read") == DOC
    assert notes.apply("", "read") == ""


def test_overwrite_replaces_everything_and_trims_blank_lines() -> None:
    assert notes.apply(DOC, "overwrite", content="\n\nnew notes\n\n") == "new notes"


def test_append_and_prepend_separate_with_one_blank_line() -> None:
    assert notes.apply("a", "append", content="b") == "a\n\nb"
    assert notes.apply("a\n\n", "append", content="\nb\n") == "a\n\nb"
    assert notes.apply("a", "prepend", content="b") == "b\n\na"
    assert notes.apply("", "append", content="first") == "first"
    assert notes.apply("   ", "prepend", content="first") == "first"


@pytest.mark.parametrize("operation", ["overwrite", "append", "prepend"])
@pytest.mark.parametrize("content", ["", "  \n "])
def test_edits_without_content_are_refused(operation: str, content: str) -> None:
    with pytest.raises(notes.NotesError, match=f"{operation} needs content"):
        notes.apply(DOC, operation, content=content)


def test_delete_all_notes_empties_them() -> None:
    assert notes.apply(DOC, "delete_all_notes") == ""


def test_a_section_runs_to_the_next_header_of_the_same_or_higher_level() -> None:
    lines = DOC.split("\n")
    profile = notes.find_section(lines, "Profile")
    assert profile == notes.Section(start=3, end=8, level=2)
    family = notes.find_section(lines, "Family")
    assert family == notes.Section(start=5, end=8, level=3)
    top = notes.find_section(lines, "Ada")
    assert top == notes.Section(start=0, end=10, level=1)
    assert notes.find_section(lines, "Hobbies") is None


@pytest.mark.parametrize(
    "header", ["Profile", "profile", "## Profile", "#### PROFILE", "  Profile  ", "## Profile ##"]
)
def test_headers_match_whatever_the_level_case_and_spacing(header: str) -> None:
    assert notes.find_section(DOC.split("\n"), header) == notes.Section(3, 8, 2)


def test_header_text_spacing_is_normalised() -> None:
    lines = ["##   Work   projects  ##", "x"]
    assert notes.find_section(lines, "work projects") == notes.Section(0, 2, 2)


def test_not_headers() -> None:
    # No space after the hashes, seven hashes, or indented text: not a header.
    lines = ["#Profile", "####### Profile", "Profile"]
    assert notes.find_section(lines, "Profile") is None


def test_replace_section_keeps_the_header_and_the_rest() -> None:
    result = notes.apply(DOC, "replace_section_by_header", header="Profile", content="Name: A. L.")
    assert result == "# Ada\nIntro line\n\n## Profile\nName: A. L.\n\n## Preferences\n- tea"


def test_replace_the_last_section() -> None:
    result = notes.apply(DOC, "replace_section_by_header", header="Preferences", content="- coffee")
    assert result == DOC.replace("- tea", "- coffee")


def test_replace_a_subsection_only() -> None:
    result = notes.apply(DOC, "replace_section_by_header", header="Family", content="- none")
    assert result == DOC.replace("- brother Tom", "- none")


def test_replace_does_not_repeat_the_header_the_content_starts_with() -> None:
    result = notes.apply(
        DOC, "replace_section_by_header", header="Preferences", content="## Preferences\n- coffee"
    )
    assert result == DOC.replace("- tea", "- coffee")
    added = notes.apply("x", "replace_section_by_header", header="Pets", content="## pets\n- cat")
    assert added == "x\n\n## Pets\n- cat"


def test_replace_with_empty_content_leaves_an_empty_section() -> None:
    result = notes.apply(DOC, "replace_section_by_header", header="Profile", content="")
    assert result == "# Ada\nIntro line\n\n## Profile\n\n## Preferences\n- tea"


def test_replace_of_a_missing_section_appends_it() -> None:
    assert notes.apply("a", "replace_section_by_header", header="Pets", content="- cat") == (
        "a\n\n## Pets\n- cat"
    )
    assert notes.apply("", "replace_section_by_header", header="### Pets", content="- cat") == (
        "### Pets\n- cat"
    )


def test_delete_section_removes_it_with_its_subsections() -> None:
    assert notes.apply(DOC, "delete_section_by_header", header="Profile") == (
        "# Ada\nIntro line\n\n## Preferences\n- tea"
    )
    assert notes.apply(DOC, "delete_section_by_header", header="preferences") == (
        "# Ada\nIntro line\n\n## Profile\nName: Ada\n### Family\n- brother Tom"
    )
    assert notes.apply(DOC, "delete_section_by_header", header="Ada") == ""


def test_delete_of_a_missing_section_is_an_error() -> None:
    with pytest.raises(notes.NotesError, match="no section with header 'Hobbies'"):
        notes.apply(DOC, "delete_section_by_header", header=" Hobbies ")


@pytest.mark.parametrize("operation", ["replace_section_by_header", "delete_section_by_header"])
@pytest.mark.parametrize("header", ["", "   "])
def test_section_operations_need_a_header(operation: str, header: str) -> None:
    with pytest.raises(notes.NotesError, match=f"{operation} needs a header"):
        notes.apply(DOC, operation, header=header, content="x")


def test_unknown_operation_lists_the_valid_ones() -> None:
    with pytest.raises(notes.NotesError, match="unknown operation 'shrink'; use one of read, "):
        notes.apply(DOC, "shrink")


def test_crlf_notes_still_find_their_sections() -> None:
    text = "## A\r\na\r\n## B\r\nb"
    assert notes.apply(text, "delete_section_by_header", header="A") == "## B\r\nb"


# ------------------------------------------------------- header parsing

# The header rule as a regex, as notes.py had it: the reference parse_header
# must agree with. It backtracks quadratically on a long line of #s or blanks.
_OLD_HEADER = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")


def _by_regex(line: str) -> notes.Header | None:
    match = _OLD_HEADER.match(line)
    return notes.Header(len(match.group(1)), match.group(2)) if match else None


def _lines(alphabet: str, longest: int) -> Iterator[str]:
    for length in range(longest + 1):
        for chars in itertools.product(alphabet, repeat=length):
            yield "".join(chars)


def test_parse_header_agrees_with_the_regex_it_replaced_on_every_short_line() -> None:
    """Attacks the linear parse: every line of up to 7 characters over #,
    space, tab, a letter and a newline, and every run of 0 to 8 #s before
    lines of up to 5 such characters (the level bound, closing #s, blank-only
    text, a final newline), parse as the old regex matched them."""
    alphabet = "# \ta\n"
    lines = set(_lines(alphabet, 7))
    lines |= {"#" * hashes + rest for hashes in range(9) for rest in _lines(alphabet, 5)}
    lines |= {"## Work   projects  ##", "## A\r", "# \r", "#\u00a0x", "### x ## y ##\t"}
    differing = [line for line in sorted(lines) if notes.parse_header(line) != _by_regex(line)]
    assert differing == []


@pytest.mark.parametrize(
    "pathological",
    [
        lambda n: "# a" + "#" * n + "b",  # closing #s that turn out not to close
        lambda n: "# " + " " * n + "b" + " " * n + "c",  # blanks, then text again
    ],
    ids=["hashes", "blanks"],
)
def test_a_long_header_line_costs_linear_time(pathological: Callable[[int], str]) -> None:
    """Attacks the header parse with lines the old regex took quadratic time
    on (a 32 KB one: seconds of CPU), through each place a header is parsed:
    the notes' lines, the content's first line and the header argument.
    Python's re counts no steps, so CPU time it is: 10x the line must cost
    about 10x (quadratic: about 100x); the bound is wide to absorb noise."""

    def work(n: int) -> Callable[[], object]:
        line = pathological(n)
        return lambda: notes.apply(
            line, "replace_section_by_header", content=line + "\nbody", header=line
        )

    small, large = cpu_per_call(work(2_000)), cpu_per_call(work(20_000))
    assert large / small < 30


SECTIONS = "## Drinks\n- tea\n## Places\n- Oslo"


@pytest.mark.parametrize(
    ("notes", "operation", "content", "expected"),
    [
        ("- likes tea", "append", "- likes tea", "- likes tea"),
        ("- likes tea", "append", "-  Likes TEA ", "- likes tea"),
        ("- likes tea", "append", "- likes tea\n- lives in Oslo", "- likes tea\n\n- lives in Oslo"),
        ("- likes tea", "prepend", "- likes tea", "- likes tea"),
        # Only the section the content joins counts: the last one for append,
        # what comes before the first header for prepend.
        (SECTIONS, "append", "- tea", SECTIONS + "\n\n- tea"),
        (SECTIONS, "append", "- Oslo", SECTIONS),
        ("- intro\n## Drinks\n- tea", "prepend", "- tea", "- tea\n\n- intro\n## Drinks\n- tea"),
        ("- intro\n## Drinks\n- tea", "prepend", "- intro", "- intro\n## Drinks\n- tea"),
    ],
)  # fmt: skip
def test_an_append_or_prepend_of_lines_already_there_adds_only_the_new_ones(
    notes: str, operation: str, content: str, expected: str
) -> None:
    assert notes_apply(notes, operation, content=content) == expected
