"""memchat.sse_reader: the one reader of Server-Sent Events, against the specification."""

from __future__ import annotations

import pytest

from memchat.sse_reader import Comment, Event, Item, SSEReader, UnknownLine

STREAM = (
    b"\xef\xbb\xbf: hello\r\n"
    b'event: start\r\ndata: {"a": 1}\r\n\r\n'
    b"data: line one \xc3\xa9\rdata: line two\r\r"
    b"id: 7\nevent: delta\ndata:no space\n\n"
    b"retry: 1500\ndata: after\n\n"
)
EXPECTED: list[Item] = [
    Comment("hello"),
    Event("start", b'{"a": 1}'),
    Event("message", "line one é\nline two".encode()),
    Event("delta", b"no space", id="7"),
    Event("message", b"after", id="7"),
]


def read(*chunks: bytes) -> list[Item]:
    reader = SSEReader()
    return [item for chunk in chunks for item in reader.feed(chunk)]


def test_a_whole_stream_at_once() -> None:
    reader = SSEReader()
    assert reader.between_events
    assert reader.feed(STREAM) == EXPECTED
    assert reader.between_events
    assert (reader.last_event_id, reader.retry_ms) == ("7", 1500)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7])
def test_chunks_split_anywhere_read_the_same(size: int) -> None:
    """Split inside the byte order mark, a CRLF, a field, a UTF-8 character."""
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert read(*chunks) == EXPECTED


def test_a_cr_at_a_chunks_end_waits_for_a_possible_lf() -> None:
    reader = SSEReader()
    assert reader.feed(b"data: x\r") == []
    assert reader.feed(b"\n") == []  # the LF of that CRLF: not a blank line
    assert reader.feed(b"\r\n") == [Event("message", b"x")]


def test_an_event_without_data_is_not_dispatched_and_its_name_is_forgotten() -> None:
    assert read(b"event: lonely\n\ndata: x\n\n") == [Event("message", b"x")]
    assert read(b"data:\n\n") == [Event("message", b"")]


def test_comments_are_handed_over_where_they_are() -> None:
    items = read(b": keep-alive\n\ndata: 1\n: inside\ndata: 2\n\n")
    assert items == [Comment("keep-alive"), Comment("inside"), Event("message", b"1\n2")]


def test_unknown_lines_are_reported_in_place_and_otherwise_ignored() -> None:
    items = read(b"data: before\n\n<html>\nfoo: bar\ndata\n\n")
    assert items == [
        Event("message", b"before"),
        UnknownLine(b"<html>"),
        UnknownLine(b"foo: bar"),
        UnknownLine(b"data"),
        Event("message", b""),  # `data` alone is an empty data field
    ]


def test_id_with_nul_and_retry_not_a_number_are_ignored() -> None:
    reader = SSEReader()
    reader.feed(b"id: 1\nretry: 10\n\nid: a\x00b\nretry: soon\ndata: x\n\n")
    assert (reader.last_event_id, reader.retry_ms) == ("1", 10)


def test_the_end_of_the_stream() -> None:
    reader = SSEReader()
    assert reader.feed(b"data: done\n\ndata: cut") == [Event("message", b"done")]
    assert not reader.between_events
    # Flushed: the last line ends, and so does its event (the specification drops it).
    assert reader.flush() == [Event("message", b"cut")]
    assert reader.between_events

    reader = SSEReader()
    reader.feed(b": last\n")
    assert not reader.between_events  # no blank line after it
    assert reader.flush() == []


def test_text_is_the_data_decoded() -> None:
    assert Event("message", "é".encode()).text == "é"
    assert Event("message", b"\xff").text == "\ufffd"
