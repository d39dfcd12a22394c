"""LongMemEval's retrieval metrics, as the paper defines them, for memchat's recall.

A question's haystack is a list of sessions, each a list of turns; some
sessions hold the evidence (`answer_session_ids`), some turns are marked
`has_answer`. memchat recalls *exchanges*: a user message with the answer it
got. So an exchange here is a user turn and the assistant turns after it up
to the next user turn, named (session id, index of its user turn); an
exchange is evidence when one of its turns has `has_answer`. An evidence
turn with no user turn before it in its session belongs to no exchange: it
can never be recalled, and it still counts against recall_all.

Metrics (abstention questions, `_abs`, are left out, as in the paper):

- session level, sessions ranked by their best recalled exchange (the order
  in which they first appear among the hits): recall_any@5 (an answer
  session among the top 5), recall_all@5, recall_all@10 (every answer
  session among the top k), ndcg_any@10 (answer sessions relevant, binary);
- exchange level, over the ranked hits: recall_any@3 (memchat's default k),
  recall_any@5, recall_all@10 (every evidence exchange among the top 10).

And one of memchat's own, for knowledge-update questions (their two answer
sessions: a fact and its later update): newest_first, 1 when the newest
answer session is among the top 10 sessions ahead of the older one
(`newest_first`, the `newest_line` under the table).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Exchange = tuple[str, int]  # (haystack session id, index of its user turn)

METRICS = (
    "session_recall_any@5",
    "session_recall_all@5",
    "session_recall_all@10",
    "ndcg_any@10",
    "turn_recall_any@3",
    "turn_recall_any@5",
    "turn_recall_all@10",
)


@dataclass(frozen=True)
class Question:
    id: str
    type: str
    date: str
    text: str
    answer_sessions: frozenset[str]
    evidence: frozenset[Exchange]  # the exchanges holding a has_answer turn
    unreachable_evidence: int  # has_answer turns that belong to no exchange
    # A knowledge update's latest answer session (by haystack date), else None.
    newest_answer: str | None = None

    @property
    def abstention(self) -> bool:
        return self.id.endswith("_abs")


def exchanges_of(session: Sequence[Mapping[str, Any]]) -> list[tuple[int, list[int]]]:
    """A session's exchanges: (the user turn's index, the indexes of its turns)."""
    found: list[tuple[int, list[int]]] = []
    for index, turn in enumerate(session):
        if turn["role"] == "user":
            found.append((index, [index]))
        elif found:
            found[-1][1].append(index)
    return found


def question_of(record: Mapping[str, Any]) -> Question:
    """A LongMemEval record's question and its evidence."""
    evidence: set[Exchange] = set()
    unreachable = 0
    for session_id, session in zip(
        record["haystack_session_ids"], record["haystack_sessions"], strict=True
    ):
        covered: set[int] = set()
        for user_index, turns in exchanges_of(session):
            covered.update(turns)
            if any(session[t].get("has_answer") for t in turns):
                evidence.add((session_id, user_index))
        unreachable += sum(
            1 for i, turn in enumerate(session) if turn.get("has_answer") and i not in covered
        )
    answer = frozenset(record["answer_session_ids"])
    dated = sorted(
        (date, session_id)
        for session_id, date in zip(
            record["haystack_session_ids"], record["haystack_dates"], strict=True
        )
        if session_id in answer
    )
    updated = record["question_type"] == "knowledge-update" and len(dated) > 1
    return Question(
        id=record["question_id"],
        type=record["question_type"],
        date=record["question_date"],
        text=record["question"],
        answer_sessions=answer,
        evidence=frozenset(evidence),
        unreachable_evidence=unreachable,
        newest_answer=dated[-1][1] if updated else None,
    )


def ranked_sessions(hits: Sequence[Exchange]) -> list[str]:
    """Sessions in the order their best exchange was recalled."""
    seen: list[str] = []
    for session_id, _ in hits:
        if session_id not in seen:
            seen.append(session_id)
    return seen


def newest_first(question: Question, hits: Sequence[Exchange]) -> float | None:
    """For a knowledge update: 1.0 when its newest answer session is among
    the top 10 sessions and ahead of every other answer session there, else
    0.0; None for any other question."""
    if question.newest_answer is None:
        return None
    top = ranked_sessions(hits)[:10]
    if question.newest_answer not in top:
        return 0.0
    ahead = top[: top.index(question.newest_answer)]
    return float(not question.answer_sessions & set(ahead))


def newest_line(scored: Iterable[Scored]) -> str:
    """How often a knowledge update's newest answer session came first
    (abstention questions left out, as in the table)."""
    updates = [
        s.metrics["newest_first"]
        for s in scored
        if "newest_first" in s.metrics and not s.question.abstention
    ]
    if not updates:
        return "knowledge updates: none among the questions"
    return (
        f"knowledge updates: the newest answer session ahead of the older one in"
        f" {sum(updates):.0f} of {len(updates)} questions ({statistics.fmean(updates):.3f})"
    )


def _ndcg(ranked: Sequence[str], relevant: frozenset[str], k: int) -> float:
    dcg = sum(1 / math.log2(i + 2) for i, s in enumerate(ranked[:k]) if s in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(len(relevant), k)))
    return dcg / ideal if ideal else 0.0


def score(question: Question, hits: Sequence[Exchange]) -> dict[str, float]:
    """The question's metrics for the ranked hits (best first)."""
    sessions = ranked_sessions(hits)
    answer = question.answer_sessions

    def sessions_any(k: int) -> float:
        return float(bool(answer & set(sessions[:k])))

    def sessions_all(k: int) -> float:
        return float(bool(answer) and answer <= set(sessions[:k]))

    newest = newest_first(question, hits)
    return {
        **({} if newest is None else {"newest_first": newest}),
        "session_recall_any@5": sessions_any(5),
        "session_recall_all@5": sessions_all(5),
        "session_recall_all@10": sessions_all(10),
        "ndcg_any@10": _ndcg(sessions, answer, 10),
        **reach(question, hits, {}),  # the exchange level: the hits alone
    }


REACH = ("turn_recall_any@3", "turn_recall_any@5", "turn_recall_all@10")


def reach(
    question: Question,
    hits: Sequence[Exchange],
    neighbours: Mapping[Exchange, Sequence[Exchange]],
) -> dict[str, float]:
    """The exchange-level metrics over the top k hits and each one's
    `neighbours`: with none, LongMemEval's (`score`); with the exchanges each
    hit brings into the prompt (those before and after it in its session),
    how much evidence reaches the model."""
    evidence = question.evidence
    complete = question.unreachable_evidence == 0

    def shown(k: int) -> set[Exchange]:
        found = set(hits[:k])
        for hit in hits[:k]:
            found.update(neighbours.get(hit, ()))
        return found

    return {
        "turn_recall_any@3": float(bool(evidence & shown(3))),
        "turn_recall_any@5": float(bool(evidence & shown(5))),
        "turn_recall_all@10": float(complete and bool(evidence) and evidence <= shown(10)),
    }


@dataclass(frozen=True)
class Scored:
    question: Question
    metrics: dict[str, float]
    ms: float  # the recall's latency


def table(scored: Iterable[Scored]) -> tuple[list[str], list[list[str]]]:
    """Per question type and overall (abstention questions left out): the mean
    of each metric, the count, and recall latency p50/p95 ms; last, each
    overall mean's 95% bootstrap interval (`intervals`)."""
    kept = [s for s in scored if not s.question.abstention]
    groups: dict[str, list[Scored]] = {}
    for item in kept:
        groups.setdefault(item.question.type, []).append(item)
    headers = ["question type", "n", *METRICS, "p50 ms", "p95 ms"]
    rows = [_row(name, groups[name]) for name in sorted(groups)]
    rows.append(_row("overall", kept))
    spans = intervals(kept)
    rows.append(
        ["overall, 95% interval", str(len(kept))]
        + [f"{spans[m][0]:.3f}-{spans[m][1]:.3f}" for m in METRICS]
        + ["-", "-"]
    )
    return headers, rows


def intervals(
    kept: Sequence[Scored], *, resamples: int = 2000, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """Each metric's 95% bootstrap interval of the mean over `kept` (bootstrap_spans)."""
    return bootstrap_spans([s.metrics for s in kept], METRICS, resamples=resamples, seed=seed)


def bootstrap_spans(
    scores: Sequence[Mapping[str, float]],
    metrics: Sequence[str],
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """Each metric's 95% percentile-bootstrap interval of the mean over the
    questions' `scores`: the questions drawn again with replacement
    `resamples` times (seeded, so a rerun prints the same). How far a figure
    could move on another split of the same size: with 95 questions one
    question is 0.011."""
    if not scores:
        return {m: (0.0, 0.0) for m in metrics}
    rng = random.Random(seed)
    n = len(scores)
    draws = [[rng.randrange(n) for _ in range(n)] for _ in range(resamples)]
    spans = {}
    for metric in metrics:
        values = [s[metric] for s in scores]
        means = sorted(math.fsum(values[i] for i in draw) / n for draw in draws)
        spans[metric] = (means[int(0.025 * resamples)], means[math.ceil(0.975 * resamples) - 1])
    return spans


def _row(name: str, items: Sequence[Scored]) -> list[str]:
    means = [statistics.fmean(s.metrics[m] for s in items) if items else 0.0 for m in METRICS]
    p50, p95 = percentiles([s.ms for s in items])
    return [name, str(len(items)), *(f"{m:.3f}" for m in means), f"{p50:.1f}", f"{p95:.1f}"]


def percentiles(values: Sequence[float]) -> tuple[float, float]:
    """(p50, p95), nearest rank; (0, 0) for none."""
    if not values:
        return 0.0, 0.0
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

    return rank(0.50), rank(0.95)


def summary_line(scored: Iterable[Scored]) -> str:
    """The run's last line: `questions=<n> session_recall_any@5=<x> ... p95_ms=<x>`."""
    kept = [s for s in scored if not s.question.abstention]
    parts = [f"questions={len(kept)}"]
    for metric in METRICS:
        value = statistics.fmean(s.metrics[metric] for s in kept) if kept else 0.0
        parts.append(f"{metric}={value:.3f}")
    parts.append(f"p95_ms={percentiles([s.ms for s in kept])[1]:.1f}")
    return " ".join(parts)
