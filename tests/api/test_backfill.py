"""The embedding backfill (usecases/backfill.py): what makes imported messages
recallable, as the worker runs it (`memchat_worker`, the real openai client
against the fake server's /v1/embeddings), then a chat turn that recalls them.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from memchat import bootstrap, messages, store
from memchat.model.embeddings import local_embedding
from memchat.prompts.facts import FACTS_INSTRUCTIONS, FACTS_MESSAGES_PER_CALL, facts_max_tokens
from memchat.store.db import Database
from memchat.usecases.backfill import CONCURRENCY, MAX_ATTEMPTS, Embedder
from memchat.usecases.recall.facts import FACT_KEYS_PER_MESSAGE
from memchat.usecases.recall.meaning import EMBEDDING_MAX_CHARS
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.logs import assert_not_logged
from tests.utils.store_data import exchange, key_partition, record
from tests.utils.users import UserFactory, claims_for

FACT = "my favourite colour is teal"
QUESTION = "what is my favourite colour?"


@pytest.fixture(autouse=True)
def empty_queue(admin: psycopg.Connection) -> None:
    """Other tests' queued sessions out of the way."""
    admin.execute("delete from memchat.embedding_queue")


@pytest.fixture
async def embedders(worker_url: str, model: FakeOpenAI) -> AsyncIterator[Callable[..., Embedder]]:
    """`embedders(**settings)`: the backfill as bootstrap builds it for the
    worker's settings (its own login, the summaries job's keys)."""
    made: list[Embedder] = []

    def build(**overrides: object) -> Embedder:
        settings = make_settings(worker_url, model.url, job="summaries", **overrides)
        made.append(bootstrap.embedder(settings))
        return made[-1]

    yield build
    for embedder in made:
        await embedder.close()


async def imported(
    db: Database, caller: store.Caller, *questions: str, answered: bool = False
) -> uuid.UUID:
    """A session stored with no embedding (as an import stores it), queued:
    the questions, each with its answer when `answered` (an answer is
    embedded too: the batching and failure cases below count questions)."""
    msgs: list[dict[str, Any]] = []
    for question in questions:
        msgs += (
            exchange(question, f"answer to {question}") if answered else [messages.human(question)]
        )
    info = await record(db, caller, msgs)
    assert await store.queue_embeddings(db, caller, [info.id]) == 1
    return info.id


def stored(admin: psycopg.Connection, user_id: uuid.UUID) -> list[tuple[str, str]]:
    """(text, model) of each of the user's embedded messages."""
    rows = admin.execute(
        "select h.message->'data'->>'content', e.model from memchat.message_embeddings e"
        " join public.chat_message_history h on h.id = e.message_id and h.user_id = e.user_id"
        " where e.user_id = %s order by h.id",
        (user_id,),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def queue(admin: psycopg.Connection) -> list[tuple[uuid.UUID, int, float | None]]:
    """(session, attempts, seconds until its next attempt; None: given up)."""
    rows = admin.execute(
        "select session_id, attempts, case when next_attempt_at <> 'infinity'"
        " then extract(epoch from next_attempt_at - now())::float8 end"
        " from memchat.embedding_queue order by due_since"
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


async def test_imported_messages_become_recallable(
    api: ApiClient,
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
) -> None:
    user_id, auth = api.new_user()
    caller = store.Caller(user_id=user_id, claims=claims_for(user_id))
    session = await imported(db, caller, FACT, "we fly to Lisbon in May")
    assert await store.embeddings_pending(db, caller) == 2

    run = await embedders().run()

    assert (run.embedded, run.failed, run.finished, run.refused) == (2, 0, True, None)
    assert stored(admin, user_id) == [
        (FACT, "text-embedding-3-small"),
        ("we fly to Lisbon in May", "text-embedding-3-small"),
    ]
    assert await store.embeddings_pending(db, caller) == 0 and queue(admin) == []
    # Documents, in one request, the texts as stored.
    assert [r["input"] for r in model.embedding_requests] == [[FACT, "we fly to Lisbon in May"]]

    body = await chat(api, auth, QUESTION, session_id=str(uuid.uuid4()))
    assert [r["session_id"] for r in body["memory"]["recalled"]] == [str(session)]
    # The turn queued its answer: another run embeds it (the question's
    # embedding was the turn's), and then nothing is left to do.
    again = await embedders().run()
    assert (again.embedded, again.rounds, again.finished) == (1, 1, True)
    assert model.embedding_requests[-1]["input"] == [body["answer"]]
    again = await embedders().run()
    assert (again.embedded, again.rounds, again.finished) == (0, 0, True)


def young_partition_user(users: UserFactory, admin: psycopg.Connection) -> store.Caller:
    """A new user whose key partition is young: its statistics count fewer
    than 5,000 keys (past that, autovacuum's threshold comes first)."""
    while True:
        caller = users.create()
        if key_partition(admin, caller.user_id)[1] < 5000:
            return caller


def grown_by_turns(admin: psycopg.Connection, user_id: uuid.UUID, count: int) -> None:
    """`count` user messages with their embeddings, as turns store them (a
    turn writes its message's embedding itself: only its fact keys and
    memories are left to the backfill)."""
    session = uuid.uuid4()
    admin.execute(
        "insert into public.chat_sessions (id, user_id, title, message_count)"
        " values (%s, %s, 'turns', %s)",
        (session, user_id, count),
    )
    admin.execute(
        "with m as (insert into public.chat_message_history (session_id, user_id, message)"
        "  select %(s)s, %(u)s, jsonb_build_object('type', 'human',"
        "    'data', jsonb_build_object('content', 'turn ' || i))"
        "  from generate_series(1, %(n)s) i returning id)"
        " insert into memchat.message_embeddings"
        "  (message_id, user_id, session_id, agent_name, created_at, model, embedding)"
        " select m.id, %(u)s, %(s)s, 'default', now(), 'text-embedding-3-small',"
        "  array_fill(0.1::real, array[memchat.embedding_dimensions()])::extensions.vector"
        " from m",
        {"s": session, "u": user_id, "n": count},
    )


@pytest.mark.plain_only  # this server's partition statistics; on Citus the shards' are the workers'
async def test_a_young_key_partition_is_analysed_once_it_has_doubled(
    db: Database, users: UserFactory, admin: psycopg.Connection, embedders: Callable[..., Embedder]
) -> None:
    # Never analysed, a partition's recall has no common words to leave out
    # and no size to judge the HNSW path by (migration
    # supabase/schemas/functions/partitions.sql): the backfill's run analyses it from 1,000
    # keys, and again each time it has doubled, while under 5,000.
    alice = young_partition_user(users, admin)
    _, counted, present = key_partition(admin, alice.user_id)
    due = max(2 * counted, 1000)
    await imported(db, alice, *(f"fact {i}" for i in range(max(int(due) - present, 1))))
    run = await embedders().run()
    assert run.analysed >= 1 and run.finished  # others' partitions may be due too
    _, counted, present = key_partition(admin, alice.user_id)
    assert counted == present >= due
    (facts_analysed,) = admin.execute(
        "select last_analyze is not null from pg_stat_all_tables where relid ="
        " memchat.key_partition_of('message_facts', %s)",
        (alice.user_id,),
    ).fetchone()
    assert facts_analysed

    # A few more keys: not doubled, not analysed again.
    await imported(db, alice, "one more fact", "and another")
    run = await embedders().run()
    assert run.embedded == 2
    assert key_partition(admin, alice.user_id)[1:] == (counted, present + 2)


@pytest.mark.plain_only  # this server's partition statistics; on Citus the shards' are the workers'
async def test_a_young_partition_grown_by_turns_is_analysed_by_the_next_run(
    users: UserFactory, admin: psycopg.Connection, embedders: Callable[..., Embedder]
) -> None:
    bob = young_partition_user(users, admin)
    _, counted, present = key_partition(admin, bob.user_id)
    due = max(2 * counted, 1000)
    grown_by_turns(admin, bob.user_id, max(int(due) - present, 1))
    run = await embedders().run()
    # Nothing to embed (only fact keys and memories, of which "turn 1" has none).
    assert (run.embedded, run.finished) == (0, True)
    assert run.analysed >= 1
    _, counted, present = key_partition(admin, bob.user_id)
    assert counted == present >= due
    # And recall's copy of its word statistics is made from that analysis
    # (supabase/schemas/functions/words.sql): "turn", in every round, is listed.
    (latest, turn_share) = admin.execute(
        "select w.analysed_at = memchat.last_analysed(memchat.key_partition_of("
        "'message_embeddings', %(u)s)), c.share from memchat.word_statistics w"
        " left join memchat.common_words c on c.partition_name = w.partition_name"
        " and c.lexeme = 'turn'"
        " where w.partition_name = memchat.key_partition_name('message_embeddings', %(u)s)",
        {"u": bob.user_id},
    ).fetchone()
    assert latest and turn_share > 0.1


async def test_requests_pack_sessions_in_batches_of_the_set_size(
    db: Database, users: UserFactory, model: FakeOpenAI, embedders: Callable[..., Embedder]
) -> None:
    alice = users.create()
    texts = [["a one"], ["b one", "b two"], ["c one", "c two"]]
    for questions in texts:
        await imported(db, alice, *questions)

    run = await embedders(embedding_batch_size=2).run()

    assert run.embedded == 5 and run.sessions == 3
    sent = [r["input"] for r in model.embedding_requests]
    assert sorted(len(batch) for batch in sent) == [1, 2, 2]
    assert sorted(t for batch in sent for t in batch) == sorted(t for q in texts for t in q)


@pytest.mark.plain_only  # timed against one server's round trips
async def test_requests_in_flight_are_bounded(
    db: Database, users: UserFactory, model: FakeOpenAI, embedders: Callable[..., Embedder]
) -> None:
    """Ten one-message requests of 0.3 s each: CONCURRENCY at once, so a few
    rounds of them, neither one after the other nor all together."""
    alice = users.create()
    for i in range(10):
        await imported(db, alice, f"question {i}")
    model.script_embeddings(*[{"delay": 0.3}] * 10)

    started = time.monotonic()
    run = await embedders(embedding_batch_size=1).run()
    elapsed = time.monotonic() - started

    assert run.embedded == 10 and len(model.embedding_requests) == 10
    waves = -(-10 // CONCURRENCY)  # 3
    assert waves * 0.3 - 0.05 <= elapsed < 10 * 0.3, elapsed


async def test_a_failed_request_backs_off_keeping_what_was_stored(
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
    caplog: pytest.LogCaptureFixture,
) -> None:
    alice = users.create()
    texts = ("teal-7f3a", "lisbon-9c2e", "miso-4b1d")  # never in a log record
    session = await imported(db, alice, *texts)
    model.script_embeddings({}, {"status": 500}, {})
    embedder = embedders(embedding_batch_size=1)

    with caplog.at_level(logging.WARNING, logger="memchat.usecases.backfill"):
        run = await embedder.run()

    assert (run.embedded, run.failed, run.gave_up) == (2, 1, 0)
    assert len(stored(admin, alice.user_id)) == 2
    [(queued, attempts, wait)] = queue(admin)
    assert (queued, attempts) == (session, 1) and wait is not None and 50 < wait <= 60
    assert await store.embeddings_pending(db, alice) == 1
    (warning,) = [r for r in caplog.records if r.name == "memchat.usecases.backfill"]
    assert warning.getMessage() == "embeddings failed; will retry"
    for text in texts:
        assert_not_logged(caplog, text)

    # Due again: the one left is embedded, and the session leaves the queue.
    admin.execute("update memchat.embedding_queue set next_attempt_at = now()")
    run = await embedder.run()
    assert (run.embedded, run.failed) == (1, 0)
    assert len(stored(admin, alice.user_id)) == 3 and queue(admin) == []


async def test_a_session_failing_again_and_again_is_given_up(
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
) -> None:
    alice = users.create()
    session = await imported(db, alice, "first")
    admin.execute("update memchat.embedding_queue set attempts = %s", (MAX_ATTEMPTS - 1,))
    model.script_embeddings({"status": 503})
    run = await embedders().run()
    assert (run.failed, run.gave_up) == (1, 1)
    assert queue(admin) == [(session, MAX_ATTEMPTS, None)]
    assert await store.embeddings_pending(db, alice) == 0
    # Queued again (another import into it): ready at once.
    await store.queue_embeddings(db, alice, [session])
    assert (await embedders().run()).embedded == 1


async def test_nothing_is_embedded_while_the_column_has_another_size(
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
    caplog: pytest.LogCaptureFixture,
) -> None:
    alice = users.create()
    session = await imported(db, alice, "first")
    with caplog.at_level(logging.ERROR, logger="memchat.usecases.backfill"):
        run = await embedders(embedding_dimensions=384).run()
    assert run.refused and "memchat db reembed --dimensions 384" in run.refused
    assert "vector(512)" in run.refused
    assert (run.rounds, run.embedded, run.finished) == (0, 0, False)
    assert model.embedding_requests == [] and queue(admin)[0][:2] == (session, 0)
    assert any("the embedding backfill is off" in r.getMessage() for r in caplog.records)


async def test_stored_messages_are_embedded_as_documents(
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
) -> None:
    alice = users.create()
    await imported(db, alice, FACT)
    await embedders(embedding_query_prefix="query: ", embedding_document_prefix="passage: ").run()
    assert [r["input"] for r in model.embedding_requests] == [[f"passage: {FACT}"]]
    (vector,) = admin.execute(
        "select embedding::text from memchat.message_embeddings where user_id = %s",
        (alice.user_id,),
    ).fetchone()
    values = [float(x) for x in vector.strip("[]").split(",")]
    assert values == pytest.approx(local_embedding(f"passage: {FACT}", 512), abs=1e-6)


async def test_a_turns_own_embedding_is_kept_and_tool_rounds_are_skipped(
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
) -> None:
    alice = users.create()
    session = uuid.uuid4()
    await store.record_turn(
        db,
        alice,
        store.Turn(
            session_id=session,
            agent_name="default",
            messages=exchange("embedded by its turn", "ok"),
            title=None,
            ttl=timedelta(hours=1),
            embedding=store.Embedding("text-embedding-3-small", local_embedding("x", 512)),
        ),
    )
    await record(
        db,
        alice,
        [messages.human("not yet"), messages.ai("", tool_calls=[]), messages.human("  ")],
        session_id=session,
    )
    await store.queue_embeddings(db, alice, [session])
    run = await embedders().run()
    # The turn's answer and the message no turn embedded; not the tool call.
    assert run.embedded == 2
    assert [r["input"] for r in model.embedding_requests] == [["ok", "not yet"]]
    assert stored(admin, alice.user_id) == [
        ("embedded by its turn", "text-embedding-3-small"),
        ("ok", "text-embedding-3-small"),
        ("not yet", "text-embedding-3-small"),
    ]


async def test_a_lambda_run_starts_no_round_it_cannot_finish(
    db: Database, users: UserFactory, model: FakeOpenAI, embedders: Callable[..., Embedder]
) -> None:
    alice = users.create()
    await imported(db, alice, "first")
    run = await embedders().run(remaining_ms=lambda: 10_000)  # under the reserve and a call
    assert (run.rounds, run.finished) == (0, False) and model.embedding_requests == []
    run = await embedders().run(remaining_ms=lambda: 600_000)
    assert (run.embedded, run.finished) == (1, True)


async def test_a_lambda_run_keeps_time_for_the_facts_request_when_the_model_writes_them(
    db: Database, users: UserFactory, model: FakeOpenAI, embedders: Callable[..., Embedder]
) -> None:
    # 5 s kept back, a 5 s embeddings call, and with `model` a 5 s chat call
    # first (the tests' timeout, no retries): 12 s fits a round only without it.
    alice = users.create()
    await imported(db, alice, "first")
    run = await embedders(memory_recall_facts="model").run(remaining_ms=lambda: 12_000)
    assert (run.rounds, run.finished) == (0, False) and model.requests == []
    run = await embedders(memory_recall_facts="rule").run(remaining_ms=lambda: 12_000)
    assert (run.embedded, run.finished) == (1, True)


async def test_the_worker_builder_shares_one_connection_and_client(worker_url: str) -> None:
    settings = make_settings(worker_url, "http://127.0.0.1:1/v1", job="summaries")
    summarizer, embedder = bootstrap.worker(settings)
    try:
        assert summarizer.db is embedder.db and summarizer.model is embedder.model
    finally:
        await summarizer.close()


# ------------------------------------------- fact keys written by the model

SNEAKERS = "I keep my old sneakers in a shoe rack in the closet."
BIKE = "I ride a red Trek bike to work."


def keys_by_message(admin: psycopg.Connection, user_id: uuid.UUID) -> dict[str, list[int]]:
    """Each of the user's messages with fact keys: its text, the keys' ordinals."""
    rows = admin.execute(
        "select h.message->'data'->>'content', array_agg(f.ordinal order by f.ordinal)"
        " from memchat.message_facts f join public.chat_message_history h"
        " on h.id = f.message_id and h.user_id = f.user_id"
        " where f.user_id = %s group by h.id, h.message",
        (user_id,),
    ).fetchall()
    return {text: ordinals for text, ordinals in rows}


def facts_requests(model: FakeOpenAI) -> list[dict[str, Any]]:
    return [r for r in model.requests if r["messages"][0]["content"] == FACTS_INSTRUCTIONS]


async def test_the_model_writes_fact_keys_and_recall_finds_a_message_by_them(
    api: ApiClient,
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
) -> None:
    user_id, auth = api.new_user()
    caller = store.Caller(user_id=user_id, claims=claims_for(user_id))
    # One sentence each: the rule would give these no key at all.
    first = await imported(db, caller, "any tips for shoe storage", "which bike should I buy")
    await imported(db, caller, "what about a cobbler nearby")
    # Both sessions' messages share one embeddings request, but not a facts
    # request: one per session, each numbering its messages from 1. Which
    # session asks first is not fixed, so both get the same answer; the
    # second message's fact names no message of the one-message session.
    written = json.dumps(
        {"facts": [{"message": 1, "fact": SNEAKERS}, {"message": 2, "fact": BIKE}]}
    )
    model.script({"content": written}, {"content": written})

    run = await embedders(memory_recall_facts="model").run()

    assert (run.embedded, run.failed, run.facts_unreadable) == (3, 0, 0)
    assert (run.fact_requests, run.fact_tokens_in, run.fact_tokens_out) == (2, 22, 14)
    asked = facts_requests(model)
    assert sorted(r["messages"][1]["content"] for r in asked) == [
        "[1] any tips for shoe storage\n[2] which bike should I buy",
        "[1] what about a cobbler nearby",
    ]
    assert sorted(r["max_tokens"] for r in asked) == [
        facts_max_tokens(1),
        facts_max_tokens(2),
    ]
    assert keys_by_message(admin, user_id) == {
        "any tips for shoe storage": [0],
        "which bike should I buy": [0],
        "what about a cobbler nearby": [0],
    }
    assert queue(admin) == []

    # Neither the message nor its answer holds these words: the key does.
    response = await api.get("/memory/search", params={"q": SNEAKERS}, headers=auth)
    hits = response.json()["hits"]
    assert hits[0]["question"] in ("any tips for shoe storage", "what about a cobbler nearby")
    assert hits[0]["score"] > 0.99  # the key's own text
    bike = await api.get("/memory/search", params={"q": BIKE, "k": 1}, headers=auth)
    (hit,) = bike.json()["hits"]
    assert (hit["session_id"], hit["question"]) == (str(first), "which bike should I buy")


async def test_an_unreadable_facts_answer_gets_the_rules_keys(
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
    caplog: pytest.LogCaptureFixture,
) -> None:
    alice = users.create()
    said = "I'm moving to Porto-5e1c soon. By the way, my cat Mia-77b2 turned three."
    await imported(db, alice, said)
    model.script({"content": "Sorry, I can't help with that."})

    with caplog.at_level(logging.WARNING, logger="memchat.usecases.backfill"):
        run = await embedders(memory_recall_facts="model").run()

    assert (run.embedded, run.failed, run.fact_requests, run.facts_unreadable) == (1, 0, 1, 1)
    assert keys_by_message(admin, alice.user_id) == {said: [0, 1]}  # the rule's two sentences
    (warning,) = [r for r in caplog.records if r.name == "memchat.usecases.backfill"]
    assert warning.getMessage() == "facts answer unreadable: the rule's keys instead"
    assert_not_logged(caplog, "Porto-5e1c", "Mia-77b2")


async def test_a_failed_facts_request_fails_its_sessions_with_nothing_stored(
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
    caplog: pytest.LogCaptureFixture,
) -> None:
    alice = users.create()
    session = await imported(db, alice, "teal-7f3a is my colour", "lisbon-9c2e in May")
    model.script({"status": 500, "error": "down"})
    embedder = embedders(memory_recall_facts="model")

    with caplog.at_level(logging.WARNING, logger="memchat.usecases.backfill"):
        run = await embedder.run()

    # The facts come first: no embedding was asked for or stored.
    assert (run.embedded, run.failed, run.fact_requests) == (0, 1, 0)
    assert model.embedding_requests == [] and stored(admin, alice.user_id) == []
    [(queued, attempts, wait)] = queue(admin)
    assert (queued, attempts) == (session, 1) and wait is not None and 50 < wait <= 60
    messages_logged = [
        r.getMessage() for r in caplog.records if r.name == "memchat.usecases.backfill"
    ]
    assert messages_logged == ["facts request failed", "embeddings failed; will retry"]
    assert_not_logged(caplog, "teal-7f3a", "lisbon-9c2e")

    # Due again, the model answering: the messages and their keys are stored.
    admin.execute("update memchat.embedding_queue set next_attempt_at = now()")
    model.script({"content": json.dumps({"facts": [{"message": 2, "fact": BIKE}]})})
    run = await embedder.run()
    assert (run.embedded, run.failed) == (2, 0)
    assert keys_by_message(admin, alice.user_id) == {"lisbon-9c2e in May": [0]}
    assert queue(admin) == []


async def test_a_long_sessions_messages_take_several_facts_requests(
    db: Database,
    users: UserFactory,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
) -> None:
    alice = users.create()
    count = FACTS_MESSAGES_PER_CALL + 2
    await imported(db, alice, *(f"question number {i}" for i in range(count)))
    two = [{"message": 2, "fact": BIKE}, {"message": 2, "fact": SNEAKERS}]
    written = json.dumps({"facts": two})
    model.script({"content": written}, {"content": written})

    run = await embedders(memory_recall_facts="model").run()

    assert (run.embedded, run.fact_requests) == (count, 2)
    sizes = sorted(len(r["messages"][1]["content"].splitlines()) for r in facts_requests(model))
    assert sizes == [2, FACTS_MESSAGES_PER_CALL]
    # The second message of each request: numbered within its request.
    second = f"question number {FACTS_MESSAGES_PER_CALL + 1}"
    assert keys_by_message(admin, alice.user_id) == {"question number 1": [0, 1], second: [0, 1]}


async def test_a_long_imported_message_is_embedded_from_its_start_and_found(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
) -> None:
    """An imported message may be far longer than a new turn's (a pasted
    document): what is sent to be embedded is bounded, its fact keys too,
    and recall still finds it."""
    user_id, auth = api.new_user()
    sentences = [f"My sister number {i} lives in town {i}." for i in range(4000)]
    document = "I keep my passport in the blue drawer. " + " ".join(sentences)
    assert 150_000 < len(document) < api.settings.import_max_message_chars
    body = {"sessions": [{"messages": [
        {"role": "user", "content": document, "created_at": "2024-01-02T10:00:00Z"},
        {"role": "assistant", "content": "Noted. " * 20_000, "created_at": "2024-01-02T10:01:00Z"},
    ]}]}  # fmt: skip
    r = await api.post("/sessions/import", json=body, headers=auth)
    assert r.status_code == 200, r.text

    run = await embedders().run()

    assert (run.embedded, run.failed) == (2, 0)  # the message and its answer
    sent = [text for request in model.embedding_requests for text in request["input"]]
    assert max(len(text) for text in sent) <= EMBEDDING_MAX_CHARS
    assert sent[0] == document[:EMBEDDING_MAX_CHARS]
    (keys,) = admin.execute(
        "select count(*) from memchat.message_facts where user_id = %s", (user_id,)
    ).fetchone()
    assert 0 < keys <= FACT_KEYS_PER_MESSAGE
    r = await api.get("/memory/search", params={"q": "where is my passport?"}, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["hits"], r.json()


async def test_more_keys_than_a_provider_takes_at_once_go_in_several_requests(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    embedders: Callable[..., Embedder],
) -> None:
    """OpenAI takes 2,048 inputs a request: a batch of messages whose fact
    keys make more is sent in parts, each within it, and every key stored."""
    user_id, auth = api.new_user()
    said = [
        " ".join(f"I met my friend number {i} of group {n} in Porto." for i in range(120))
        for n in range(25)
    ]
    body = {"sessions": [{"messages": [
        {"role": "user", "content": text, "created_at": "2024-01-02T10:00:00Z"} for text in said
    ]}]}  # fmt: skip
    r = await api.post("/sessions/import", json=body, headers=auth)
    assert r.status_code == 200, r.text
    model.embedding_requests.clear()

    run = await embedders().run()

    assert (run.embedded, run.failed) == (25, 0)
    sizes = [len(request["input"]) for request in model.embedding_requests]
    assert sum(sizes) == 25 + 25 * FACT_KEYS_PER_MESSAGE
    assert len(sizes) > 1 and max(sizes) <= 2048
    (keys,) = admin.execute(
        "select count(*) from memchat.message_facts where user_id = %s", (user_id,)
    ).fetchone()
    assert keys == 25 * FACT_KEYS_PER_MESSAGE
