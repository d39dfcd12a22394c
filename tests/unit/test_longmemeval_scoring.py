"""The LongMemEval scorer (tests/bench/longmemeval_scoring.py) on a hand-made
fixture whose every metric is worked out by hand below."""

from __future__ import annotations

import math

import pytest

from tests.bench.longmemeval_scoring import (
    METRICS,
    Scored,
    exchanges_of,
    intervals,
    newest_line,
    question_of,
    reach,
    score,
    summary_line,
    table,
)


def turn(role: str, evidence: bool = False) -> dict[str, object]:
    return {"role": role, "content": f"{role} says something", "has_answer": evidence}


def record(qid: str, qtype: str, sessions: dict[str, list[dict[str, object]]], answer: list[str]):
    return {
        "question_id": qid,
        "question_type": qtype,
        "question": "q?",
        "question_date": "2023/05/30 (Tue) 23:40",
        "answer": "a",
        "answer_session_ids": answer,
        "haystack_session_ids": list(sessions),
        "haystack_dates": ["2023/05/01 (Mon) 10:00"] * len(sessions),
        "haystack_sessions": list(sessions.values()),
    }


# Two answer sessions; the evidence is a user turn in each.
MULTI = record(
    "q1",
    "multi-session",
    {
        "s1": [turn("user", True), turn("assistant")],
        "s2": [turn("user"), turn("assistant"), turn("user", True), turn("assistant")],
        "s3": [turn("user"), turn("assistant"), turn("user"), turn("assistant")],
    },
    ["s1", "s2"],
)
# The evidence is the assistant's answer: its exchange is the user turn before it.
ASSISTANT = record(
    "q2",
    "single-session-assistant",
    {
        "a1": [turn("user"), turn("assistant", True), turn("user"), turn("assistant")],
        "a2": [turn("user"), turn("assistant"), turn("user"), turn("assistant")],
    },
    ["a1"],
)
# The evidence opens the session, before any user turn: no exchange holds it.
UNREACHABLE = record(
    "q3",
    "knowledge-update",
    {"b1": [turn("assistant", True), turn("user"), turn("assistant")]},
    ["b1"],
)
ABSTENTION = record("q4_abs", "multi-session", {"c1": [turn("user"), turn("assistant")]}, ["c1"])

HITS = {
    "q1": [("s3", 0), ("s1", 0), ("s3", 2), ("s2", 2)],
    "q2": [("a2", 0), ("a2", 2), ("a1", 2), ("a1", 0)],
    "q3": [("b1", 1)],
    "q4_abs": [],
}

EXPECTED = {
    # Sessions ranked s3, s1, s2: answer sessions at ranks 2 and 3.
    "q1": {
        "session_recall_any@5": 1.0,
        "session_recall_all@5": 1.0,
        "session_recall_all@10": 1.0,
        "ndcg_any@10": (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3)),
        "turn_recall_any@3": 1.0,  # (s1, 0) is second
        "turn_recall_any@5": 1.0,
        "turn_recall_all@10": 1.0,  # (s1, 0) and (s2, 2) both in
    },
    # Sessions ranked a2, a1; the evidence exchange (a1, 0) is fourth.
    "q2": {
        "session_recall_any@5": 1.0,
        "session_recall_all@5": 1.0,
        "session_recall_all@10": 1.0,
        "ndcg_any@10": 1 / math.log2(3),
        "turn_recall_any@3": 0.0,
        "turn_recall_any@5": 1.0,
        "turn_recall_all@10": 1.0,
    },
    # The session is found; its evidence cannot be, by any exchange.
    "q3": {
        "session_recall_any@5": 1.0,
        "session_recall_all@5": 1.0,
        "session_recall_all@10": 1.0,
        "ndcg_any@10": 1.0,
        "turn_recall_any@3": 0.0,
        "turn_recall_any@5": 0.0,
        "turn_recall_all@10": 0.0,
    },
}


def test_exchanges_are_user_turns_with_what_follows() -> None:
    assert exchanges_of(UNREACHABLE["haystack_sessions"][0]) == [(1, [1, 2])]
    assert exchanges_of(ASSISTANT["haystack_sessions"][0]) == [(0, [0, 1]), (2, [2, 3])]


def test_the_evidence_of_each_question() -> None:
    assert question_of(MULTI).evidence == {("s1", 0), ("s2", 2)}
    assert question_of(ASSISTANT).evidence == {("a1", 0)}
    unreachable = question_of(UNREACHABLE)
    assert unreachable.evidence == frozenset() and unreachable.unreachable_evidence == 1
    assert question_of(ABSTENTION).abstention


@pytest.mark.parametrize("fixture", [MULTI, ASSISTANT, UNREACHABLE], ids=["q1", "q2", "q3"])
def test_each_metric_of_each_question(fixture: dict[str, object]) -> None:
    question = question_of(fixture)
    assert score(question, HITS[question.id]) == pytest.approx(EXPECTED[question.id])


def test_the_overall_line_leaves_abstention_out() -> None:
    scored = [
        Scored(question_of(r), score(question_of(r), HITS[str(r["question_id"])]), ms)
        for r, ms in ((MULTI, 1.0), (ASSISTANT, 2.0), (UNREACHABLE, 3.0), (ABSTENTION, 99.0))
    ]
    ndcg = (EXPECTED["q1"]["ndcg_any@10"] + EXPECTED["q2"]["ndcg_any@10"] + 1.0) / 3
    assert summary_line(scored) == (
        "questions=3 session_recall_any@5=1.000 session_recall_all@5=1.000"
        f" session_recall_all@10=1.000 ndcg_any@10={ndcg:.3f} turn_recall_any@3=0.333"
        " turn_recall_any@5=0.667 turn_recall_all@10=0.667 p95_ms=3.0"
    )
    headers, rows = table(scored)
    assert headers[0] == "question type" and rows[-2][:2] == ["overall", "3"]
    assert [row[0] for row in rows] == [
        "knowledge-update",
        "multi-session",
        "single-session-assistant",
        "overall",
        "overall, 95% interval",
    ]
    # Every question found an answer session in the top 5: no interval to it.
    assert rows[-1][2] == "1.000-1.000"


def fixed(values: list[float]) -> list[Scored]:
    """Questions scoring `values` on every metric."""
    question = question_of(MULTI)
    return [Scored(question, dict.fromkeys(METRICS, v), 1.0) for v in values]


def test_the_intervals_bracket_the_mean_by_the_sample_size() -> None:
    half = intervals(fixed([1.0, 0.0] * 20))  # 40 questions, mean 0.5
    low, high = half["turn_recall_all@10"]
    # The binomial's: 0.5 +- 1.96 * sqrt(0.25 / 40) = 0.345-0.655.
    assert 0.30 < low < 0.40 and 0.60 < high < 0.70
    wider = intervals(fixed([1.0, 0.0] * 5))  # 10 questions: a wider interval
    assert wider["turn_recall_all@10"][1] - wider["turn_recall_all@10"][0] > high - low
    assert intervals(fixed([1.0] * 30))["session_recall_all@5"] == (1.0, 1.0)
    assert intervals(fixed([1.0, 0.0] * 20)) == half  # seeded: the same twice


def test_what_reaches_the_model_counts_each_hits_neighbours() -> None:
    question = question_of(MULTI)  # evidence ("s1", 0) and ("s2", 2)
    hits = [("s2", 0), ("x", 0), ("y", 0), ("s1", 0)]
    # The hits alone: s1's evidence is 4th, s2's is not recalled.
    assert reach(question, hits, {}) == {
        "turn_recall_any@3": 0.0,
        "turn_recall_any@5": 1.0,
        "turn_recall_all@10": 0.0,
    }
    # s2's first exchange brings the one after it, which holds the evidence.
    assert reach(question, hits, {("s2", 0): [("s2", 2)]}) == {
        "turn_recall_any@3": 1.0,
        "turn_recall_any@5": 1.0,
        "turn_recall_all@10": 1.0,
    }
    # A neighbour counts only with its hit inside the cut.
    assert reach(question, hits, {("s1", 0): [("s2", 2)]})["turn_recall_any@3"] == 0.0


def test_newest_first_asks_a_knowledge_updates_latest_session_to_rank_ahead() -> None:
    update = record(
        "q9",
        "knowledge-update",
        {"old": [turn("user", True)], "new": [turn("user", True)], "x": [turn("user")]},
        ["old", "new"],
    )
    update["haystack_dates"] = ["2023/05/01 (Mon) 10:00", "2023/05/20 (Sat) 09:00", "2023/05/02"]
    question = question_of(update)
    assert question.newest_answer == "new"
    assert score(question, [("x", 0), ("new", 0), ("old", 0)])["newest_first"] == 1.0
    assert score(question, [("old", 0), ("new", 0)])["newest_first"] == 0.0
    assert score(question, [("old", 0)])["newest_first"] == 0.0  # the update not found
    assert "newest_first" not in score(question_of(MULTI), [("s1", 0)])
    both = [
        Scored(question, score(question, hits), 1.0)
        for hits in ([("new", 0)], [("old", 0), ("new", 0)])
    ]
    assert newest_line(both) == (
        "knowledge updates: the newest answer session ahead of the older one in 1 of 2"
        " questions (0.500)"
    )
