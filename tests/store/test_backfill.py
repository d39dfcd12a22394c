"""The embedding queue at the SQL level (supabase/schemas/functions/embeddings.sql).

The API's role queues its caller's own sessions and counts what still
waits, under RLS; the worker (`memchat_worker`) reads and writes only what a
live lease holds, through the memchat.embedding_* functions; which messages
need an embedding is one SQL function for all of them; and the owner's
`memchat db reembed` helpers: queue what lacks a model's embedding, change
the column's size (on a database of its own: the column is the server's).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from memchat import messages, store
from memchat.store.db import Database
from tests.store.conftest import refusals, refused
from tests.utils.analytics_data import Fresh, fresh_database
from tests.utils.store_data import acting_as, exchange, record, tool_exchange
from tests.utils.users import UserFactory

MODEL = "backfill-test-model"
DIMS = 512


def vector(first: float = 1.0) -> list[float]:
    return [first] + [0.0] * (DIMS - 1)


@pytest.fixture
async def worker(worker_url: str) -> AsyncIterator[Database]:
    """The backfill's connection: `memchat_worker`."""
    database = Database(worker_url)
    yield database
    await database.close()


@pytest.fixture(autouse=True)
def empty_queue(admin: psycopg.Connection) -> None:
    """Other tests' sessions out of the way: claims see this test's only."""
    admin.execute("delete from memchat.embedding_queue")


async def imported(
    db: Database, caller: store.Caller, *questions: str, answered: bool = True
) -> store.SessionInfo:
    """A session stored without embeddings, as an import stores it: a
    question and its answer each, a tool round and a blank message too.
    Not `answered`: the questions alone, and the tool round without its
    answer (only the questions are to embed: the lease's tests count them)."""
    msgs: list[dict[str, Any]] = []
    for question in questions:
        msgs += (
            exchange(question, f"answer to {question}") if answered else [messages.human(question)]
        )
    # The model's tool round after the last question: no user message in it.
    msgs += tool_exchange("", "done", call_id=f"c-{uuid.uuid4().hex[:6]}")[1 : 4 if answered else 3]
    msgs.append(messages.human("   "))  # nothing to embed
    return await record(db, caller, msgs)


def facts_made(conn: psycopg.Connection, message_id: int, user_id: uuid.UUID) -> None:
    """Mark a user message's fact keys and memories made, as facts_save does."""
    conn.execute(
        "insert into memchat.message_facts_made (message_id, user_id, model) values (%s, %s, %s)",
        (message_id, user_id, MODEL),
    )


def embeddable_ids(admin: psycopg.Connection, session_id: uuid.UUID) -> list[int]:
    rows = admin.execute(
        "select id from public.chat_message_history where session_id = %s"
        " and memchat.embeddable(message) order by id",
        (session_id,),
    ).fetchall()
    return [r[0] for r in rows]


def queued(admin: psycopg.Connection) -> dict[uuid.UUID, tuple[int, bool]]:
    """session -> (attempts, given up)."""
    rows = admin.execute(
        "select session_id, attempts, next_attempt_at = 'infinity' from memchat.embedding_queue"
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


# ------------------------------------------------------------------ the API


async def test_a_caller_queues_its_own_sessions_only(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice, bob = users.create(), users.create()
    mine = await imported(db, alice, "teal")
    theirs = await imported(db, bob, "red")
    count = await store.queue_embeddings(db, alice, [mine.id, theirs.id, uuid.uuid4()])
    assert count == 1
    assert set(queued(admin)) == {mine.id}
    # Again: still one row, as it was.
    assert await store.queue_embeddings(db, alice, [mine.id]) == 1
    assert queued(admin) == {mine.id: (0, False)}


async def test_a_given_up_session_is_ready_again_when_queued(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice = users.create()
    info = await imported(db, alice, "teal")
    await store.queue_embeddings(db, alice, [info.id])
    admin.execute(
        "update memchat.embedding_queue set attempts = 8, next_attempt_at = 'infinity'"
        " where session_id = %s",
        (info.id,),
    )
    await store.queue_embeddings(db, alice, [info.id])
    assert queued(admin) == {info.id: (0, False)}


async def test_pending_counts_the_callers_queued_user_messages_without_embeddings(
    db: Database, users: UserFactory, admin: psycopg.Connection, worker: Database
) -> None:
    alice, bob = users.create(), users.create()
    first = await imported(db, alice, "teal", "Lisbon")
    second = await imported(db, alice, "Miso")
    unqueued = await imported(db, alice, "never queued")
    await imported(db, bob, "red")
    assert await store.embeddings_pending(db, alice) == 0  # nothing queued yet
    await store.queue_embeddings(db, alice, [first.id, second.id])
    # Each message with text, the user's and the assistant's (the tool round's
    # last answer too): 5 and 3. Not the tool call, its result, the blank one.
    assert await store.embeddings_pending(db, alice) == 8
    assert await store.embeddings_pending(db, bob) == 0
    assert unqueued.id not in queued(admin)

    (item,) = [
        i
        for i in await store.claim_embeddings(worker, limit=10, lease_seconds=60)
        if i.session_id == second.id
    ] or [None]
    assert item is not None
    found = await store.unembedded(worker, item, model=MODEL, after=0, limit=10)
    assert [(m.text, m.asked) for m in found] == [
        ("Miso", True),
        ("answer to Miso", False),
        ("done", False),
    ]
    embeddings = [store.Embedding(MODEL, vector()) for _ in found]
    assert await store.save_embeddings(worker, found, embeddings) == 3
    # A user message is done once its fact keys (and memories) are made too.
    assert await store.embeddings_pending(db, alice) == 6
    assert await store.save_facts(worker, [m for m in found if m.asked], MODEL, []) == 1
    assert await store.embeddings_pending(db, alice) == 5
    assert await store.embeddings_done(worker, item, model=MODEL) is True
    assert await store.embeddings_pending(db, alice) == 5  # the other session waits


async def test_the_api_role_cannot_act_as_the_worker(
    conn: psycopg.Connection, users: UserFactory
) -> None:
    alice = users.create()
    with acting_as(conn, alice.claims):
        for call in (
            "select memchat.embedding_claim(10, 60)",
            "select memchat.embedding_leased(gen_random_uuid())",
            "select memchat.embedding_source(gen_random_uuid(), 'm', 0, 10)",
            "select memchat.embedding_done(gen_random_uuid(), 'm')",
            "select memchat.embedding_failed(gen_random_uuid(), 60)",
            "select memchat.embedding_save('{}'::uuid[], 'm', '{}'::bigint[], '{}'::text[])",
            "delete from memchat.embedding_queue",
        ):
            assert refused(conn, call, {}), call


async def test_a_caller_writes_no_queue_row_of_someone_elses_session(
    conn: psycopg.Connection, db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice, bob = users.create(), users.create()
    theirs = await imported(db, bob, "red")
    with acting_as(conn, alice.claims):
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            conn.execute(
                "insert into memchat.embedding_queue (session_id, user_id) values (%s, %s)",
                (theirs.id, bob.user_id),
            )
        with pytest.raises(refusals(conn)), conn.transaction():
            conn.execute(
                "insert into memchat.embedding_queue (session_id, user_id) values (%s, %s)",
                (theirs.id, alice.user_id),
            )
    assert queued(admin) == {}


# ---------------------------------------------------------------- the worker


async def test_the_worker_embeds_only_through_a_live_lease(
    db: Database, users: UserFactory, admin: psycopg.Connection, worker: Database
) -> None:
    alice = users.create()
    info = await imported(db, alice, "teal", "Lisbon", "Miso", answered=False)
    other = await imported(db, alice, "not leased", answered=False)
    await store.queue_embeddings(db, alice, [info.id])
    (item,) = await store.claim_embeddings(worker, limit=10, lease_seconds=60)
    assert (item.session_id, item.attempts) == (info.id, 0)
    # Leased: a second claim skips it.
    assert await store.claim_embeddings(worker, limit=10, lease_seconds=60) == []

    ids = embeddable_ids(admin, info.id)
    page = await store.unembedded(worker, item, model=MODEL, after=0, limit=2)
    assert [(m.id, m.text) for m in page] == list(zip(ids[:2], ["teal", "Lisbon"], strict=True))
    rest = await store.unembedded(worker, item, model=MODEL, after=page[-1].id, limit=2)
    assert [m.text for m in rest] == ["Miso"]

    # A message of a session it holds no lease of is not stored.
    (foreign,) = embeddable_ids(admin, other.id)
    forged = store.Unembedded(item.lease, foreign, "not leased")
    embeddings = [store.Embedding(MODEL, vector())] * 4
    assert await store.save_embeddings(worker, [*page, *rest, forged], embeddings) == 3
    stored = admin.execute(
        "select message_id, model, session_id from memchat.message_embeddings"
        " where user_id = %s order by message_id",
        (alice.user_id,),
    ).fetchall()
    assert stored == [(i, MODEL, info.id) for i in ids]
    assert await store.save_facts(worker, [*page, *rest, forged], MODEL, []) == 3
    assert await store.unembedded(worker, item, model=MODEL, after=0, limit=10) == []
    assert await store.embeddings_done(worker, item, model=MODEL) is True
    assert queued(admin) == {}


async def test_an_expired_lease_reads_and_writes_nothing(
    db: Database, users: UserFactory, admin: psycopg.Connection, worker: Database
) -> None:
    alice = users.create()
    info = await imported(db, alice, "teal", answered=False)
    await store.queue_embeddings(db, alice, [info.id])
    (item,) = await store.claim_embeddings(worker, limit=10, lease_seconds=60)
    (message,) = await store.unembedded(worker, item, model=MODEL, after=0, limit=10)
    admin.execute("update memchat.embedding_queue set next_attempt_at = now() - interval '1 s'")
    assert await store.unembedded(worker, item, model=MODEL, after=0, limit=10) == []
    embedding = store.Embedding(MODEL, vector())
    assert await store.save_embeddings(worker, [message], [embedding]) == 0
    assert await store.embeddings_done(worker, item, model=MODEL) is False
    await store.embeddings_failed(worker, item, retry_in=60)
    assert queued(admin) == {info.id: (0, False)}  # the failure did not count either


async def test_another_models_embedding_is_replaced_and_the_same_models_kept(
    db: Database, users: UserFactory, admin: psycopg.Connection, worker: Database
) -> None:
    alice = users.create()
    info = await imported(db, alice, "teal", "Lisbon", answered=False)
    first, second = embeddable_ids(admin, info.id)
    for message_id, model in ((first, "old-model"), (second, MODEL)):
        admin.execute(
            "insert into memchat.message_embeddings"
            " (message_id, user_id, session_id, agent_name, created_at, model, embedding)"
            " values (%s, %s, %s, 'default', now(), %s, %s::extensions.vector)",
            (message_id, alice.user_id, info.id, model, store.fragments.vector_literal(vector())),
        )
    facts_made(admin, second, alice.user_id)
    await store.queue_embeddings(db, alice, [info.id])
    (item,) = await store.claim_embeddings(worker, limit=10, lease_seconds=60)
    page = await store.unembedded(worker, item, model=MODEL, after=0, limit=10)
    assert [m.id for m in page] == [first]  # the other has MODEL's already
    kept = store.Unembedded(item.lease, second, "Lisbon")
    fresh = [store.Embedding(MODEL, vector(-1.0))] * 2
    assert await store.save_embeddings(worker, [*page, kept], fresh) == 1
    rows = admin.execute(
        "select message_id, model, embedding::text like '[-1%%' from memchat.message_embeddings"
        " where message_id = any(%s) order by message_id",
        ([first, second],),
    ).fetchall()
    assert rows == [(first, MODEL, True), (second, MODEL, False)]


async def test_a_session_with_more_to_embed_stays_queued_ready(
    db: Database, users: UserFactory, admin: psycopg.Connection, worker: Database
) -> None:
    alice = users.create()
    info = await imported(db, alice, "teal", "Lisbon")
    await store.queue_embeddings(db, alice, [info.id])
    (item,) = await store.claim_embeddings(worker, limit=10, lease_seconds=60)
    assert await store.embeddings_done(worker, item, model=MODEL) is False
    assert queued(admin) == {info.id: (0, False)}
    (again,) = await store.claim_embeddings(worker, limit=10, lease_seconds=60)
    assert again.session_id == info.id and again.lease != item.lease


async def test_failures_back_off_and_give_up(
    db: Database, users: UserFactory, admin: psycopg.Connection, worker: Database
) -> None:
    alice = users.create()
    info = await imported(db, alice, "teal", answered=False)
    await store.queue_embeddings(db, alice, [info.id])
    (item,) = await store.claim_embeddings(worker, limit=10, lease_seconds=60)
    await store.embeddings_failed(worker, item, retry_in=120)
    (attempts, wait) = admin.execute(
        "select attempts, extract(epoch from next_attempt_at - now())"
        " from memchat.embedding_queue where session_id = %s",
        (info.id,),
    ).fetchone()
    assert attempts == 1 and 110 < wait <= 120
    assert await store.claim_embeddings(worker, limit=10, lease_seconds=60) == []
    admin.execute("update memchat.embedding_queue set next_attempt_at = now()")
    (item,) = await store.claim_embeddings(worker, limit=10, lease_seconds=60)
    assert item.attempts == 1
    await store.embeddings_failed(worker, item, retry_in=None)
    assert queued(admin) == {info.id: (2, True)}
    # Given up: not counted as pending, so a caller waiting for 0 is not left
    # waiting, but counted as failed: recall cannot find that message.
    assert await store.embeddings_pending(db, alice) == 0
    backlog = await store.embedding_backlog(db, alice)
    assert (backlog.pending, backlog.failed, backlog.recall_ready) == (0, 1, False)
    # Queued again (the import sent again): waiting again, no longer failed.
    await store.queue_embeddings(db, alice, [info.id])
    assert await store.embedding_backlog(db, alice) == store.EmbeddingBacklog(pending=1, failed=0)


async def test_the_backlog_counts_only_the_callers_live_sessions(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    """Under RLS: another user's given-up session, and the caller's own given
    up but cleared or expired (never recalled anyway), count for nobody."""
    alice, bob = users.create(), users.create()
    kept = await imported(db, alice, "teal", "Lisbon", answered=False)
    cleared = await imported(db, alice, "Miso", answered=False)
    theirs = await imported(db, bob, "red", answered=False)
    await store.queue_embeddings(db, alice, [kept.id, cleared.id])
    await store.queue_embeddings(db, bob, [theirs.id])
    admin.execute("update memchat.embedding_queue set attempts = 8, next_attempt_at = 'infinity'")
    assert await store.embedding_backlog(db, alice) == store.EmbeddingBacklog(pending=0, failed=3)
    admin.execute("update public.chat_sessions set status = 'cleared' where id = %s", (cleared.id,))
    assert await store.embedding_backlog(db, alice) == store.EmbeddingBacklog(pending=0, failed=2)
    assert await store.embedding_backlog(db, bob) == store.EmbeddingBacklog(pending=0, failed=1)
    assert (await store.embedding_backlog(db, users.create())).recall_ready


async def test_cleared_and_expired_sessions_have_nothing_to_embed(
    db: Database, users: UserFactory, admin: psycopg.Connection, worker: Database
) -> None:
    alice = users.create()
    info = await imported(db, alice, "teal")
    await store.queue_embeddings(db, alice, [info.id])
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 s' where id = %s",
        (info.id,),
    )
    assert await store.embeddings_pending(db, alice) == 0
    (item,) = await store.claim_embeddings(worker, limit=10, lease_seconds=60)
    assert await store.unembedded(worker, item, model=MODEL, after=0, limit=10) == []
    assert await store.embeddings_done(worker, item, model=MODEL) is True


async def test_a_deleted_session_leaves_the_queue(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice = users.create()
    info = await imported(db, alice, "teal")
    await store.queue_embeddings(db, alice, [info.id])
    admin.execute("delete from public.chat_sessions where id = %s", (info.id,))
    assert queued(admin) == {}


def test_one_rule_says_which_messages_get_an_embedding(admin: psycopg.Connection) -> None:
    cases = {
        "a question": (messages.human("what is my colour?"), True),
        "an answer": (messages.ai("teal"), True),
        "a tool call with text": (
            messages.ai("let me look", tool_calls=[{"id": "c", "name": "t", "args": {}}]),
            False,
        ),
        "a tool result": (messages.tool("ok", tool_call_id="c", name="t"), False),
        "blank": (messages.human(" \n\t"), False),
        "not text": ({"type": "human", "data": {"content": [{"type": "text"}]}}, False),
    }
    for name, (message, expected) in cases.items():
        (got,) = admin.execute(
            "select memchat.embeddable(%s)", (psycopg.types.json.Jsonb(message),)
        ).fetchone()
        assert got is expected, name


# ------------------------------------------------------ the owner's reembed


@pytest.fixture
def own_database(
    admin: psycopg.Connection, admin_url: str, role_password: str | None
) -> Iterator[Fresh]:
    """A migrated database of this test's own: its column may change size."""
    with fresh_database(admin, admin_url, role_password) as database:
        yield database


async def test_reembed_queues_what_lacks_the_models_embedding_and_resizes_the_column(
    own_database: Fresh,
) -> None:
    owner = own_database.admin
    alice = UserFactory(owner).create()
    api = Database(own_database.api_url)
    try:
        done = await imported(api, alice, "teal", answered=False)
        lacking = await imported(api, alice, "Lisbon", "Miso", answered=False)
    finally:
        await api.close()
    (embedded,) = embeddable_ids(owner, done.id)
    owner.execute(
        "insert into memchat.message_embeddings"
        " (message_id, user_id, session_id, agent_name, created_at, model, embedding)"
        " values (%s, %s, %s, 'default', now(), %s, %s::extensions.vector)",
        (embedded, alice.user_id, done.id, MODEL, store.fragments.vector_literal(vector())),
    )
    facts_made(owner, embedded, alice.user_id)
    # The row the embedding's trigger queued, which that backfill settled.
    owner.execute("delete from memchat.embedding_queue")
    assert store.count_unembedded(owner, MODEL) == 2
    assert store.count_unembedded(owner, "another-model") == 3
    assert store.queue_unembedded(owner, MODEL) == 1
    assert queued(owner) == {lacking.id: (0, False)}
    # Run again after a stop: the same row, ready now, whatever state it was left in.
    owner.execute("update memchat.embedding_queue set lease = gen_random_uuid(), attempts = 3")
    assert store.queue_unembedded(owner, MODEL) == 1
    assert queued(owner) == {lacking.id: (0, False)}

    # What was stored before models were recorded, adopted by a model.
    owner.execute("update memchat.message_embeddings set model = null")
    assert store.count_unembedded(owner, MODEL) == 3
    assert store.adopt_unknown_embeddings(owner, MODEL) == 1
    assert store.count_unembedded(owner, MODEL) == 2

    assert store.embedding_dimensions(owner, role=None) == DIMS
    assert store.resize_embeddings(owner, 384) == 1  # the 512-dimensional one went
    assert store.embedding_dimensions(owner, role=None) == 384
    assert store.embedding_dimensions(owner) == 384  # as the API reads it
    (storage,) = owner.execute(
        "select attstorage from pg_attribute"
        " where attrelid = 'memchat.message_embeddings'::regclass and attname = 'embedding'"
    ).fetchone()
    assert storage == "m"  # kept in the row, as the recall migration made it
    assert not store.has_embeddings(owner)
    assert store.resize_embeddings(owner, 384) == 0  # the same size: nothing to delete
