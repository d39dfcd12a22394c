"""Clearing sessions, listing them, long-term notes, account deletion, export."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from memchat import messages, store
from memchat.errors import NotesConflict, SessionNotFound
from tests.utils.store_data import (
    TTL,
    contents,
    exchange,
    record,
    session_row,
    snapshot,
    tool_exchange,
)

# ------------------------------------------------------------ clear session


async def clear(db, caller, session_id=None, agent_name="default") -> store.Cleared:
    return await store.clear_session(
        db, caller, session_id=session_id, agent_name=agent_name, ttl=TTL
    )


def assert_cleared(admin, session_id: uuid.UUID) -> None:
    row = session_row(admin, session_id)
    assert row is not None
    assert (row["status"], row["message_count"], row["title"]) == ("cleared", 0, None)
    assert contents(admin, session_id) == []


@pytest.mark.parametrize("by", ["id", "active-pointer"])
async def test_clear_session_forgets_messages_and_activates_a_fresh_session(db, admin, users, by):
    alice = users.create()
    info = await record(db, alice, exchange("hello", "hi"), title="hello")
    await record(db, alice, tool_exchange("tea?", "tea."), session_id=info.id)

    cleared = await clear(db, alice, info.id if by == "id" else None)

    assert cleared.cleared_session_id == info.id
    assert cleared.deleted_messages == 6
    assert_cleared(admin, info.id)
    fresh = cleared.new_session
    assert fresh.id != info.id
    assert (fresh.status, fresh.message_count, fresh.agent_name) == ("active", 0, "default")
    assert fresh.expires_at > datetime.now(UTC)
    active = await store.active_session(db, alice, "default")
    assert active == fresh
    ctx = await store.load_context(db, alice, session_id=None, agent_name="default", window=10)
    assert ctx.session is not None and ctx.session.id == fresh.id and ctx.messages == []


async def test_clear_session_keeps_other_sessions(db, admin, users):
    alice = users.create()
    kept = await record(db, alice, exchange("keep", "kept"), agent_name="other")
    gone = await record(db, alice, exchange("forget", "forgotten"))

    await clear(db, alice, gone.id)

    assert contents(admin, kept.id) == [("human", "keep"), ("ai", "kept")]
    assert (await store.active_session(db, alice, "other")) == kept


async def test_clear_without_an_active_session_is_not_found(db, admin, users):
    alice = users.create()
    await record(db, alice, exchange("hello", "hi"), agent_name="other")

    with pytest.raises(SessionNotFound):
        await clear(db, alice, None, agent_name="default")

    assert session_row_count(admin, alice.user_id) == 1


async def test_clear_an_unknown_session_is_not_found(db, admin, users):
    alice = users.create()

    with pytest.raises(SessionNotFound):
        await clear(db, alice, uuid.uuid4())

    assert session_row_count(admin, alice.user_id) == 0


def session_row_count(admin, user_id: uuid.UUID) -> int:
    (count,) = admin.execute(
        "select count(*) from public.chat_sessions where user_id = %s", (user_id,)
    ).fetchone()
    return count


# ------------------------------------------------------------ list sessions


async def sessions_at(db, admin, caller, times: list[tuple[str, datetime]]) -> list[uuid.UUID]:
    """One session per (agent, last_active_at), returned in creation order."""
    ids = []
    for agent, at in times:
        info = await record(db, caller, exchange("q", "a"), agent_name=agent)
        admin.execute(
            "update public.chat_sessions set last_active_at = %s where id = %s", (at, info.id)
        )
        ids.append(info.id)
    return ids


async def test_list_sessions_newest_first_with_agent_filter(db, admin, users):
    alice = users.create()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ids = await sessions_at(
        db,
        admin,
        alice,
        [("default", t0), ("other", t0 + timedelta(hours=2)), ("default", t0 + timedelta(hours=1))],
    )

    everything = await store.list_sessions(db, alice, agent_name=None, limit=10)
    default = await store.list_sessions(db, alice, agent_name="default", limit=10)
    none = await store.list_sessions(db, alice, agent_name="nobody", limit=10)

    assert [s.id for s in everything] == [ids[1], ids[2], ids[0]]
    assert [s.id for s in default] == [ids[2], ids[0]]
    assert none == []
    assert everything[0].last_active_at == t0 + timedelta(hours=2)


async def test_list_sessions_keyset_pagination_visits_each_session_once(db, admin, users):
    alice = users.create()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    # Two pairs share a last_active_at: the id breaks the tie.
    times = [
        t0,
        t0,
        t0 + timedelta(minutes=1),
        t0 + timedelta(minutes=2),
        t0 + timedelta(minutes=2),
    ]
    ids = await sessions_at(db, admin, alice, [("default", t) for t in times])

    pages: list[list[store.SessionInfo]] = []
    before = None
    while True:
        page = await store.list_sessions(db, alice, agent_name=None, limit=2, before=before)
        if not page:
            break
        pages.append(page)
        before = (page[-1].last_active_at, page[-1].id)

    assert [len(p) for p in pages] == [2, 2, 1]
    seen = [s.id for p in pages for s in p]
    expected = sorted(zip(times, ids, strict=True), key=lambda p: (p[0], p[1]), reverse=True)
    assert seen == [i for _, i in expected]


async def test_active_session(db, admin, users):
    alice = users.create()
    assert await store.active_session(db, alice, "default") is None

    first = await record(db, alice, exchange("one", "1"))
    second = await record(db, alice, exchange("two", "2"))
    active = await store.active_session(db, alice, "default")
    assert active is not None and active.id == second.id != first.id

    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute' where id = %s",
        (second.id,),
    )
    assert await store.active_session(db, alice, "default") is None


# -------------------------------------------------------------------- notes


async def test_notes_versioning(db, users):
    alice = users.create()
    empty = await store.read_notes(db, alice, "default")
    assert (empty.notes, empty.version, empty.updated_at) == ("", 0, None)

    first = await store.save_notes(db, alice, "default", "# Name\nAlice", expected_version=0)
    second = await store.save_notes(db, alice, "default", "# Name\nAlice B.", expected_version=1)
    assert (first.version, second.version) == (1, 2)

    with pytest.raises(NotesConflict):
        await store.save_notes(db, alice, "default", "stale", expected_version=1)
    with pytest.raises(NotesConflict):
        await store.save_notes(db, alice, "default", "stale", expected_version=0)
    current = await store.read_notes(db, alice, "default")
    assert (current.notes, current.version) == ("# Name\nAlice B.", 2)

    forced = await store.save_notes(db, alice, "default", "forced")
    assert (forced.notes, forced.version) == ("forced", 3)


async def test_notes_are_per_agent_and_can_be_deleted(db, users):
    alice = users.create()
    await store.save_notes(db, alice, "default", "default notes")
    await store.save_notes(db, alice, "other", "other notes")

    assert await store.delete_notes(db, alice, "default") == (1, 1)  # the notes, one version
    assert await store.delete_notes(db, alice, "default") == (0, 0)

    assert (await store.read_notes(db, alice, "default")).version == 0
    assert (await store.read_notes(db, alice, "other")).notes == "other notes"


# ---------------------------------------------------------- delete account


async def test_delete_user_data_removes_everything_and_only_the_users(db, admin, users):
    alice, bob = users.create(), users.create()
    s1 = await record(db, alice, exchange("hello", "hi"), notes="likes tea")
    await record(db, alice, tool_exchange("tea?", "tea."), session_id=s1.id)
    await record(db, alice, exchange("other", "agent"), agent_name="other", notes="x")
    await store.clear_session(db, alice, session_id=None, agent_name="other", ttl=TTL)
    await record(db, bob, exchange("bob", "here"), notes="bob notes")
    bob_before = snapshot(admin, bob.user_id)

    counts = await store.delete_user_data(db, alice)

    assert counts == {
        "memories": 0,
        "messages": 6,
        "active_sessions": 2,
        "sessions": 3,
        "long_term_memory": 2,
    }
    assert snapshot(admin, alice.user_id) == {table: [] for table in bob_before}
    assert snapshot(admin, bob.user_id) == bob_before
    assert await store.delete_user_data(db, alice) == dict.fromkeys(counts, 0)


# ------------------------------------------------------------------- export

UNICODE = 'Grüße, 世界! 👋🏽 עברית e\u0301 \u200b"quotes" \\ and\nnewlines'


async def collect(iterator) -> list:
    return [batch async for batch in iterator]


async def test_export_returns_everything_in_order_with_unicode_intact(db, admin, users):
    alice, bob = users.create(), users.create()
    first = await record(db, alice, exchange(UNICODE, "réponse ✓"), title="über", notes=UNICODE)
    sent = [
        messages.human("question 2"),
        messages.ai(
            "",
            tool_calls=[{"id": "c1", "name": "manage_long_term_memory", "args": {"k": "ü"}}],
            model="m",
        ),
        messages.tool("ok", tool_call_id="c1", name="manage_long_term_memory"),
        messages.ai(
            "answer 2", model="gpt-test", usage={"prompt_tokens": 3, "completion_tokens": 4}
        ),
    ]
    await record(db, alice, sent, session_id=first.id, client_message_id="cm-ü")
    second = await record(db, alice, exchange("second", "session"), agent_name="other")
    third = await record(db, alice, exchange("third", "session"))
    bobs = await record(db, bob, exchange("bob's", "not exported"))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for offset, sid in enumerate([second.id, first.id, third.id]):
        admin.execute(
            "update public.chat_sessions set created_at = %s where id = %s",
            (t0 + timedelta(minutes=offset), sid),
        )

    async with store.snapshot(db, alice, whole_account=True) as reader:
        session_batches = await collect(reader.sessions(batch=2))
        info = await reader.session(first.id)
        message_batches = await collect(reader.messages(first.id, batch=4))
        foreign = await reader.session(bobs.id)
        pointers, notes = await reader.account_extras()

    assert [[s.id for s in batch] for batch in session_batches] == [
        [second.id, first.id],
        [third.id],
    ]
    assert info is not None and info.title == "über" and info.message_count == 6
    assert foreign is None

    assert [len(batch) for batch in message_batches] == [4, 2]
    exported = [json.loads(text) for batch in message_batches for text in batch]
    assert [(m["role"], m["content"]) for m in exported] == [
        ("user", UNICODE),
        ("assistant", "réponse ✓"),
        ("user", "question 2"),
        ("assistant", ""),
        ("tool", "ok"),
        ("assistant", "answer 2"),
    ]
    assert [m["id"] for m in exported] == sorted(m["id"] for m in exported)
    assert exported[0]["metadata"] == {}
    assert exported[2]["metadata"] == {"client_message_id": "cm-ü"}
    assert exported[3]["metadata"]["tool_calls"][0]["args"] == {"k": "ü"}
    assert exported[4]["metadata"] == {"tool_call_id": "c1", "name": "manage_long_term_memory"}
    assert exported[5]["metadata"] == {
        "model": "gpt-test",
        "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
    }

    assert [(p["agent_name"], p["active_session_id"]) for p in pointers] == [
        ("default", str(third.id)),
        ("other", str(second.id)),
    ]
    assert [(n["agent_name"], n["notes"], n["version"]) for n in notes] == [("default", UNICODE, 1)]


async def test_export_messages_with_an_exact_multiple_of_the_batch(db, users):
    alice = users.create()
    info = await record(db, alice, exchange("a", "b") + exchange("c", "d"))

    async with store.snapshot(db, alice, whole_account=False) as reader:
        batches = await collect(reader.messages(info.id, batch=2))

    assert [[json.loads(t)["content"] for t in batch] for batch in batches] == [
        ["a", "b"],
        ["c", "d"],
    ]


async def test_export_memories_earliest_stated_first_whatever_their_ids(db, admin, users):
    """The export's memories come in the order they were stated (a message's
    in order), a batch at a time, not in the order they were stored: an
    import brings old memories after newer ones."""
    alice, bob = users.create(), users.create()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    stored = [
        (t0 + timedelta(days=2), 7, 0),
        (t0, 9, 1),
        (t0, 9, 0),
        (t0 + timedelta(days=1), 3, 0),
    ]
    for owner in (alice, bob):
        for at, message_id, ordinal in stored:
            admin.execute(
                "insert into memchat.memories (user_id, agent_name, kind, text, session_id,"
                " message_id, ordinal, created_at)"
                " values (%s, 'default', 'fact', %s, %s, %s, %s, %s)",
                (
                    owner.user_id,
                    f"memory {message_id}.{ordinal}",
                    uuid.uuid4(),
                    message_id,
                    ordinal,
                    at,
                ),
            )
    async with store.snapshot(db, alice, whole_account=True) as reader:
        batches = await collect(reader.memories(batch=2))
    assert [[json.loads(text)["text"] for text in batch] for batch in batches] == [
        ["memory 9.0", "memory 9.1"],
        ["memory 3.0", "memory 7.0"],
    ]
