"""Recall right after a large import, and once the keys are analysed.

One user imports the haystacks of the first N questions of a LongMemEval
file (default 20 of the dev split: about 9,800 messages, 4,800 of them
embedded; bench_longmemeval.py's import, backfill and cached embeddings),
in one POST /sessions/import per haystack. Once GET /sessions/import/status
says recall is ready, the N questions are searched in turn (GET
/memory/search, k=10, as_of each question's date), 100 searches per state:

1. at once after the backfill (what a user who has just imported sees);
2. again;
3. after `analyze` of the recall keys (memchat.message_embeddings and
   memchat.message_facts: every partition);
4. after `vacuum` of them too.

Per state: the median of the first 10 searches, the median, p95 and max
of recall's own time (Server-Timing `recall`). Also the user's key
partition as the statistics count it after the backfill (-1: never
analysed) against the rows it holds: each backfill run ends by analysing
the young partitions that hold 1,000 keys, or twice what their statistics
count (supabase/schemas/functions/partitions.sql); autovacuum's threshold for
the partitions is 5,000 changed rows.

    python tests/bench/bench_import_recall.py                  # 20 questions
    python tests/bench/bench_import_recall.py --questions 10   # 2,400 keys
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

from tests.bench import _common as common
from tests.bench.bench_longmemeval import (
    DEFAULT_CACHE,
    DEFAULT_DATA,
    Product,
    authorization,
    import_haystack,
    load,
    product,
    search,
    until_recall_ready,
)
from tests.utils.store_data import key_partition

SEARCHES = 100
KEY_TABLES = ("memchat.message_embeddings", "memchat.message_facts")


async def searches(memchat: Product, auth: dict[str, str], records: Sequence[Any]) -> list[float]:
    times = []
    for i in range(SEARCHES):
        _, ms = await search(memchat, auth, records[i % len(records)])
        times.append(ms)
    return times


def row(state: str, times: list[float]) -> list[str]:
    stats = common.summarize(times)
    return [
        state,
        f"{statistics.median(times[:10]):.1f}",
        f"{stats.median:.1f}",
        f"{stats.p95:.1f}",
        f"{stats.maximum:.1f}",
    ]


async def run(args: argparse.Namespace) -> None:
    from psycopg import sql

    records = load(args.data)[: args.questions]
    async with product(args) as memchat:
        user_id = common.create_user(memchat.admin).user_id
        auth = authorization(user_id)
        stored = 0
        for record in records:
            _, count, _ = await import_haystack(memchat, auth, record)
            stored += count
        await until_recall_ready(memchat, auth)
        name, counted, present = key_partition(memchat.admin, user_id)
        rows = [row("at once after the backfill", await searches(memchat, auth, records))]
        rows.append(row("again", await searches(memchat, auth, records)))
        for step in ("analyze", "vacuum"):
            for table in KEY_TABLES:
                memchat.admin.execute(
                    sql.SQL(step + " {}").format(sql.Identifier(*table.split(".")))
                )
            rows.append(row(f"after {step} of the keys", await searches(memchat, auth, records)))
        print(common.machine_report(memchat.admin, memchat.target))
        print(
            f"one user: {stored:,} messages imported ({len(records)} haystacks of"
            f" {args.data.name}); {name}: {present:,} keys, its statistics counting"
            f" {counted:,.0f} after the backfill (-1: never analysed); {SEARCHES} searches"
            f" per state, k=10"
        )
        headers = ["state", "first 10 median ms", "median ms", "p95 ms", "max ms"]
        print(common.format_table(headers, rows))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a LongMemEval JSON file")
    parser.add_argument("--questions", type=int, default=20, help="haystacks imported (20)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="embeddings cache")
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
