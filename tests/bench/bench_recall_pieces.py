"""Benchmark: what one recall spends its time on, per LongMemEval question.

Run after `bench_longmemeval.py` on a database it leaves filled (a disposable
DATABASE_URL, e.g. a pgserver started by hand): for each question of the
file, the user that run imported (found by the haystack's first session id),
its question embedded with the local all-MiniLM-L6-v2 model, and then, as
that user (memchat_user with its claims, one transaction each), timed from
the client (--repeat calls each, the median per question):

- recall: the whole `memchat.recall` statement, as GET /memory/search calls
  it (k=10, window 0, no session, min score 0, the question's period);
- count: the history's length from the sessions' counters;
- nearest: the exact scan by meaning (`memchat.nearest_messages`, depth 20);
- words: the word list as recall reads it (`memchat.rounds_matching` with
  `memchat.rarer_words`): the GIN index asked for the caller's rounds
  holding a word (supabase/schemas/functions/words.sql);
- words, every user's rounds: the same list the way it was read before
  that migration, the index asked for every round holding a word and the
  caller's picked out after (that function as it was, without the owner's
  lexeme, in a temporary function): its cost grows with the users in the
  table;
- period: the exact scan within the question's period, where it names one;
- recall, plans discarded: the first recall after `discard plans` on the
  same connection. memchat.recall's statements run with generic plans over
  every key partition, kept by the connection; anything that changes a
  partition's row in pg_class (an `analyze` that counts new rows, a vacuum,
  the backfill's sweep of young partitions) throws them away in every
  connection, and the next recall makes them again;
- recall, new connection: the first recall of a connection just opened
  (its catalog caches empty as well), as a new instance's first turn meets
  it on a direct connection.

    DATABASE_URL=... python tests/bench/bench_longmemeval.py
    DATABASE_URL=... python tests/bench/bench_recall_pieces.py [--repeat 3]
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

from tests.bench import _common as common
from tests.bench.bench_longmemeval import DEFAULT_DATA, haystack_time, load, to_import

MODEL = "all-MiniLM-L6-v2"
DEPTH = 20
NO_FLOOR = 9223372036854775807

PIECES: dict[str, str] = {
    "recall": "select memchat.recall(auth.uid(), null, 'default', 0, %(q)s::extensions.vector,"
    " %(m)s, %(t)s, 10, 0.0, %(c)s, %(f)s, %(u)s)",
    "count": "select coalesce(sum(s.message_count), 0) from public.chat_sessions s"
    " where s.user_id = auth.uid() and s.agent_name = 'default' and s.status = 'active'"
    " and s.expires_at > now()",
    "nearest": "select memchat.nearest_message_ids(auth.uid(),"
    " 'default', %(m)s, null, %(floor)s, %(q)s::extensions.vector, %(d)s, null, null)",
    "words": "select memchat.rounds_matching('default', %(m)s, memchat.rarer_words("
    "memchat.any_words(%(t)s), %(n)s, memchat.words_budget()), null, %(floor)s, %(d)s, %(n)s)",
    "period": "select memchat.nearest_message_ids(auth.uid(),"
    " 'default', %(m)s, null, %(floor)s, %(q)s::extensions.vector, %(d)s, %(f)s, %(u)s)",
}
# The word list before supabase/schemas/functions/words.sql: memchat.rounds_matching
# as supabase/schemas/functions/recall.sql made it (every round holding a word, the
# caller's picked out after), as a function of this session's own, called as
# the new one is.
EVERY_USERS_FUNCTION = """
create function pg_temp.rounds_matching_every(
  p_agent_name text, p_model text, p_words tsquery, p_session_id uuid, p_floor bigint,
  p_limit integer
) returns bigint[]
language sql stable security definer
set search_path = ''
set enable_bitmapscan = on
as $$
  select coalesce(array_agg(m.message_id order by m.rank desc, m.message_id desc), '{}')
    from (select e.message_id, ts_rank(e.lexemes, p_words, 1) as rank
            from memchat.message_embeddings e
            join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
           where e.user_id = auth.uid() and e.agent_name = p_agent_name and e.model = p_model
             and s.status = 'active' and s.expires_at > pg_catalog.now()
             and (p_session_id is null or e.session_id <> p_session_id or e.message_id < p_floor)
             and e.lexemes operator(pg_catalog.@@) p_words
           order by 2 desc, 1 desc
           limit p_limit) m
$$
"""
EVERY_USERS_WORDS = (
    "select pg_temp.rounds_matching_every('default', %(m)s, memchat.rarer_words("
    "memchat.any_words(%(t)s), %(n)s, memchat.words_budget()), null, %(floor)s, %(d)s)"
)


def question_params(
    conn: Any, record: Mapping[str, Any], vector: Sequence[float]
) -> tuple[Any, dict[str, Any]] | None:
    """The user a run imported `record`'s haystack for (found by its first
    session), and the parameters of PIECES for its question (`vector`: the
    question's embedding); None if that run did not import it here."""
    from memchat.config import DUPLICATE_SCORE
    from memchat.store.fragments import vector_literal
    from memchat.usecases.recall import periods

    document, _ = to_import(record)
    row = conn.execute(
        "select s.user_id, (select sum(x.message_count) from public.chat_sessions x"
        " where x.user_id = s.user_id) from public.chat_sessions s where s.id = %s",
        (document["sessions"][0]["id"],),
    ).fetchone()
    if row is None:
        return None
    user_id, messages = row
    period = periods.period_in(record["question"], haystack_time(record["question_date"]))
    return user_id, {
        "q": vector_literal([float(x) for x in vector]),
        "m": MODEL,
        "t": record["question"],
        "c": DUPLICATE_SCORE,
        "f": period.start if period else None,
        "u": period.end if period else None,
        "n": int(messages) // 2,
        "d": DEPTH,
        "floor": NO_FLOOR,
    }


FIRST_CALLS = ("recall, plans discarded", "recall, new connection")


def timed_call(
    conn: Any, claims: Mapping[str, Any], statement: str, params: Mapping[str, Any]
) -> float:
    """One statement as the caller of `claims` (its own transaction), its ms
    from the client."""

    from tests.utils.store_data import become

    with conn.transaction():
        become(conn, claims)
        started = time.perf_counter()
        conn.execute(statement, params).fetchone()
        return (time.perf_counter() - started) * 1000


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a LongMemEval JSON file")
    parser.add_argument("--repeat", type=int, default=3, help="calls of each piece per question")
    args = parser.parse_args(argv)

    import psycopg

    from memchat.model import minilm

    url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL: the database bench_longmemeval.py filled")

    records = load(args.data)
    vectors = minilm.load().embed([r["question"] for r in records])
    # As the product connects: no server-side prepared statements.
    admin = psycopg.connect(url, autocommit=True, prepare_threshold=None)
    admin.execute(EVERY_USERS_FUNCTION)
    admin.execute("grant execute on function pg_temp.rounds_matching_every to memchat_user")
    statements = {**PIECES, "words, every user's": EVERY_USERS_WORDS}
    times: dict[str, list[float]] = {name: [] for name in [*statements, *FIRST_CALLS]}
    users = 0
    for record, vector in zip(records, vectors, strict=True):
        found = question_params(admin, record, vector)
        if found is None:
            continue
        users += 1
        user_id, params = found
        claims = {"sub": str(user_id), "role": "authenticated"}
        for name, statement in statements.items():
            if name == "period" and params["f"] is None and params["u"] is None:
                continue
            calls = [timed_call(admin, claims, statement, params) for _ in range(args.repeat)]
            times[name].append(statistics.median(calls))
        admin.execute("discard plans")
        times[FIRST_CALLS[0]].append(timed_call(admin, claims, PIECES["recall"], params))
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as fresh:
            times[FIRST_CALLS[1]].append(timed_call(fresh, claims, PIECES["recall"], params))
    if not users:
        raise SystemExit("no imported question found: run bench_longmemeval.py on DATABASE_URL")
    table_users = admin.execute("select count(distinct user_id) from public.chat_sessions")
    (table_users,) = table_users.fetchone() or (0,)
    print(common.machine_report(admin, common.Target(url=url, embedded=False)))
    print(
        f"{users} questions' users of {table_users} in the table; {args.repeat} calls of each"
        " piece per question (median), ms from the client"
    )
    rows = [
        [
            name,
            len(v),
            f"{statistics.median(v):.2f}",
            f"{common.percentile(v, 95):.2f}",
            f"{max(v):.2f}",
        ]
        for name, v in times.items()
        if v
    ]
    print(common.format_table(["piece", "questions", "median ms", "p95 ms", "max ms"], rows))


if __name__ == "__main__":
    main()
