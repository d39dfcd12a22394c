"""LongMemEval scores of a recall statement, replayed on a database a run left.

`bench_longmemeval.py` measures recall through the product (import, backfill,
GET /memory/search) in minutes. To try an idea for the ranking, this asks
the same questions again, straight to the database that run filled (a
disposable DATABASE_URL, e.g. a pgserver started by hand), in seconds: each
question's user (found by its haystack's first session), the question
embedded with the local all-MiniLM-L6-v2 model, its period read as the API
reads it (`as_of` the question's date), and then, as that user
(memchat_user with its claims, one transaction), a function with
memchat.recall's parameters: `memchat.recall` itself by default, or, with
`--replace OLD NEW` (repeatable), a copy of memchat.recall made with those
replacements in its source or in that of memchat.recall_hits, which builds
the hits' rows (as `memchat.recall_replayed` calling
`memchat.recall_hits_replayed`, both dropped afterwards). On the database of
a run the default gives that run's scores.

With `--misses`, for every question that misses session recall_all@5 or
exchange recall_all@10: each evidence exchange's rank by meaning (the exact
scan) and by words (the word list), 300 deep, and the exchanges the
statement returned.

With `--neighbours`, the exchange-level metrics also over what the prompt
shows: each hit with the exchange before it (memchat.recall's `before`),
then with the exchange after it as well (`after`); and what the recalled
exchanges of a turn (the default recall_k best) take in the memory block,
in gpt-4o's tokens, median and p95.

    DATABASE_URL=... python tests/bench/bench_longmemeval.py
    DATABASE_URL=... python tests/bench/bench_longmemeval_replay.py [--misses] [--neighbours]
    DATABASE_URL=... python tests/bench/bench_longmemeval_replay.py \\
        --replace '* 0.9 ^' '* 0.8 ^'
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

from memchat.config import Settings
from memchat.prompts.memory import recall_section
from tests.bench._common import format_table, percentile
from tests.bench.bench_longmemeval import DEFAULT_DATA, K, _iso, load, to_import
from tests.bench.bench_recall_pieces import PIECES, question_params
from tests.bench.longmemeval_scoring import (
    REACH,
    Exchange,
    Question,
    Scored,
    question_of,
    reach,
    score,
    summary_line,
    table,
)

DEEP = 300  # how far down --misses looks in each list
MISSED = ("session_recall_all@5", "turn_recall_all@10")
REPLAYED = "memchat.recall_replayed"
REPLAYED_HITS = "memchat.recall_hits_replayed"
CALL = (
    "select {}(auth.uid(), null, 'default', 0, %(q)s::extensions.vector, %(m)s, %(t)s, %(k)s,"
    " %(s)s, %(c)s, %(f)s, %(u)s)"
)


def _name(qualified: str) -> Any:
    from psycopg import sql

    return sql.Identifier(*qualified.split("."))


def replayed_function(conn: Any, replacements: Sequence[tuple[str, str]]) -> str:
    """A copy of memchat.recall with `replacements`, created as REPLAYED.

    The hits' rows are built by memchat.recall_hits (migration
    supabase/schemas/functions/recall.sql): it is copied too, as REPLAYED_HITS, which the copy of
    memchat.recall calls. Each OLD is replaced in whichever of the two holds it.
    """
    from psycopg import sql

    sources = {}
    for original, copy in (("memchat.recall_hits", REPLAYED_HITS), ("memchat.recall", REPLAYED)):
        (source,) = conn.execute("select pg_get_functiondef(%s::regproc)", (original,)).fetchone()
        sources[copy] = source.replace(f"FUNCTION {original}(", f"FUNCTION {copy}(", 1)
    sources[REPLAYED] = sources[REPLAYED].replace("memchat.recall_hits(", f"{REPLAYED_HITS}(")
    for old, new in replacements:
        held = [copy for copy, source in sources.items() if old in source]
        if not held:
            raise SystemExit(f"--replace: {old!r} is not in memchat.recall or memchat.recall_hits")
        for copy in held:
            sources[copy] = sources[copy].replace(old, new)
    drop_replayed(conn)
    for copy, source in sources.items():
        conn.execute(source)
        conn.execute(sql.SQL("grant execute on function {} to memchat_user").format(_name(copy)))
    return REPLAYED


def drop_replayed(conn: Any) -> None:
    from psycopg import sql

    for copy in (REPLAYED, REPLAYED_HITS):
        conn.execute(sql.SQL("drop function if exists {}").format(_name(copy)))


def exchanges_by_id(conn: Any, user_id: Any, exchange_at: Mapping[Any, Exchange]) -> dict[int, Any]:
    """The user's messages' ids -> their exchanges (as the run's import made them)."""
    rows = conn.execute(
        "select id, session_id::text, created_at from public.chat_message_history"
        " where user_id = %s and message->>'type' = 'human'",
        (user_id,),
    ).fetchall()
    found = {}
    for message_id, session_id, created_at in rows:
        exchange = exchange_at.get((session_id, _iso(created_at.isoformat())))
        if exchange is not None:
            found[message_id] = exchange
    return found


SHOWN = {
    "the hits (LongMemEval's metrics)": (),
    "+ the exchange before each": ("before",),
    "+ the exchange after each too (the prompt shows both)": ("before", "after"),
}
RECALL_K = Settings.model_fields["memory_recall_k"].default  # a turn's, by default
TOKENS = f"tokens at k={RECALL_K}, p50 / p95"


def shown_reach(
    question: Question,
    hits: Sequence[Exchange],
    found: Sequence[Mapping[str, Any]],
    ids: Mapping[int, Exchange],
) -> dict[str, dict[str, float]]:
    """For each of SHOWN: `reach` for the hits with those neighbours
    (memchat.recall's `before`, `after`), what the prompt shows while the
    token budget allows, and (TOKENS) the recall section the default k's
    best take in the memory block."""
    from dataclasses import replace

    from memchat.model.tokens import count_message, counter_for_model
    from memchat.store import Hit

    counter = counter_for_model("gpt-4o")
    best = [Hit.from_json(h) for h in found[:RECALL_K]]
    measured = {}
    for label, sides in SHOWN.items():
        neighbours = {
            hit: [ids[n["message_id"]] for n in (h.get(side) for side in sides) if n]
            for hit, h in zip(hits, found, strict=True)
        }
        shown = [
            replace(
                hit,
                before=hit.before if "before" in sides else None,
                after=hit.after if "after" in sides else None,
            )
            for hit in best
        ]
        tokens = count_message(counter, recall_section(shown)) if shown else 0
        measured[label] = {**reach(question, hits, neighbours), TOKENS: float(tokens)}
    return measured


def misses(
    question: Question, hits: Sequence[Exchange], meaning: Sequence[Any], words: Sequence[Any]
) -> str:
    """Where each evidence exchange ranks, and what was returned."""
    by_meaning = {exchange: rank for rank, exchange in enumerate(meaning, 1)}
    by_words = {exchange: rank for rank, exchange in enumerate(words, 1)}
    lines = [f"{question.id} ({question.type}): {question.text}"]
    lines.append(f"  answer sessions: {', '.join(sorted(question.answer_sessions))}")
    for exchange in sorted(question.evidence):
        returned = hits.index(exchange) + 1 if exchange in hits else None
        lines.append(
            f"  evidence {exchange[0]} #{exchange[1]}: by meaning {by_meaning.get(exchange)},"
            f" by words {by_words.get(exchange)}, returned {returned}"
        )
    lines.append("  returned: " + ", ".join(f"{s} #{i}" for s, i in hits))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a LongMemEval JSON file")
    parser.add_argument(
        "--replace",
        nargs=2,
        action="append",
        default=[],
        metavar=("OLD", "NEW"),
        help="replay a copy of memchat.recall with OLD replaced by NEW",
    )
    parser.add_argument("--misses", action="store_true", help="where the missed evidence ranks")
    parser.add_argument(
        "--neighbours",
        action="store_true",
        help="exchange recall over what the prompt shows: each hit with the exchange before it,"
        " then with the one after it too (as memchat shows them)",
    )
    parser.add_argument(
        "--min-score",
        type=float,
        help="MEMORY_RECALL_MIN_SCORE (default: all-MiniLM-L6-v2's floor, as the run's)",
    )
    args = parser.parse_args(argv)

    import psycopg
    from psycopg import sql

    from memchat.model import minilm
    from tests.utils.store_data import become

    url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL: the database bench_longmemeval.py filled")
    records = [r for r in load(args.data) if not question_of(r).abstention]
    vectors = minilm.load().embed([r["question"] for r in records])
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=None)
    function = replayed_function(conn, args.replace) if args.replace else "memchat.recall"
    call = sql.SQL(CALL).format(_name(function))
    scored: list[Scored] = []
    reached: list[dict[str, dict[str, float]]] = []
    reports: list[str] = []
    try:
        for record, vector in zip(records, vectors, strict=True):
            question = question_of(record)
            found_user = question_params(conn, record, vector)
            if found_user is None:
                continue  # not imported by the run on this database
            user_id, params = found_user
            params["k"] = K
            params["s"] = minilm.RECALL_MIN_SCORE if args.min_score is None else args.min_score
            _, exchange_at = to_import(record)
            with conn.transaction():
                become(conn, {"sub": str(user_id), "role": "authenticated"})
                started = time.perf_counter()
                (found,) = conn.execute(call, params).fetchone()
                ms = (time.perf_counter() - started) * 1000
                hits = [exchange_at[(h["session_id"], _iso(h["created_at"]))] for h in found]
                metrics = score(question, hits)
                scored.append(Scored(question, metrics, ms))
                missed = args.misses and any(metrics[name] < 1 for name in MISSED)
                if args.neighbours or missed:
                    ids = exchanges_by_id(conn, user_id, exchange_at)
                if args.neighbours:
                    reached.append(shown_reach(question, hits, found, ids))
                if missed:
                    deep = {**params, "d": DEEP}
                    (meaning,) = conn.execute(PIECES["nearest"], deep).fetchone()
                    (words,) = conn.execute(PIECES["words"], deep).fetchone()
                    reports.append(
                        misses(
                            question,
                            hits,
                            [ids.get(m) for m in meaning],
                            [ids.get(m) for m in words],
                        )
                    )
    finally:
        if function == REPLAYED:
            drop_replayed(conn)
    if not scored:
        raise SystemExit("no imported question found: run bench_longmemeval.py on DATABASE_URL")
    for report in reports:
        print(report)
    print(f"function: {function} {args.replace or ''}; latency: the statement from the client")
    print(format_table(*table(scored)))
    if reached:
        rows = []
        for label in SHOWN:
            tokens = [r[label][TOKENS] for r in reached]
            rows.append(
                [
                    label,
                    *(f"{statistics.fmean(r[label][m] for r in reached):.3f}" for m in REACH),
                    f"{percentile(tokens, 50):.0f} / {percentile(tokens, 95):.0f}",
                ]
            )
        print(format_table(["exchanges counted", *REACH, TOKENS], rows))
    print(summary_line(scored))


if __name__ == "__main__":
    main()
