"""The LoCoMo scorer (tests/bench/locomo_scoring.py) and the benchmark's
import shape (tests/bench/bench_locomo.py) on a hand-made conversation whose
every figure is worked out by hand below. No LoCoMo record is in the
repository: the fixture is made up, in LoCoMo's format."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.bench.bench_locomo import to_import
from tests.bench.locomo_scoring import (
    BM25,
    Scored,
    bm25_hits,
    conversation_of,
    dia_ids,
    score,
    session_time,
    summary_line,
    table,
    wins_and_losses,
)

RECORD = {
    "sample_id": "conv-x",
    "conversation": {
        "speaker_a": "Ana",
        "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ana", "dia_id": "D1:1", "text": "Hi Ben! I adopted a dog, Rex."},
            {"speaker": "Ben", "dia_id": "D1:2", "text": "Great! I started pottery."},
            {"speaker": "Ana", "dia_id": "D1:3", "text": "Thanks, Ben!"},
            {"speaker": "Ben", "dia_id": "D1:4", "text": "See you."},
        ],
        "session_2_date_time": "10:04 am on 9 June, 2023",
        "session_2": [
            {
                "speaker": "Ben",
                "dia_id": "D2:1",
                "text": "Look at my vase!",
                "blip_caption": "a blue ceramic vase",
            },
            {"speaker": "Ana", "dia_id": "D2:2", "text": "Lovely. Rex chewed my shoes."},
            {"speaker": "Ben", "dia_id": "D2:3", "text": "Oh no."},
        ],
    },
    "qa": [
        {"question": "What pet did Ana adopt?", "evidence": ["D1:1"], "category": 4},
        {"question": "What did Ben make?", "evidence": ["D2:1; D1:2"], "category": 1},
        {"question": "When did Rex chew shoes?", "evidence": ["D:2:02", "D1:1"], "category": 2},
        {"question": "Is Ana a cat person?", "evidence": ["D1:1"], "category": 5},
        {"question": "Something unknowable?", "evidence": [], "category": 3},
        {"question": "Evidence missing", "evidence": ["D9:9"], "category": 3},
    ],
}


def test_the_conversation_is_read_as_sessions_exchanges_and_questions() -> None:
    conversation = conversation_of(RECORD)
    assert [start for start, _ in conversation.sessions] == [
        datetime(2023, 5, 8, 13, 56, tzinfo=UTC),
        datetime(2023, 6, 9, 10, 4, tzinfo=UTC),
    ]
    # A user turn with the assistant turns after it; an assistant turn that
    # opens its session is an exchange of its own.
    assert [[t.dia_id for t in e] for e in conversation.exchanges()] == [
        ["D1:1", "D1:2"],
        ["D1:3", "D1:4"],
        ["D2:1"],
        ["D2:2", "D2:3"],
    ]
    # Category 5 and questions without (known) evidence are left out.
    assert [(q.category, sorted(q.evidence), q.speaker) for q in conversation.questions] == [
        (4, ["D1:1"], "user"),
        (1, ["D1:2", "D2:1"], "assistant"),
        (2, ["D1:1", "D2:2"], "user"),
    ]
    photo = conversation.sessions[1][1][0]
    assert photo.text == "Look at my vase! [photo: a blue ceramic vase]"
    assert photo.role == "assistant"


def test_malformed_evidence_and_dates_are_read_as_meant() -> None:
    assert dia_ids(["D8:6; D9:17", "D:11:26", "D30:05"]) == ["D8:6", "D9:17", "D11:26", "D30:5"]
    assert session_time("12:09 am on 13 October, 2023") == datetime(2023, 10, 13, 0, 9, tzinfo=UTC)


def test_the_import_dates_each_turn_and_names_each_exchange() -> None:
    conversation = conversation_of(RECORD)
    document, exchange_at = to_import(conversation)
    first, second = document["sessions"]
    assert [(m["role"], m["created_at"]) for m in first["messages"]] == [
        ("user", "2023-05-08T13:56:00+00:00"),
        ("assistant", "2023-05-08T13:56:01+00:00"),
        ("user", "2023-05-08T13:56:02+00:00"),
        ("assistant", "2023-05-08T13:56:03+00:00"),
    ]
    assert second["messages"][0]["role"] == "assistant"
    assert exchange_at == {
        (first["id"], "2023-05-08T13:56:00+00:00"): ["D1:1", "D1:2"],
        (first["id"], "2023-05-08T13:56:02+00:00"): ["D1:3", "D1:4"],
        (second["id"], "2023-06-09T10:04:00+00:00"): ["D2:1"],
        (second["id"], "2023-06-09T10:04:01+00:00"): ["D2:2", "D2:3"],
    }
    assert conversation.after_the_last() == datetime(2023, 6, 9, 10, 5, 3, tzinfo=UTC)


def test_any_and_all_count_the_dia_ids_the_top_hits_show() -> None:
    pet, made, when = conversation_of(RECORD).questions
    hits = [["D1:3", "D1:4"], ["D2:2", "D2:3"], ["D2:1"], ["D1:1", "D1:2"]]
    assert score(pet, hits) == {
        "any@3": 0.0, "any@5": 1.0, "any@10": 1.0,
        "all@3": 0.0, "all@5": 1.0, "all@10": 1.0,
    }  # fmt: skip
    # D2:1 is third, D1:2 fourth: any from 3 on, all from 5 on.
    assert score(made, hits)["any@3"] == 1.0 and score(made, hits)["all@3"] == 0.0
    assert score(made, hits)["all@5"] == 1.0
    assert score(when, [])["any@10"] == 0.0


def test_bm25_ranks_rare_words_over_common_ones() -> None:
    index = BM25(["rex rex dog", "ben ben ben", "ben vase", "ben rex"])
    # "vase" is in one document, "ben" in three: the vase one wins, then the
    # others holding ben, the one saying it three times first; the one
    # without either is not ranked.
    assert index.ranked("ben vase", 10) == [2, 1, 3]
    assert index.ranked("nothing here", 10) == []
    conversation = conversation_of(RECORD)
    ranked = bm25_hits(conversation, 2)
    # "make" is in none: "ben" decides, and plain BM25 puts the shortest
    # exchange naming him first, a thank-you.
    assert ranked["What did Ben make?"] == [["D1:3", "D1:4"], ["D1:1", "D1:2"]]


@pytest.fixture
def scored() -> list[Scored]:
    pet, made, when = conversation_of(RECORD).questions

    def metrics(hit: float) -> dict[str, float]:
        return {f"{kind}@{k}": hit for kind in ("any", "all") for k in (3, 5, 10)}

    return [
        Scored(pet, metrics(1.0), metrics(0.0), 2.0, 10.0),
        Scored(made, metrics(0.0), metrics(1.0), 4.0, 12.0),
        Scored(when, metrics(1.0), metrics(1.0), 6.0, 14.0),
    ]


def test_the_table_puts_bm25_beside_each_group(scored: list[Scored]) -> None:
    headers, rows = table(scored)
    assert headers[:3] == ["questions", "n", "any@3 memchat / bm25"]
    by_name = {row[0]: row for row in rows}
    assert by_name["1 multi-hop"][1:3] == ["1", "0.000 / 1.000"]
    assert by_name["said by user"][1:3] == ["2", "1.000 / 0.500"]
    assert by_name["said by assistant"][1:3] == ["1", "0.000 / 1.000"]
    assert by_name["said by both"][1:3] == ["0", "0.000 / 0.000"]
    assert by_name["overall"][1:3] == ["3", "0.667 / 0.667"]
    low, high = by_name["overall, 95% interval, memchat"][2].split("-")
    assert 0.0 <= float(low) <= 0.667 <= float(high) <= 1.0
    assert wins_and_losses(scored, "any@5") == (1, 1)


def test_the_summary_line_has_the_documented_shape(scored: list[Scored]) -> None:
    assert summary_line(scored) == (
        "locomo questions=3 any@3=0.667 any@5=0.667 any@10=0.667 all@5=0.667 all@10=0.667"
        " p95_ms=6.0"
    )
