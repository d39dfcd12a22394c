"""LoCoMo's retrieval scores, kept apart from the benchmark's I/O so that a
hand-made fixture checks them (tests/unit/test_locomo_scoring.py).

A conversation is imported as a chat: speaker_a as the user, speaker_b as
the assistant. An exchange is what memchat recalls as one hit: a user turn
and the assistant turns after it up to the next user turn, or an assistant
turn no user turn came before (it opens its session). A question's evidence
is dia_ids ("D3:7"); a hit shows the dia_ids of its exchange. For k = 3, 5,
10: recall_any@k (an evidence turn among the top k hits' turns) and
recall_all@k (every one of them), per category (1 multi-hop, 2 temporal, 3
open-domain, 4 single-hop; 5, adversarial, is left out as the paper leaves
it out of retrieval) and per speaker of the evidence ("user": all of it said
by speaker_a, "assistant": all by speaker_b, "both"), with 95% bootstrap
intervals (longmemeval_scoring.intervals), and plain BM25 over the same
exchanges beside.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.bench.longmemeval_scoring import bootstrap_spans, percentiles

KS = (3, 5, 10)
METRICS = tuple(f"{kind}@{k}" for kind in ("any", "all") for k in KS)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
SUMMARY = ("any@3", "any@5", "any@10", "all@5", "all@10")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int  # its session's number (session_N)
    index: int  # its place in the session
    role: str  # "user" (speaker_a) | "assistant" (speaker_b)
    text: str  # the turn's text, with its photo's caption when it has one


@dataclass(frozen=True)
class Question:
    conversation: str
    text: str
    category: int
    evidence: frozenset[str]  # the dia_ids the conversation has
    speaker: str  # "user" | "assistant" | "both"


@dataclass(frozen=True)
class Conversation:
    id: str
    sessions: list[tuple[datetime, list[Turn]]]
    questions: list[Question] = field(default_factory=list)

    def exchanges(self) -> list[list[Turn]]:
        """Every exchange, in order: a user turn and its answers, or an
        assistant turn that opens its session."""
        found: list[list[Turn]] = []
        for _, turns in self.sessions:
            opened = False
            for turn in turns:
                if turn.role == "user" or not opened:
                    found.append([turn])
                    opened = True
                else:
                    found[-1].append(turn)
        return found

    def after_the_last(self) -> datetime:
        """Just after its last session (a turn a second, as imported)."""
        start, turns = self.sessions[-1]
        return start + timedelta(seconds=len(turns) + 60)


def session_time(text: str) -> datetime:
    """LoCoMo's session dates ("1:56 pm on 8 May, 2023"), as UTC."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


_DIA_ID = re.compile(r"D:?(\d+):0*(\d+)")


def dia_ids(evidence: Iterable[str]) -> list[str]:
    """The dia_ids an evidence list names, its malformed entries read as meant
    ("D8:6; D9:17", "D:11:26", "D30:05")."""
    return [f"D{s}:{t}" for item in evidence for s, t in _DIA_ID.findall(str(item))]


def turn_text(turn: Mapping[str, Any]) -> str:
    """A turn's text, and its photo's caption as the turn's words."""
    text = str(turn.get("text") or "").strip()
    caption = str(turn.get("blip_caption") or "").strip()
    return f"{text} [photo: {caption}]".strip() if caption else text


def conversation_of(record: Mapping[str, Any]) -> Conversation:
    """A LoCoMo record as its sessions of turns and its questions of
    categories 1-4 with evidence."""
    conv = record["conversation"]
    numbers = sorted(
        int(key.split("_")[1])
        for key, value in conv.items()
        if re.fullmatch(r"session_\d+", key) and isinstance(value, list) and value
    )
    sessions = []
    speakers: dict[str, str] = {}
    for number in numbers:
        turns = []
        for index, turn in enumerate(conv[f"session_{number}"]):
            role = "user" if turn["speaker"] == conv["speaker_a"] else "assistant"
            text = turn_text(turn)
            if not text:
                continue
            turns.append(Turn(turn["dia_id"], number, index, role, text))
            speakers[turn["dia_id"]] = role
        sessions.append((session_time(conv[f"session_{number}_date_time"]), turns))
    questions = []
    for qa in record["qa"]:
        category = int(qa.get("category", 0))
        evidence = frozenset(d for d in dia_ids(qa.get("evidence", [])) if d in speakers)
        if category not in CATEGORIES or not evidence:
            continue
        said = {speakers[d] for d in evidence}
        speaker = said.pop() if len(said) == 1 else "both"
        questions.append(
            Question(record["sample_id"], str(qa["question"]), category, evidence, speaker)
        )
    return Conversation(record["sample_id"], sessions, questions)


def score(question: Question, hits: Sequence[Sequence[str]]) -> dict[str, float]:
    """Each metric for one question; `hits`: the ranked exchanges' dia_ids."""
    metrics = {}
    for k in KS:
        shown = {d for hit in hits[:k] for d in hit}
        metrics[f"any@{k}"] = float(bool(question.evidence & shown))
        metrics[f"all@{k}"] = float(question.evidence <= shown)
    return metrics


# ------------------------------------------------------------------ BM25

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# A short English stop list (what any plain BM25 leaves out).
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "if",
        "of",
        "to",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "about",
        "as",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "do",
        "does",
        "did",
        "have",
        "has",
        "had",
        "i",
        "me",
        "my",
        "we",
        "our",
        "you",
        "your",
        "he",
        "him",
        "his",
        "she",
        "her",
        "it",
        "its",
        "they",
        "them",
        "their",
        "this",
        "that",
        "these",
        "those",
        "what",
        "which",
        "who",
        "whom",
        "when",
        "where",
        "why",
        "how",
        "not",
        "no",
        "so",
        "too",
        "very",
        "can",
        "will",
        "just",
        "would",
        "should",
        "could",
        "there",
        "here",
        "from",
        "up",
        "out",
        "than",
        "then",
        "into",
        "over",
    ]
)


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


class BM25:
    """Okapi BM25 (k1 = 1.2, b = 0.75) over a conversation's exchanges."""

    def __init__(self, documents: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.terms = [Counter(words(d)) for d in documents]
        self.lengths = [sum(t.values()) for t in self.terms]
        self.average = statistics.fmean(self.lengths) if self.lengths else 0.0
        frequency: Counter[str] = Counter()
        for terms in self.terms:
            frequency.update(terms.keys())
        n = len(documents)
        self.idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in frequency.items()}

    def ranked(self, query: str, k: int) -> list[int]:
        """The indexes of the k best documents for `query`, best first."""
        asked = set(words(query))
        scores = []
        for index, (terms, length) in enumerate(zip(self.terms, self.lengths, strict=True)):
            value = 0.0
            for w in asked & terms.keys():
                tf = terms[w]
                norm = tf + self.k1 * (1 - self.b + self.b * length / (self.average or 1))
                value += self.idf[w] * tf * (self.k1 + 1) / norm
            if value > 0:
                scores.append((value, -index))
        scores.sort(reverse=True)
        return [-i for _, i in scores[:k]]


def bm25_hits(conversation: Conversation, k: int) -> dict[str, list[list[str]]]:
    """Each question's top k exchanges by BM25, as dia_ids."""
    exchanges = conversation.exchanges()
    index = BM25([" ".join(t.text for t in e) for e in exchanges])
    return {
        q.text: [[t.dia_id for t in exchanges[i]] for i in index.ranked(q.text, k)]
        for q in conversation.questions
    }


# ------------------------------------------------------------------ tables


@dataclass(frozen=True)
class Scored:
    question: Question
    metrics: dict[str, float]  # memchat's
    baseline: dict[str, float]  # BM25's
    ms: float  # the search's own time, server-side
    total_ms: float  # with the query's embedding


def _means(items: Sequence[Scored], attribute: str) -> dict[str, float]:
    return {
        m: statistics.fmean(getattr(s, attribute)[m] for s in items) if items else 0.0
        for m in METRICS
    }


def table(scored: Sequence[Scored]) -> tuple[list[str], list[list[str]]]:
    """Per category, per speaker of the evidence and overall: memchat's mean
    of each metric and BM25's beside it ("memchat / bm25"), the count; then
    memchat's overall 95% bootstrap intervals and BM25's."""
    groups: list[tuple[str, list[Scored]]] = []
    for category, name in CATEGORIES.items():
        groups.append(
            (f"{category} {name}", [s for s in scored if s.question.category == category])
        )
    for speaker in ("user", "assistant", "both"):
        groups.append((f"said by {speaker}", [s for s in scored if s.question.speaker == speaker]))
    groups.append(("overall", list(scored)))
    headers = ["questions", "n", *(f"{m} memchat / bm25" for m in METRICS)]
    rows = []
    for name, items in groups:
        ours, theirs = _means(items, "metrics"), _means(items, "baseline")
        rows.append([name, str(len(items)), *(f"{ours[m]:.3f} / {theirs[m]:.3f}" for m in METRICS)])
    for label, attribute in (("memchat", "metrics"), ("bm25", "baseline")):
        spans = bootstrap_spans([getattr(s, attribute) for s in scored], METRICS)
        rows.append(
            [f"overall, 95% interval, {label}", str(len(scored))]
            + [f"{spans[m][0]:.3f}-{spans[m][1]:.3f}" for m in METRICS]
        )
    return headers, rows


def wins_and_losses(scored: Sequence[Scored], metric: str) -> tuple[int, int]:
    """Questions where memchat finds the evidence and BM25 does not, and the reverse."""
    won = sum(1 for s in scored if s.metrics[metric] > s.baseline[metric])
    lost = sum(1 for s in scored if s.metrics[metric] < s.baseline[metric])
    return won, lost


def latency_line(scored: Sequence[Scored]) -> str:
    p50, p95 = percentiles([s.ms for s in scored])
    t50, t95 = percentiles([s.total_ms for s in scored])
    return (
        f"search: server-side p50 {p50:.1f} ms, p95 {p95:.1f} ms;"
        f" with the query's embedding p50 {t50:.1f} ms, p95 {t95:.1f} ms"
    )


def summary_line(scored: Sequence[Scored]) -> str:
    """The run's last line: `locomo questions=<n> any@3=<x> ... p95_ms=<x>`."""
    means = _means(scored, "metrics")
    parts = [f"locomo questions={len(scored)}"]
    parts += [f"{m}={means[m]:.3f}" for m in SUMMARY]
    parts.append(f"p95_ms={percentiles([s.ms for s in scored])[1]:.1f}")
    return " ".join(parts)
