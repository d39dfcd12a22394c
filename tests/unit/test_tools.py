"""The manage_long_term_memory tool (memchat.model.tools): schema and run()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from memchat import notes
from memchat.model import tools
from tests.utils.cpu import cpu_per_call


def test_schema_is_an_openai_function_tool_with_every_operation() -> None:
    schema = tools.TOOL_SCHEMA
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == tools.TOOL_NAME == "manage_long_term_memory"
    parameters = function["parameters"]
    assert parameters["required"] == ["operation"]
    assert parameters["additionalProperties"] is False
    assert parameters["properties"]["operation"]["enum"] == [
        *notes.OPERATIONS,
        *tools.MEMORY_OPERATIONS,
    ]
    assert set(parameters["properties"]) == {"operation", "content", "header"}


def test_read_returns_the_notes_and_no_edit() -> None:
    assert tools.run({"operation": "read"}, "## A\na", 100) == ("## A\na", None)
    assert tools.run({"operation": "read"}, "", 100) == ("(no notes yet)", None)


def test_an_edit_reports_the_new_length_and_can_be_replayed() -> None:
    result, edit = tools.run({"operation": "append", "content": "- b"}, "- a", 100)
    assert result == "ok: notes updated (8 characters)"
    assert edit == tools.NoteEdit("append", "- b", "")
    # Replayed on notes that changed meanwhile (store conflict), it still applies.
    assert edit.apply("- a\n- c") == "- a\n- c\n\n- b"


def test_section_edits_carry_their_header() -> None:
    arguments = {"operation": "replace_section_by_header", "header": "A", "content": "new"}
    _, edit = tools.run(arguments, "## A\nold", 100)
    assert edit is not None and edit.apply("## A\nolder\n## B\nb") == "## A\nnew\n\n## B\nb"


def test_limit_is_inclusive() -> None:
    result, edit = tools.run({"operation": "overwrite", "content": "x" * 10}, "", 10)
    assert edit is not None and result == "ok: notes updated (10 characters)"
    result, edit = tools.run({"operation": "append", "content": "y"}, "x" * 8, 10)
    assert edit is None
    assert result.startswith("error: the notes would be 11 characters, over the limit of 10;")


def test_shrinking_notes_over_the_limit_is_allowed() -> None:
    # Notes stored under a larger limit can still be condensed.
    result, edit = tools.run({"operation": "overwrite", "content": "short"}, "x" * 50, 10)
    assert edit is not None and result == "ok: notes updated (5 characters)"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "error: unknown operation ''"),
        ({"operation": "forget"}, "error: unknown operation 'forget'"),
        ({"operation": "append", "content": 5}, "error: content and header must be strings"),
        (
            {"operation": "delete_section_by_header", "header": ["A"]},
            "error: content and header must be strings",
        ),
        ({"operation": "delete_section_by_header", "header": "Z"}, "error: no section with header"),
        ({"operation": "append", "content": None}, "error: append needs content"),
    ],
)
def test_errors_are_returned_as_text_never_raised(arguments: dict[str, Any], message: str) -> None:
    result, edit = tools.run(arguments, "## A\na", 100)
    assert edit is None
    assert result.startswith(message)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            # Stripped, this would be a short section: it is refused as sent.
            {"operation": "replace_section_by_header", "header": "A", "content": "\n" * 20 + "b"},
            "error: the content is 21 characters, over the notes limit of 10; send a shorter",
        ),
        (
            {"operation": "delete_section_by_header", "header": "A" + " " * 20},
            "error: the header is 21 characters, over the notes limit of 10; send a shorter",
        ),
    ],
    ids=["content", "header"],
)
def test_arguments_over_the_limit_are_refused_as_sent(
    arguments: dict[str, Any], message: str
) -> None:
    """Attacks the order of the checks: the limit applies to the content and
    header the model sent, before they are parsed, not only to the notes an
    edit would leave (which here would fit)."""
    result, edit = tools.run(arguments, "## A\na", 10)
    assert edit is None
    assert result.startswith(message)


def test_an_over_long_header_line_is_refused_without_parsing_it() -> None:
    """Attacks the limit's place with header lines that are costly to parse
    (closing #s that do not close; the old regex took quadratic time): over
    the limit, the call costs the same whatever their length, as nothing
    parses them. Python's re counts no steps, so CPU time it is, with a wide
    bound: 10x the line must not cost 10x, let alone 100x."""

    def work(n: int) -> Callable[[], object]:
        line = "# a" + "#" * n + "b"
        arguments = {"operation": "replace_section_by_header", "header": "a", "content": line}
        return lambda: tools.run(arguments, "## A\na", 1_000)

    small, large = cpu_per_call(work(2_000)), cpu_per_call(work(20_000))
    assert large / small < 5
