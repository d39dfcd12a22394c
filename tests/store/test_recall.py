"""memchat.recall and the embeddings table at the SQL level, with hand-made
vectors: row-level security (never another user's rows, whoever asks), the
near-duplicate collapse, the score floor, the window, live sessions, and
only embeddings of the query's model."""

from __future__ import annotations

import math
import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memchat import messages, store
from memchat.config import DUPLICATE_SCORE
from memchat.store.db import Database
from tests.store.conftest import refused
from tests.utils.store_data import (
    acting_as,
    exchange,
    record,
    through_data_api,
    tool_exchange,
    turn,
)
from tests.utils.users import UserFactory

DIMS = 512
MODEL = "test-embedding-model"


def unit(*parts: float) -> list[float]:
    """A unit vector whose first components are `parts` (normalised)."""
    norm = math.sqrt(sum(p * p for p in parts))
    return [p / norm for p in parts] + [0.0] * (DIMS - len(parts))


def angled(similarity: float, axis: int = 1) -> list[float]:
    """A unit vector at exactly `similarity` (cosine) to unit(1), leaning
    towards its own `axis` (vectors on different axes are far apart)."""
    parts = [0.0] * (axis + 1)
    parts[0], parts[axis] = similarity, math.sqrt(1 - similarity * similarity)
    return unit(*parts)


async def say(
    db: Database,
    caller: store.Caller,
    text: str,
    vector: list[float],
    *,
    session_id: uuid.UUID | None = None,
    agent_name: str = "default",
    model: str = MODEL,
    msgs: list[dict[str, Any]] | None = None,
) -> store.SessionInfo:
    """One stored turn whose user message has `vector` (of `model`) as its
    embedding: `text` and its answer, or `msgs` opening with `text`."""
    return await store.record_turn(
        db,
        caller,
        store.Turn(
            session_id=session_id or uuid.uuid4(),
            agent_name=agent_name,
            messages=msgs or exchange(text, f"answer to {text}"),
            title=text,
            ttl=turn(uuid.uuid4(), []).ttl,
            embedding=store.Embedding(model, vector),
        ),
    )


async def recall(
    db: Database, caller: store.Caller, query: list[float], model: str = MODEL, **options: Any
) -> list[store.Hit]:
    # From a new session by default: with none named, recall would treat the
    # active session (the last one written) as the turn's and leave its window out.
    args: dict[str, Any] = {
        "session_id": uuid.uuid4(),
        "agent_name": "default",
        "window": 10,
        "k": 3,
        "min_score": 0.3,
        "duplicate_score": DUPLICATE_SCORE,
    } | options
    throttle = args.pop("throttle", None)
    asked = store.RecallQuery(embedding=store.Embedding(model, query), **args)
    return await store.recall(db, caller, asked, throttle=throttle)


async def test_hits_are_the_callers_best_first_with_their_answers(
    db: Database, users: UserFactory
) -> None:
    alice = users.create()
    near = await say(db, alice, "near", angled(0.8, axis=1))
    await say(db, alice, "far", angled(0.5, axis=2))
    await say(db, alice, "unrelated", angled(0.1, axis=3))

    hits = await recall(db, alice, unit(1))

    assert [h.question for h in hits] == ["near", "far"]  # 0.1 is below the floor
    assert [round(h.score, 3) for h in hits] == [0.8, 0.5]
    assert hits[0].answer == "answer to near" and hits[0].session_id == near.id
    assert hits[0].title == "near"


async def test_each_answer_is_the_first_after_its_message_that_calls_no_tool(
    db: Database, users: UserFactory
) -> None:
    # The hit's and its neighbours' answers: the assistant message asking for
    # a tool and the tool's result are passed over (memchat.answer_after).
    alice = users.create()
    session = uuid.uuid4()
    for text, vector in (("opening", angled(0.1, axis=3)), ("near", angled(0.8, axis=1))):
        await say(
            db,
            alice,
            text,
            vector,
            session_id=session,
            msgs=tool_exchange(text, f"answer to {text}"),
        )
    await say(db, alice, "closing", angled(0.1, axis=4), session_id=session)
    await say(db, alice, "unanswered", angled(0.1, axis=5), msgs=[messages.human("unanswered")])

    (hit,) = await recall(db, alice, unit(1), k=1)

    assert (hit.question, hit.answer) == ("near", "answer to near")
    assert hit.before is not None and hit.after is not None
    assert (hit.before.question, hit.before.answer) == ("opening", "answer to opening")
    assert (hit.after.question, hit.after.answer) == ("closing", "answer to closing")
    (alone,) = await recall(db, alice, angled(0.1, axis=5), k=1, min_score=0.9)
    assert (alone.question, alone.answer, alone.before, alone.after) == (
        "unanswered",
        None,
        None,
        None,
    )


async def test_near_duplicates_collapse_at_point_nine_five(
    db: Database, users: UserFactory
) -> None:
    alice = users.create()
    await say(db, alice, "best", unit(1))
    await say(db, alice, "same thing again", unit(1, 0.1))  # ~0.995 to "best"
    await say(db, alice, "related", angled(0.85, axis=2))  # 0.85 to "best": kept
    hits = await recall(db, alice, unit(1), k=3)
    assert [h.question for h in hits] == ["best", "related"]


async def test_the_duplicate_score_is_the_callers(db: Database, users: UserFactory) -> None:
    # MEMORY_RECALL_DUPLICATE_SCORE: per model (e5's unrelated texts score
    # about 0.8, so 0.95 there collapses different memories).
    alice = users.create()
    await say(db, alice, "best", unit(1))
    await say(db, alice, "same thing again", unit(1, 0.1))  # ~0.995 to "best"
    await say(db, alice, "related", angled(0.85, axis=2))
    kept = await recall(db, alice, unit(1), k=3, duplicate_score=0.999)
    assert [h.question for h in kept] == ["best", "same thing again", "related"]
    fewer = await recall(db, alice, unit(1), k=3, duplicate_score=0.8)
    assert [h.question for h in fewer] == ["best"]


async def test_a_fact_and_its_update_are_both_recalled(db: Database, users: UserFactory) -> None:
    # 0.97 to the query each, 0.94 to each other: close, yet two memories
    # (an update of a fact says nearly what the fact said); 0.9 collapsed them.
    alice = users.create()
    await say(db, alice, "I have 3 bikes", angled(0.97, axis=1))
    await say(db, alice, "I have 4 bikes now", angled(0.97, axis=2))
    hits = await recall(db, alice, unit(1), k=3)
    assert sorted(h.question for h in hits) == ["I have 3 bikes", "I have 4 bikes now"]


async def test_another_session_comes_before_a_third_hit_of_one_session(
    db: Database, users: UserFactory
) -> None:
    # Each hit already taken from a session makes its next one worth 0.9
    # times less: "B" (4th by meaning) comes before "A2" (2nd), "A3" last.
    alice = users.create()
    one = uuid.uuid4()
    for text, similarity, axis in (("A1", 0.95, 1), ("A2", 0.94, 2), ("A3", 0.93, 3)):
        await say(db, alice, text, angled(similarity, axis=axis), session_id=one)
    await say(db, alice, "B", angled(0.92, axis=4))
    hits = await recall(db, alice, unit(1), k=4)
    assert [h.question for h in hits] == ["A1", "B", "A2", "A3"]
    # The same exchanges, each in a session of its own: by meaning alone.
    bob = users.create()
    for text, similarity, axis in (("A1", 0.95, 1), ("A2", 0.94, 2), ("A3", 0.93, 3)):
        await say(db, bob, text, angled(similarity, axis=axis), session_id=uuid.uuid4())
    assert [h.question for h in await recall(db, bob, unit(1), k=3)] == ["A1", "A2", "A3"]


async def test_recall_respects_k_after_collapsing(db: Database, users: UserFactory) -> None:
    alice = users.create()
    for i in range(6):
        await say(db, alice, f"fact {i}", unit(1, 0.05 * i, 1.0 * i))
    assert len(await recall(db, alice, unit(1), k=2, min_score=-1)) == 2
    assert await recall(db, alice, unit(1), k=0) == []


async def test_only_the_agent_asked_about(db: Database, users: UserFactory) -> None:
    alice = users.create()
    await say(db, alice, "for the cook", unit(1), agent_name="cook")
    assert await recall(db, alice, unit(1), agent_name="painter") == []
    assert len(await recall(db, alice, unit(1), agent_name="cook")) == 1


async def test_the_window_of_the_turns_session_is_left_out(
    db: Database, users: UserFactory
) -> None:
    alice = users.create()
    info = await say(db, alice, "old fact", unit(1))
    await say(db, alice, "filler", angled(0.0, axis=2), session_id=info.id)
    # The window of 2 holds "filler" and its answer: "old fact" is outside it.
    outside = await recall(db, alice, unit(1), session_id=info.id, window=2)
    inside = await recall(db, alice, unit(1), session_id=info.id, window=4)
    assert [h.question for h in outside] == ["old fact"] and inside == []
    # With no session named, the active one (this one) is the turn's.
    assert await recall(db, alice, unit(1), session_id=None, window=4) == []


async def test_expired_and_cleared_sessions_are_not_recalled(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice = users.create()
    expired = await say(db, alice, "expired fact", unit(1))
    cleared = await say(db, alice, "cleared fact", unit(1, 0.5))
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 second' where id = %s",
        (expired.id,),
    )
    await store.clear_session(
        db, alice, session_id=cleared.id, agent_name="default", ttl=turn(cleared.id, []).ttl
    )
    assert await recall(db, alice, unit(1)) == []


# ------------------------------------------------------- row-level security


@pytest.fixture
async def two_users(db: Database, users: UserFactory) -> tuple[store.Caller, store.Caller, int]:
    """A has one embedded message; B has none. Returns (A, B, A's message id)."""
    a, b = users.create(), users.create()
    info = await say(db, a, "a secret of A", unit(1))
    hits = await recall(db, a, unit(1))
    assert [h.session_id for h in hits] == [info.id]
    return a, b, hits[0].message_id


async def test_b_recalls_nothing_of_a_even_with_a_s_own_vector(
    db: Database, two_users: tuple[store.Caller, store.Caller, int]
) -> None:
    _, b, _ = two_users
    assert await recall(db, b, unit(1), min_score=-1) == []


def test_b_sees_and_writes_no_embedding_of_a(
    conn: psycopg.Connection,
    admin: psycopg.Connection,
    two_users: tuple[store.Caller, store.Caller, int],
) -> None:
    a, b, message_id = two_users
    (session_id,) = admin.execute(
        "select session_id from public.chat_message_history where id = %s", (message_id,)
    ).fetchone()
    params = {
        "a": a.user_id,
        "b": b.user_id,
        "m": message_id,
        "s": session_id,
        "v": store.fragments.vector_literal(unit(1)),
    }
    insert = (
        "insert into memchat.message_embeddings"
        " (message_id, user_id, session_id, agent_name, created_at, embedding)"
        " values (%(m)s, %(owner)s, %(s)s, 'default', now(), %(v)s::extensions.vector)"
    )
    with acting_as(conn, b.claims):
        (seen,) = conn.execute(
            "select count(*) from memchat.message_embeddings where user_id = %(a)s", params
        ).fetchone()
        assert seen == 0
        # An embedding for A's message, in B's name or in A's: both refused.
        assert refused(conn, insert, params | {"owner": b.user_id})
        assert refused(conn, insert, params | {"owner": a.user_id})
        assert refused(
            conn,
            "update memchat.message_embeddings set agent_name = 'x' where user_id = %(a)s",
            params,
        )
        assert refused(conn, "delete from memchat.message_embeddings", params)


def test_the_hits_rows_are_only_the_callers(
    conn: psycopg.Connection, two_users: tuple[store.Caller, store.Caller, int]
) -> None:
    # memchat.recall_hits builds the rows of the ids recall chose; called
    # directly with A's message id, it gives B nothing (it runs under RLS).
    a, b, message_id = two_users
    call = "select memchat.recall_hits(array[%s]::bigint[], array[0.9], null, null)"
    with acting_as(conn, a.claims):
        (rows,) = conn.execute(call, (message_id,)).fetchone()
    assert [(r["message_id"], r["question"], r["score"]) for r in rows] == [
        (message_id, "a secret of A", 0.9)
    ]
    with acting_as(conn, b.claims):
        (rows,) = conn.execute(call, (message_id,)).fetchone()
    assert rows == []


def test_the_data_api_cannot_read_vectors(
    gateway: psycopg.Connection, two_users: tuple[store.Caller, store.Caller, int]
) -> None:
    a, _, _ = two_users
    with through_data_api(gateway, a.claims):
        assert refused(gateway, "select * from memchat.message_embeddings", {})
        assert refused(
            gateway,
            "select memchat.recall(%(u)s, null, 'default', 10, %(v)s::extensions.vector, 'm',"
            " null, 3, 0, 0.9, null, null)",
            {"u": a.user_id, "v": store.fragments.vector_literal(unit(1))},
        )
        assert refused(
            gateway, "select memchat.recall_hits(array[1]::bigint[], array[1.0], null, null)", {}
        )


async def test_an_embedding_goes_with_its_message(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice = users.create()
    info = await record(db, alice, exchange("q", "a"))
    await say(db, alice, "embedded", unit(1), session_id=info.id)
    admin.execute("delete from public.chat_message_history where session_id = %s", (info.id,))
    (left,) = admin.execute(
        "select count(*) from memchat.message_embeddings where session_id = %s", (info.id,)
    ).fetchone()
    assert left == 0


async def test_only_embeddings_of_the_querys_model_are_compared(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    """Two models' vectors live side by side (a model changed, a backfill
    under way): each query sees its own model's only, however close the
    other's are."""
    alice = users.create()
    old = await say(db, alice, "old model", unit(1), model="model-a")
    new = await say(db, alice, "new model", angled(0.6), model="model-b")
    assert [h.message_id for h in await recall(db, alice, unit(1), "model-b")] == [
        new.message_ids[0]
    ]
    assert [h.message_id for h in await recall(db, alice, unit(1), "model-a")] == [
        old.message_ids[0]
    ]
    assert await recall(db, alice, unit(1), "model-c", min_score=-1) == []
    stored = admin.execute(
        "select message_id, model from memchat.message_embeddings where user_id = %s"
        " order by message_id",
        (alice.user_id,),
    ).fetchall()
    assert stored == [(old.message_ids[0], "model-a"), (new.message_ids[0], "model-b")]


async def test_an_embedding_of_unknown_model_is_never_recalled(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    """What was stored before models were recorded has none (null): no query
    names it, so it is never compared with anything."""
    alice = users.create()
    info = await say(db, alice, "from before", unit(1))
    admin.execute(
        "update memchat.message_embeddings set model = null where message_id = %s",
        (info.message_ids[0],),
    )
    assert await recall(db, alice, unit(1), min_score=-1) == []


@pytest.mark.parametrize(
    "vector",
    [unit(1), unit(0.25, -1e-7, 3e-39, 1.5), [1e38, -3.4e38, 0.1, -0.0] + [0.0] * (DIMS - 4)],
    ids=["axis", "tiny-and-subnormal", "extremes"],
)
def test_a_vector_parameter_reaches_pgvector_as_its_float32s(
    admin_url: str, vector: list[float]
) -> None:
    """A turn's vector is sent binary (fragments.Vector, on every connection
    the store makes): pgvector reads the same float32s the text form gives
    it, coordinate for coordinate, and None is NULL."""
    with store.connect(admin_url) as conn:
        both = conn.execute(
            "select %s::extensions.vector::real[], %s::extensions.vector::real[]",
            (store.fragments.vector_param(vector), store.fragments.vector_literal(vector)),
        ).fetchone()
        assert both is not None
        binary, text = both
        assert binary == text and len(binary) == DIMS
        (null,) = conn.execute(
            "select %s::extensions.vector is null", (store.fragments.vector_param(None),)
        ).fetchone()
        assert null is True


# Chat text that web-search syntax would read as operators, and text of every kind.
AWKWARD = [
    "bike-related",
    "-pineapple",
    "so-so -tired",
    '"a phrase"',
    "or",
    "O'Brien's",
    "C:\\temp\\x'y",
    "e-mail",
    "it was -5 degrees",
    "a.b@c.com",
    "http://example.org/it's",
    "!",
    "<->",
    "&",
    "|",
    "'quoted'",
    "state-of-the-art",
]
texts = st.lists(
    st.one_of(st.sampled_from(AWKWARD), st.text(max_size=20).filter(lambda t: "\x00" not in t)),
    max_size=8,
).map(" ".join)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=texts)
def test_recalls_words_are_the_plain_words_of_any_text(
    admin: psycopg.Connection, text: str
) -> None:
    """memchat.any_words (supabase/schemas/functions/words.sql): the word list matches
    any of the message's lexemes, each alone, and nothing else. Web-search
    syntax made a hyphenated word a phrase (a round saying one of its parts
    did not match) and a minus a negation (every round without the word
    matched, and the word budget was bypassed)."""
    lexemes, words, nodes, alone, empty = admin.execute(
        "with q as (select memchat.any_words(%(t)s) as q,"
        " tsvector_to_array(to_tsvector('english', %(t)s)) as l)"
        " select l, q::text, numnode(q.q),"
        " (select bool_and(array_to_tsvector(array[w]) @@ q.q) from unnest(l) w),"
        " ''::tsvector @@ q.q"
        " from q",
        {"t": text},
    ).fetchone()
    if not lexemes:
        assert words is None
        return
    # Every lexeme alone matches (no phrase needs its neighbours), a round
    # without any of them does not (no negation), and the query is the
    # lexemes and the ORs between them, nothing more.
    assert alone is True
    assert empty is False
    assert nodes == 2 * len(lexemes) - 1, words
