"""LongMemEval through memchat's own recall: how often it finds the evidence.

For each question of a LongMemEval file (default: the 101-question dev split
of LongMemEval_S, ../shared/eval/longmemeval_s_dev.json.gz from the project
root; any other file of that format with --data):

1. a fresh user (auth.users) and its token;
2. its haystack converted to memchat's plain import shape (one session per
   haystack session, each message dated by its session's date, a second
   apart in order) and sent to POST /sessions/import, as a client would;
3. the embedding backfill run (what the summary worker runs in production)
   until GET /sessions/import/status says recall is ready;
4. the question sent to GET /memory/search (k=10, as_of = the question's
   date): the same embedding, statement and rules a chat turn's recall uses.

Embeddings come from the local all-MiniLM-L6-v2 server (`memchat embeddings
serve`, started here in a thread) behind a caching proxy
(tests/bench/embedding_cache.py: SQLite keyed by model and the text's
sha256), which memchat reaches through its normal embeddings client
(EMBEDDING_BASE_URL): the first run over the dev split embeds ~23,000 texts
(an hour or more on 2 CPUs), a rerun reads them from the cache in minutes.

Scores (tests/bench/longmemeval_scoring.py; abstention questions left out),
per question type and overall, then each overall figure's 95% bootstrap
interval (how far it could move on another split this size); recall
latency is the search's own time as the API reports it (Server-Timing
`recall`), the query's embedding aside.
The import's speed (messages stored per second by POST /sessions/import,
embeddings aside: they come after, from the backfill) is printed too.

    python tests/bench/bench_longmemeval.py                      # the dev split
    python tests/bench/bench_longmemeval.py --questions 10       # a quick look
    python tests/bench/bench_longmemeval.py --set memory_recall_words=false   # A/B
    python tests/bench/bench_longmemeval.py --data other_split.json.gz --cache /tmp/x.sqlite

Fact keys written by a chat model (MEMORY_RECALL_FACTS=model): the
backfill asks the offline responder, which answers with the rule's
sentences (the path, not the quality), unless a real model is named:

    OPENAI_BASE_URL=https://... python tests/bench/bench_longmemeval.py \
        --set memory_recall_facts=model --set offline_model=0 \
        --set openai_api_key=$KEY --set openai_model=gpt-4o-mini

The run then prints the facts requests made and the tokens they took.

The last line is the run's summary, e.g.
`questions=95 session_recall_any@5=0.979 ... p95_ms=6.1`.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

from tests.bench import _common as common
from tests.bench.embedding_cache import EmbeddingCache
from tests.bench.longmemeval_scoring import (
    Exchange,
    Scored,
    newest_line,
    question_of,
    score,
    summary_line,
    table,
)

DEFAULT_DATA = common.REPO_ROOT.parent / "shared" / "eval" / "longmemeval_s_dev.json.gz"
DEFAULT_CACHE = common.REPO_ROOT / ".memchat" / "bench" / "longmemeval-embeddings.sqlite"
NAMESPACE = uuid.UUID("6c6f6e67-6d65-6d65-7661-6c0000000000")
K = 10


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        data: list[dict[str, Any]] = json.load(handle)
    return data


def haystack_time(text: str) -> datetime:
    """LongMemEval's dates ("2023/05/30 (Tue) 23:40"), as UTC."""
    day, _, clock = text.partition(" (")
    clock = clock.split(") ", 1)[1] if ") " in clock else "00:00"
    return datetime.strptime(f"{day} {clock}", "%Y/%m/%d %H:%M").replace(tzinfo=UTC)


def session_uuid(question_id: str, session_id: str) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, f"{question_id}/{session_id}")


def to_import(record: Mapping[str, Any]) -> tuple[dict[str, Any], dict[tuple[str, str], Exchange]]:
    """The question's haystack in the plain import shape, and which recalled
    (session uuid, message time) is which exchange (haystack session id,
    index of its user turn)."""
    sessions = []
    exchange_at: dict[tuple[str, str], Exchange] = {}
    for session_id, date, turns in zip(
        record["haystack_session_ids"],
        record["haystack_dates"],
        record["haystack_sessions"],
        strict=True,
    ):
        start = haystack_time(date)
        sid = session_uuid(record["question_id"], session_id)
        messages = []
        for index, turn in enumerate(turns):
            if not turn["content"].strip():
                continue
            at = (start + timedelta(seconds=index)).isoformat()
            messages.append({"role": turn["role"], "content": turn["content"], "created_at": at})
            if turn["role"] == "user":
                exchange_at[(str(sid), at)] = (session_id, index)
        if messages:
            sessions.append({"id": str(sid), "messages": messages})
    return {"sessions": sessions}, exchange_at


@dataclass
class Product:
    """memchat as a client reaches it, on a benchmark's database: the API
    in-process, the embedding backfill, the owner's connection."""

    target: Any  # common.Target
    admin: Any  # the owner's connection (autocommit)
    settings: Any
    api: Any  # tests.utils.api.ApiClient
    embedder: Any  # usecases.backfill.Embedder
    cache: EmbeddingCache


@asynccontextmanager
async def product(args: argparse.Namespace) -> AsyncIterator[Product]:
    """The database (embedded, or DATABASE_URL), the embeddings server (the
    local all-MiniLM-L6-v2 one, or --embeddings) behind the cache, the
    settings (its floor, or --min-score; --set), the API and the backfill."""
    from memchat import bootstrap, store
    from memchat.cli.embeddings import local_settings, start_server
    from memchat.config import load_settings
    from memchat.model import minilm
    from memchat.throttle import Bucket
    from tests.utils.api import ApiClient

    overrides: dict[str, Any] = {}
    for item in getattr(args, "set", []):
        key, _, value = item.partition("=")
        overrides[key.strip().lower()] = value
    embeddings = getattr(args, "embeddings", None)
    min_score = getattr(args, "min_score", None)
    with common.database() as target:
        admin = common.admin_connection(target.url)
        # Another OpenAI-compatible server (every candidate by default), or
        # the local all-MiniLM-L6-v2 one (its floor).
        server = None if embeddings else start_server("127.0.0.1", 0, background=True)
        if server is None:
            local: dict[str, Any] = {
                "embedding_base_url": embeddings,
                "embedding_api_key": "local",
            }
            floor = 0.0
        else:
            local, floor = local_settings(server), minilm.RECALL_MIN_SCORE
        try:
            with EmbeddingCache(upstream=local["embedding_base_url"], path=args.cache) as cache:
                settings = load_settings(
                    database_url=target.url,
                    supabase_jwt_secret=common.JWT_SECRET,
                    offline_model=True,
                    **{**local, "embedding_base_url": cache.url},
                    embedding_batch_size=256,
                    # The local model embeds a batch of 256 long messages in
                    # seconds, minutes on a busy machine: the backfill's batch
                    # must not time out.
                    openai_timeout_seconds=600,
                    memory_recall_min_score=floor if min_score is None else min_score,
                    db_max_connections=4,
                    **{f"{bucket.value}_rate_per_minute": 0 for bucket in Bucket},
                    **overrides,
                )
                with store.connect(target.url) as conn:
                    store.resize_embeddings(conn, settings.embedding_dimensions)
                api = ApiClient(settings)
                embedder = bootstrap.embedder(settings)
                try:
                    yield Product(target, admin, settings, api, embedder, cache)
                finally:
                    await embedder.close()
                    await api.aclose()
        finally:
            if server:
                server.close()


async def import_haystack(
    product: Product, auth: Mapping[str, str], record: Mapping[str, Any]
) -> tuple[dict[tuple[str, str], Exchange], int, float]:
    """POST /sessions/import of a question's haystack: which (session,
    time) is which exchange, the messages stored and the seconds it took."""
    document, exchange_at = to_import(record)
    t0 = time.perf_counter()
    imported = await product.api.post(
        "/sessions/import",
        content=json.dumps(document).encode(),
        headers={**auth, "content-type": "application/json"},
    )
    seconds = time.perf_counter() - t0
    if imported.status_code != 200:
        raise SystemExit(
            f"{record['question_id']}: import {imported.status_code} {imported.text[:300]}"
        )
    return exchange_at, int(imported.json()["imported_messages"]), seconds


async def search(
    product: Product, auth: Mapping[str, str], record: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], float]:
    """GET /memory/search of a question (k=10, as_of its date): the hits and
    recall's own milliseconds (Server-Timing)."""
    question = question_of(record)
    as_of = haystack_time(record["question_date"]).isoformat()
    found = await product.api.get(
        "/memory/search", params={"q": question.text, "k": K, "as_of": as_of}, headers=auth
    )
    if found.status_code != 200:
        raise SystemExit(f"{question.id}: search {found.status_code} {found.text}")
    return found.json()["hits"], server_timing(found.headers["server-timing"])


def expire_and_clean(product: Product, user_id: uuid.UUID) -> None:
    """--expire: every session of the user expired and deleted by the TTL
    cleanup (their memories kept MEMORY_RETENTION_DAYS), so that recall has
    only the memories to find them by."""
    from memchat.usecases.cleanup import Cleanup

    product.admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute'"
        " where user_id = %s",
        (user_id,),
    )
    Cleanup(
        product.target.url,
        batch_size=1000,
        pause_factor=0,
        probe=False,
        memory_retention_days=product.settings.memory_retention_days,
    ).run()
    (left,) = product.admin.execute(
        "select count(*) from public.chat_message_history where user_id = %s", (user_id,)
    ).fetchone()
    if left:
        raise SystemExit(f"--expire: {left} messages outlived the cleanup")


def memory_footprint(product: Product, messages: int) -> str:
    """What durable memory stored for `messages` imported: how many
    memories per 1,000 messages, and their bytes (table and indexes) once
    compacted (VACUUM FULL: the rows --expire's cleanup rewrote would count
    twice, or not, as autovacuum happened to come by)."""
    product.admin.execute("vacuum full memchat.memories")
    (count, size) = product.admin.execute(
        "select count(*), pg_total_relation_size('memchat.memories') from memchat.memories"
    ).fetchone()
    return (
        f"memories: {count:,} for {messages:,} messages ({1000 * count / max(messages, 1):,.0f}"
        f" per 1,000), {size / max(count, 1):,.0f} bytes each with the indexes"
    )


def authorization(user_id: uuid.UUID) -> dict[str, str]:
    from memchat import devtokens

    return {"Authorization": f"Bearer {devtokens.mint(common.JWT_SECRET, user_id)}"}


async def run(args: argparse.Namespace) -> None:
    records = load(args.data)[: args.questions or None]
    async with product(args) as memchat:
        scored: list[Scored] = []
        import_rates: list[float] = []
        imported = 0
        embed_seconds = 0.0
        counted = ("fact_requests", "fact_tokens_in", "fact_tokens_out", "facts_unreadable")
        facts = dict.fromkeys(counted, 0)
        started = time.monotonic()
        for number, record in enumerate(records, 1):
            question = question_of(record)
            user_id = common.create_user(memchat.admin).user_id
            auth = authorization(user_id)
            exchange_at, stored, seconds = await import_haystack(memchat, auth, record)
            import_rates.append(stored / seconds)
            imported += stored
            t0 = time.perf_counter()
            await until_recall_ready(memchat, auth, facts)
            embed_seconds += time.perf_counter() - t0
            if args.expire:
                expire_and_clean(memchat, user_id)
            found, ms = await search(memchat, auth, record)
            # A memory the assistant stated is of its session, no user turn's.
            session_of = {
                str(session_uuid(record["question_id"], s)): s
                for s in record["haystack_session_ids"]
            }
            hits = [
                exchange_at.get(
                    (hit["session_id"], _iso(hit["created_at"])),
                    (session_of[hit["session_id"]], -1),
                )
                for hit in found
            ]
            scored.append(Scored(question, score(question, hits), ms))
            if args.verbose:
                print(number, question.id, question.type, scored[-1].metrics, f"{ms:.1f}")
            elif number % 10 == 0:
                print(
                    f"... {number}/{len(records)} questions, {time.monotonic() - started:.0f} s",
                    file=sys.stderr,
                )
        settings = memchat.settings
        print(common.machine_report(memchat.admin, memchat.target))
        print(
            f"model {settings.openai_embedding_model} ({settings.embedding_dimensions}"
            f" dimensions), k={K}, MEMORY_RECALL_MIN_SCORE={settings.memory_recall_min_score},"
            f" MEMORY_RECALL_DUPLICATE_SCORE={settings.memory_recall_duplicate_score},"
            f" MEMORY_RECALL_WORDS={settings.memory_recall_words},"
            f" MEMORY_RECALL_TIME={settings.memory_recall_time},"
            f" MEMORY_RECALL_FACTS={settings.memory_recall_facts}; data {args.data.name};"
            f" embeddings cache {memchat.cache.hits} hits, {memchat.cache.misses} misses"
        )
        print(
            f"import: median {statistics.median(import_rates):,.0f} messages/s per request"
            f" (POST /sessions/import, embeddings aside; {len(import_rates)} requests);"
            f" backfill and waiting for it: {embed_seconds:.1f} s in all"
        )
        print(memory_footprint(memchat, imported))
        if settings.memory_recall_facts == "model":
            print(
                "facts written by"
                f" {'the offline responder' if settings.offline_model else settings.openai_model}:"
                f" {facts['fact_requests']} requests, {facts['fact_tokens_in']:,} tokens in,"
                f" {facts['fact_tokens_out']:,} out, {facts['facts_unreadable']} unreadable"
            )
        headers, rows = table(scored)
        if args.expire:
            print(
                "--expire: every transcript expired and deleted before its question; recall"
                " finds durable memories only (the session figures are the measure)"
            )
        print(common.format_table(headers, rows))
        print(newest_line(scored))
        print(summary_line(scored))


def _iso(value: str) -> str:
    return datetime.fromisoformat(value).astimezone(UTC).isoformat()


def server_timing(header: str, metric: str = "recall") -> float:
    """A Server-Timing header's duration of `metric`, in milliseconds."""
    for part in header.split(","):
        name, _, rest = part.strip().partition(";")
        if name == metric:
            return float(rest.partition("dur=")[2])
    raise ValueError(f"no {metric} timing in {header!r}")


async def until_recall_ready(
    product: Product, auth: Mapping[str, str], facts: dict[str, int] | None = None
) -> None:
    """The backfill run until GET /sessions/import/status says recall is
    ready; its runs' facts requests (`fact_*`, `facts_unreadable`) added to
    `facts` when given."""
    for _ in range(1000):
        status = await product.api.get("/sessions/import/status", headers=auth)
        if status.json()["recall_ready"]:
            return
        done = (await product.embedder.run()).as_dict()
        if facts is not None:
            for key in facts:
                facts[key] += done[key]
    raise SystemExit("the backfill did not finish: is the embeddings server answering?")


def expire_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--expire",
        action="store_true",
        help="expire and clean every transcript before the questions: recall from memories alone",
    )


def product_arguments(parser: argparse.ArgumentParser, cache: Path) -> None:
    """The options `product` reads: --cache, --min-score, --set, --embeddings."""
    parser.add_argument("--cache", type=Path, default=cache, help="embeddings cache")
    parser.add_argument(
        "--min-score",
        type=float,
        default=None,
        help="MEMORY_RECALL_MIN_SCORE for the run (default: all-MiniLM-L6-v2's floor, 0.2,"
        " with the local model; 0, every candidate, with --embeddings)",
    )
    parser.add_argument(
        "--set", action="append", default=[], help="another setting, e.g. memory_recall_time=0"
    )
    parser.add_argument(
        "--embeddings",
        metavar="URL",
        help="an OpenAI-compatible embeddings server (.../v1) instead of the local"
        " all-MiniLM-L6-v2 one; name its model and size with --set openai_embedding_model=..."
        " --set embedding_dimensions=... (and prefixes: embedding_query_prefix=...)",
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a LongMemEval JSON file")
    parser.add_argument("--questions", type=int, default=0, help="only the first N (0: all)")
    product_arguments(parser, DEFAULT_CACHE)
    parser.add_argument("--verbose", action="store_true", help="a line per question")
    expire_argument(parser)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
