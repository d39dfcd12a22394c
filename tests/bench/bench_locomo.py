"""LoCoMo through memchat's own recall: how often it finds the evidence, with
plain BM25 over the same exchanges beside it.

For each conversation of a LoCoMo file (default: the 5-conversation dev split,
../shared/eval/locomo_dev.json.gz from the project root; any other file of
that format with --data):

1. a fresh user (auth.users) and its token;
2. its sessions sent to POST /sessions/import as a client would: speaker_a
   as the user, speaker_b as the assistant, each turn dated by its session's
   `date_time`, a second apart in order, a photo's caption kept as text of
   its turn;
3. the embedding backfill run (what the summary worker runs in production)
   until GET /sessions/import/status says recall is ready;
4. each question of categories 1-4 sent to GET /memory/search (k=10, as_of
   just after the last session): the same embedding, statement and rules a
   chat turn's recall uses.

Scores (tests/bench/locomo_scoring.py): evidence recall_any@k and
recall_all@k over dia_ids for k = 3, 5, 10, per category, per speaker of the
evidence and overall, memchat's and BM25's side by side, with both overall
figures' 95% bootstrap intervals and the questions won and lost against
BM25; search latency p50/p95, server-side (Server-Timing `recall`) and with
the query's embedding (Server-Timing `embedding`: through the embeddings
cache, so a rerun's embedding is a lookup). Embeddings come from the local
all-MiniLM-L6-v2 server behind the caching proxy, as for bench_longmemeval.py.

    python tests/bench/bench_locomo.py
    python tests/bench/bench_locomo.py --set memory_recall_words=false   # A/B
    python tests/bench/bench_locomo.py --data other.json.gz --verbose

The records are read from the file by path and never copied into the
repository (LoCoMo's licence: evaluation only). The last line is the run's
summary: `locomo questions=<n> any@3=<x> any@5=<x> any@10=<x> all@5=<x>
all@10=<x> p95_ms=<x>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

from tests.bench import _common as common
from tests.bench.bench_longmemeval import (
    Product,
    _iso,
    authorization,
    expire_and_clean,
    expire_argument,
    load,
    memory_footprint,
    product,
    product_arguments,
    server_timing,
    until_recall_ready,
)
from tests.bench.locomo_scoring import (
    Conversation,
    Scored,
    bm25_hits,
    conversation_of,
    latency_line,
    score,
    summary_line,
    table,
    wins_and_losses,
)

DEFAULT_DATA = common.REPO_ROOT.parent / "shared" / "eval" / "locomo_dev.json.gz"
DEFAULT_CACHE = common.REPO_ROOT / ".memchat" / "bench" / "locomo-embeddings.sqlite"
NAMESPACE = uuid.UUID("6c6f636f-6d6f-6d65-6d63-686174000000")
K = 10


def to_import(
    conversation: Conversation,
) -> tuple[dict[str, Any], dict[tuple[str, str], list[str]]]:
    """The conversation in the plain import shape, and which recalled (session
    uuid, message time) is which exchange (its dia_ids)."""
    sessions = []
    stored_as = {dia_id: place for place, dia_id in turn_at(conversation).items()}
    for _, turns in conversation.sessions:
        if not turns:
            continue
        messages = []
        for turn in turns:
            sid, at = stored_as[turn.dia_id]
            messages.append({"role": turn.role, "content": turn.text, "created_at": at})
        sessions.append({"id": sid, "messages": messages})
    exchange_at = {
        stored_as[exchange[0].dia_id]: [t.dia_id for t in exchange]
        for exchange in conversation.exchanges()
    }
    return {"sessions": sessions}, exchange_at


def turn_at(conversation: Conversation) -> dict[tuple[str, str], str]:
    """Each turn's dia_id by where it is stored: (session uuid, its time,
    the session's date and time plus its index in seconds)."""
    found: dict[tuple[str, str], str] = {}
    for start, turns in conversation.sessions:
        if not turns:
            continue
        sid = str(uuid.uuid5(NAMESPACE, f"{conversation.id}/{turns[0].session}"))
        for turn in turns:
            found[(sid, (start + timedelta(seconds=turn.index)).isoformat())] = turn.dia_id
    return found


def session_any(question: Any, hits: Sequence[list[str]], k: int) -> float:
    """--expire's measure: 1 when a session of the evidence is among the
    sessions of the top k hits (a dia_id "D3:7" is session D3's)."""
    wanted = {dia_id.split(":")[0] for dia_id in question.evidence}
    shown = {dia_id.split(":")[0] for hit in hits[:k] for dia_id in hit}
    return float(bool(wanted & shown))


async def search(
    memchat: Product, auth: Mapping[str, str], question: str, as_of: datetime
) -> tuple[list[dict[str, Any]], float, float]:
    """GET /memory/search of a question: the hits, the search's own
    milliseconds and the query's embedding's (Server-Timing)."""
    found = await memchat.api.get(
        "/memory/search",
        params={"q": question, "k": K, "as_of": as_of.isoformat()},
        headers=auth,
    )
    if found.status_code != 200:
        raise SystemExit(f"search {found.status_code} {found.text[:300]}")
    header = found.headers["server-timing"]
    return found.json()["hits"], server_timing(header), server_timing(header, "embedding")


async def run(args: argparse.Namespace) -> None:
    conversations = [conversation_of(r) for r in load(args.data)][: args.conversations or None]
    async with product(args) as memchat:
        scored: list[Scored] = []
        sessions_found: list[float] = []
        imported_messages = 0
        started = time.monotonic()
        for conversation in conversations:
            user_id = common.create_user(memchat.admin).user_id
            auth = authorization(user_id)
            document, exchange_at = to_import(conversation)
            turns = turn_at(conversation)
            imported = await memchat.api.post(
                "/sessions/import",
                content=json.dumps(document).encode(),
                headers={**auth, "content-type": "application/json"},
            )
            if imported.status_code != 200:
                raise SystemExit(f"{conversation.id}: import {imported.status_code}")
            imported_messages += int(imported.json()["imported_messages"])
            await until_recall_ready(memchat, auth)
            if args.expire:
                expire_and_clean(memchat, user_id)
            baseline = bm25_hits(conversation, K)
            as_of = conversation.after_the_last()
            for question in conversation.questions:
                found, ms, embed_ms = await search(memchat, auth, question.text, as_of)
                # A memory is its turn's (exchange_at has the exchanges').
                places = [(h["session_id"], _iso(h["created_at"])) for h in found]
                hits = [exchange_at.get(place, [turns[place]]) for place in places]
                sessions_found.append(session_any(question, hits, 5))
                scored.append(
                    Scored(
                        question,
                        score(question, hits),
                        score(question, baseline[question.text]),
                        ms,
                        ms + embed_ms,
                    )
                )
                if args.verbose:
                    print(
                        question.conversation,
                        question.category,
                        question.speaker,
                        json.dumps(question.text),
                        sorted(question.evidence),
                        hits[:5],
                        scored[-1].metrics["any@5"],
                        scored[-1].baseline["any@5"],
                    )
            print(
                f"... {conversation.id}: {len(conversation.questions)} questions,"
                f" {time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
        settings = memchat.settings
        print(common.machine_report(memchat.admin, memchat.target))
        print(
            f"model {settings.openai_embedding_model} ({settings.embedding_dimensions}"
            f" dimensions), k={K}, MEMORY_RECALL_MIN_SCORE={settings.memory_recall_min_score},"
            f" MEMORY_RECALL_WORDS={settings.memory_recall_words},"
            f" MEMORY_RECALL_TIME={settings.memory_recall_time},"
            f" MEMORY_RECALL_FACTS={settings.memory_recall_facts}; data {args.data.name};"
            f" embeddings cache {memchat.cache.hits} hits, {memchat.cache.misses} misses"
        )
        print(memory_footprint(memchat, imported_messages))
        headers, rows = table(scored)
        print(common.format_table(headers, rows))
        for metric in ("any@5", "all@10"):
            won, lost = wins_and_losses(scored, metric)
            print(f"{metric} against BM25: {won} questions won, {lost} lost")
        print(latency_line(scored))
        expired = " (--expire: every transcript expired and deleted first)" if args.expire else ""
        print(
            "session any@5 (an evidence session among the top 5 hits')"
            f" {sum(sessions_found) / max(len(sessions_found), 1):.3f}{expired}"
        )
        print(summary_line(scored))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a LoCoMo JSON file")
    parser.add_argument("--conversations", type=int, default=0, help="only the first N (0: all)")
    product_arguments(parser, DEFAULT_CACHE)
    parser.add_argument("--verbose", action="store_true", help="a line per question")
    expire_argument(parser)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
