"""Benchmark: what durable memory costs and how fast the cleanup forgets it.

Fills `--users` users with `--memories` memories in all (memchat.memories,
as the embedding backfill stores them: a sentence of ~60 characters, a
random embedding of the column's size), every one past its retention, then runs
the TTL cleanup (`Cleanup.run`, no turns beside it) once per batch size,
each on a fresh fill: memories deleted per second. Also prints the table's
bytes per memory (heap, TOAST and indexes). Aim: >= 200,000 memories/s, as
for messages (bench_cleanup.py).

    python tests/bench/bench_memory_cleanup.py     # 200,000 memories; batches 1000, 10000
    python tests/bench/bench_memory_cleanup.py --memories 50000 --batches 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

import psycopg

from tests.bench import _common as common

_FILL = """
insert into memchat.memories
    (user_id, agent_name, kind, text, session_id, message_id, ordinal, created_at, expires_at,
     model, embedding)
select u.id, 'default', case when i %% 2 = 0 then 'fact' else 'assistant' end,
       'I moved to a flat near the park in spring, memory number ' || i,
       gen_random_uuid(), i, 0, now() - interval '400 days', now() - interval '1 minute',
       'bench-model',
       (select array_agg(random()::real) from generate_series(1, memchat.embedding_dimensions())
         where i > 0)::extensions.vector
  from generate_series(1, %(n)s) i
  join (select id, row_number() over () - 1 as k from auth.users) u on u.k = i %% %(users)s
"""
_SIZE = "select pg_total_relation_size('memchat.memories'), count(*) from memchat.memories"


def fill(admin: psycopg.Connection[Any], memories: int, users: int) -> None:
    admin.execute("truncate memchat.memories")
    admin.execute(_FILL, {"n": memories, "users": users})
    admin.execute("vacuum analyze memchat.memories")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--batches", type=common.comma_list(int), default=[1000, 10000])
    args = parser.parse_args()

    from memchat.usecases.cleanup import Cleanup

    with common.database() as target:
        admin = common.admin_connection(target.url)
        load_at_start = common.load_average()
        for _ in range(args.users):
            common.create_user(admin)
        rows = []
        size = None
        for batch in args.batches:
            fill(admin, args.memories, args.users)
            if size is None:
                total, count = admin.execute(_SIZE).fetchone() or (0, 1)
                size = total / max(count, 1)
            started = time.perf_counter()
            result = Cleanup(target.url, batch_size=batch, pause_factor=0, probe=False).run()
            seconds = time.perf_counter() - started
            rows.append(
                [
                    f"{batch:,}",
                    f"{result.deleted_memories:,}",
                    f"{seconds:.2f}",
                    f"{result.deleted_memories / seconds:,.0f}",
                ]
            )
        print(common.machine_report(admin, target, load_at_start=load_at_start))
        (dimensions,) = admin.execute("select memchat.embedding_dimensions()").fetchone() or (0,)
        print(
            f"{args.memories:,} memories of {args.users:,} users, vector({dimensions}):"
            f" {size:,.0f} bytes each in the table and its indexes"
        )
        print(common.format_table(["batch", "deleted", "seconds", "memories/s"], rows))


if __name__ == "__main__":
    main()
