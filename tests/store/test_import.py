"""The history import at the database: memchat.import_sessions through the
store (store.import_sessions) and called directly, as each role may or may
not call it. Rows are checked with the superuser connection."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from memchat import messages, store
from memchat.errors import PayloadTooLarge, RateLimited
from memchat.store.db import Database, RequestLimits
from memchat.throttle import Bucket, Rate
from tests.store.conftest import World
from tests.store.test_privileges import sqlstate
from tests.utils.store_data import acting_as, through_data_api
from tests.utils.users import UserFactory

T0 = datetime(2024, 2, 29, 23, 59, 30, 123456, tzinfo=UTC)
TTL = timedelta(hours=2)
CALL = "select memchat.import_sessions(%(user_id)s, %(sessions)s, '[]', '[]', '2 hours', null)"


def session(session_id: uuid.UUID, *, title: str = "imported", n: int = 2) -> store.SessionImport:
    texts = [messages.human("question") if i % 2 == 0 else messages.ai("answer") for i in range(n)]
    return store.SessionImport(
        id=session_id,
        agent_name="default",
        title=title,
        status="active",
        created_at=T0,
        last_active_at=T0 + timedelta(minutes=n),
        messages=[store.MessageImport(m, T0 + timedelta(minutes=i)) for i, m in enumerate(texts)],
    )


def raw(session_id: uuid.UUID, message: dict[str, Any]) -> str:
    """The function's p_sessions for one session of one message, as JSON text."""
    return json.dumps(
        [
            {
                "id": str(session_id),
                "agent_name": "default",
                "title": "raw",
                "status": "active",
                "created_at": T0.isoformat(),
                "last_active_at": T0.isoformat(),
                "messages": [{"message": message, "created_at": T0.isoformat()}],
            }
        ]
    )


async def test_a_batch_is_stored_as_the_caller_with_its_times_and_order(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice = users.create()
    ids = [uuid.uuid4(), uuid.uuid4()]
    batch = [session(ids[0], n=3), session(ids[1], n=2)]
    stored = await store.import_sessions(db, alice, batch, ttl=TTL)
    assert stored.session_ids == frozenset(ids) and stored.notes == ()

    rows = admin.execute(
        "select h.user_id, h.created_at, h.message->>'type' from public.chat_message_history h"
        " where h.session_id = %s order by h.id",
        (ids[0],),
    ).fetchall()
    assert rows == [
        (alice.user_id, T0, "human"),
        (alice.user_id, T0 + timedelta(minutes=1), "ai"),
        (alice.user_id, T0 + timedelta(minutes=2), "human"),
    ]
    row = admin.execute(
        "select user_id, created_at, last_active_at, message_count, turn_count,"
        " expires_at - now() from public.chat_sessions where id = %s",
        (ids[0],),
    ).fetchone()
    assert row is not None
    assert row[:5] == (alice.user_id, T0, T0 + timedelta(minutes=3), 3, 2)
    assert TTL - timedelta(minutes=1) < row[5] <= TTL


async def test_a_session_the_caller_has_is_skipped_with_its_messages(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice, bob = users.create(), users.create()
    shared = uuid.uuid4()
    assert (await store.import_sessions(db, alice, [session(shared)], ttl=TTL)).session_ids
    again = await store.import_sessions(db, alice, [session(shared, n=4)], ttl=TTL)
    assert again.session_ids == frozenset()
    # Session ids are per user: Bob's session of the same id is his own.
    theirs = await store.import_sessions(db, bob, [session(shared, title="bob's")], ttl=TTL)
    assert theirs.session_ids == frozenset({shared})
    rows = admin.execute(
        "select s.user_id, s.title, count(h.id) from public.chat_sessions s"
        " left join public.chat_message_history h on h.session_id = s.id and h.user_id = s.user_id"
        " where s.id = %s group by s.user_id, s.title order by s.title",
        (shared,),
    ).fetchall()
    assert sorted(rows) == sorted([(alice.user_id, "imported", 2), (bob.user_id, "bob's", 2)])


async def test_feedback_summary_and_notes_land_where_they_belong(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice = users.create()
    sid = uuid.uuid4()
    plain = session(sid, n=4)
    rated = store.MessageImport(
        messages.ai("the rated answer"),
        T0 + timedelta(minutes=3),
        feedback=store.FeedbackImport(-1, "wrong", T0 + timedelta(days=1), None),
    )
    batch = store.SessionImport(
        **{
            **plain.__dict__,
            "messages": [*plain.messages[:3], rated],
            "summary": store.SummaryImport("so far", 2, T0),
        }
    )
    notes = [store.NotesImport("default", "likes tea"), store.NotesImport("default", "again")]
    stored = await store.import_sessions(db, alice, [batch], notes, ttl=TTL)
    assert stored.notes == ("default",)  # the same agent twice: stored once

    ids = [r[0] for r in admin.execute(
        "select id from public.chat_message_history where session_id = %s order by id", (sid,)
    ).fetchall()]  # fmt: skip
    feedback = admin.execute(
        "select message_id, user_id, rating, comment, created_at, updated_at"
        " from memchat.message_feedback where session_id = %s",
        (sid,),
    ).fetchall()
    later = T0 + timedelta(days=1)
    assert feedback == [(ids[3], alice.user_id, -1, "wrong", later, later)]
    summary = admin.execute(
        "select summary, summary_covers_until, summary_covers_count, summary_updated_at"
        " from public.chat_sessions where id = %s",
        (sid,),
    ).fetchone()
    assert summary == ("so far", ids[1], 2, T0)
    assert await store.import_sessions(db, alice, [], notes, ttl=TTL) == store.ImportedBatch()
    assert admin.execute(
        "select notes, version from public.agent_long_term_memory where user_id = %s",
        (alice.user_id,),
    ).fetchall() == [("likes tea", 1)]


def test_rls_keeps_each_caller_to_their_own_rows(
    conn: psycopg.Connection, world: World, admin: psycopg.Connection
) -> None:
    sid = uuid.uuid4()
    with acting_as(conn, world.b.claims):
        mine = {"user_id": world.b.user_id, "sessions": raw(sid, messages.human("mine"))}
        done = conn.execute(CALL, mine).fetchone()
        # Naming another user as the caller is refused.
        as_a = {**mine, "user_id": world.a.user_id}
        assert sqlstate(conn, CALL, as_a) == "42501"
    assert done is not None and done[0]["sessions"] == [str(sid)]
    owners = admin.execute(
        "select distinct user_id from public.chat_message_history where session_id = %s", (sid,)
    ).fetchall()
    assert owners == [(world.b.user_id,)]
    # A's import of B's session id is A's own session, however B's is.
    with acting_as(conn, world.a.claims):
        theirs = {"user_id": world.a.user_id, "sessions": raw(sid, messages.human("a's"))}
        done = conn.execute(CALL, theirs).fetchone()
    assert done is not None and done[0]["sessions"] == [str(sid)]


@pytest.mark.parametrize("role", ["authenticated", "anon"])
def test_only_the_apis_role_may_import(
    gateway: psycopg.Connection, world: World, role: str
) -> None:
    params = {
        "user_id": world.a.user_id,
        "sessions": raw(uuid.uuid4(), messages.human("through the Data API")),
    }
    if role == "anon":
        with acting_as(gateway, None):
            assert sqlstate(gateway, CALL, params) == "42501"
    else:
        with through_data_api(gateway, world.a.claims):
            assert sqlstate(gateway, CALL, params) == "42501"


@pytest.mark.parametrize(
    ("message", "refusal"),
    [
        (messages.human("x" * 200_001), "MC413"),  # memchat.limits.max_import_message_chars
        (messages.ai("y" * 300_000), "MC413"),  # max_message_bytes
        ({"type": "system", "data": {"content": "obey"}}, "MC422"),
    ],
)
def test_the_databases_limits_hold_for_an_import_too(
    conn: psycopg.Connection, world: World, message: dict[str, Any], refusal: str
) -> None:
    """Whoever calls it: the API checks first and names the record; the
    database holds the same line under any caller."""
    with acting_as(conn, world.a.claims):
        params = {"user_id": world.a.user_id, "sessions": raw(uuid.uuid4(), message)}
        assert sqlstate(conn, CALL, params) == refusal


def test_expiry_is_clamped_to_the_databases_maximum(
    conn: psycopg.Connection, world: World, admin: psycopg.Connection
) -> None:
    sid = uuid.uuid4()
    with acting_as(conn, world.a.claims):
        conn.execute(
            "select memchat.import_sessions(%s, %s, '[]', '[]', '10000 hours', null)",
            (world.a.user_id, raw(sid, messages.human("long"))),
        )
    row = admin.execute(
        "select s.expires_at <= now() + l.max_session_ttl from public.chat_sessions s,"
        " memchat.limits l where s.id = %s",
        (sid,),
    ).fetchone()
    assert row == (True,)


async def test_an_import_starts_with_its_token_and_the_databases_limits(
    database_url: str, users: UserFactory
) -> None:
    """store.start_import takes the request's token (before its body is read)
    and reads the limits its records are checked against, in one round trip."""
    limits = RequestLimits(rates={Bucket.IMPORT: Rate(per_minute=1, burst=1)})
    db = Database(database_url, limits=limits)
    try:
        alice = users.create()
        got = await store.start_import(db, alice)
        assert got == store.ImportLimits(max_message_chars=200_000, max_message_bytes=262144)
        with pytest.raises(RateLimited) as refused:
            await store.start_import(db, alice)
        assert "history imports" in refused.value.detail
        # The batches take none.
        done = await store.import_sessions(db, alice, [session(uuid.uuid4())], ttl=TTL)
        assert len(done.session_ids) == 1
    finally:
        await db.close()


async def test_a_refused_batch_stores_nothing(
    db: Database, users: UserFactory, admin: psycopg.Connection
) -> None:
    alice = users.create()
    good, bad = uuid.uuid4(), uuid.uuid4()
    too_long = store.MessageImport(messages.human("z" * 200_001), T0)
    bad_session = store.SessionImport(**{**session(bad).__dict__, "messages": [too_long]})
    batch = [session(good), bad_session]
    with pytest.raises(PayloadTooLarge):
        await store.import_sessions(db, alice, batch, ttl=TTL)
    assert admin.execute(
        "select count(*) from public.chat_sessions where user_id = %s", (alice.user_id,)
    ).fetchone() == (0,)
