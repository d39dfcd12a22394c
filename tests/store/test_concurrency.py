"""Concurrent turns: nothing lost, turns never interleave, conflicts are clean.

Many record_turn calls run at once on separate connections (the `db`
fixture allows 30), so the database's locks, not luck, must keep each turn's
messages together and the counters right.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from memchat import store
from memchat.errors import DuplicateClientMessage, NotesConflict
from tests.utils.store_data import contents, exchange, record, session_row, turn


def assert_turns_adjacent(rows: list[tuple[str, str]]) -> None:
    """Every human message is immediately followed by its own answer."""
    assert len(rows) % 2 == 0
    for (human_type, question), (ai_type, answer) in zip(rows[::2], rows[1::2], strict=True):
        assert (human_type, ai_type) == ("human", "ai")
        assert answer == question.replace("question", "answer")


async def test_concurrent_turns_on_one_session_keep_every_pair_together(db, admin, users):
    alice = users.create()
    sid = uuid.uuid4()
    await record(db, alice, exchange("question first", "answer first"), session_id=sid)
    n = 40

    results = await asyncio.gather(
        *(
            store.record_turn(db, alice, turn(sid, exchange(f"question {i}", f"answer {i}")))
            for i in range(n)
        )
    )

    rows = contents(admin, sid)
    assert len(rows) == 2 * n + 2
    assert_turns_adjacent(rows)
    assert {q for _, q in rows[::2]} == {"question first"} | {f"question {i}" for i in range(n)}
    assert session_row(admin, sid)["message_count"] == len(rows)
    # Each turn saw the count its own transaction left: all distinct, the last one is the total.
    assert sorted(r.message_count for r in results) == list(range(4, 2 * n + 3, 2))


async def test_concurrent_first_turns_on_a_new_session_id(db, admin, users):
    alice = users.create()
    sid = uuid.uuid4()
    n = 20

    await asyncio.gather(
        *(
            store.record_turn(
                db, alice, turn(sid, exchange(f"question {i}", f"answer {i}"), title=f"t{i}")
            )
            for i in range(n)
        )
    )

    sessions = admin.execute(
        "select id, message_count from public.chat_sessions where user_id = %s",
        (alice.user_id,),
    ).fetchall()
    assert sessions == [(sid, 2 * n)]
    rows = contents(admin, sid)
    assert len(rows) == 2 * n
    assert_turns_adjacent(rows)
    pointers = admin.execute(
        "select active_session_id from public.user_agent_active_sessions where user_id = %s",
        (alice.user_id,),
    ).fetchall()
    assert pointers == [(sid,)]


async def test_concurrent_notes_updates_from_the_same_version_one_wins(db, admin, users):
    alice = users.create()
    saved = await store.save_notes(db, alice, "default", "v1")
    read_version = saved.version
    sessions = [uuid.uuid4(), uuid.uuid4()]

    results = await asyncio.gather(
        *(
            store.record_turn(
                db,
                alice,
                turn(
                    sid,
                    exchange(f"question {i}", f"answer {i}"),
                    notes=f"notes from turn {i}",
                    notes_version=read_version,
                ),
            )
            for i, sid in enumerate(sessions)
        ),
        return_exceptions=True,
    )

    winners = [i for i, r in enumerate(results) if isinstance(r, store.SessionInfo)]
    losers = [i for i, r in enumerate(results) if isinstance(r, NotesConflict)]
    assert len(winners) == 1 and len(losers) == 1, results
    (winner,), (loser,) = winners, losers
    notes = await store.read_notes(db, alice, "default")
    assert (notes.notes, notes.version) == (f"notes from turn {winner}", read_version + 1)
    # The losing turn left no trace: no session, no messages, not made active.
    assert session_row(admin, sessions[loser]) is None
    assert contents(admin, sessions[loser]) == []
    assert contents(admin, sessions[winner]) == [
        ("human", f"question {winner}"),
        ("ai", f"answer {winner}"),
    ]
    active = await store.active_session(db, alice, "default")
    assert active is not None and active.id == sessions[winner]


async def test_notes_conflict_on_an_existing_session_stores_nothing(db, admin, users):
    alice = users.create()
    info = await record(db, alice, exchange("hello", "hi"), notes="v1", notes_version=0)
    await store.save_notes(db, alice, "default", "changed elsewhere")

    with pytest.raises(NotesConflict):
        await store.record_turn(
            db,
            alice,
            turn(info.id, exchange("again", "stale"), notes="stale notes", notes_version=1),
        )

    assert contents(admin, info.id) == [("human", "hello"), ("ai", "hi")]
    assert session_row(admin, info.id)["message_count"] == 2
    assert (await store.read_notes(db, alice, "default")).notes == "changed elsewhere"


async def test_duplicate_client_message_id_stores_nothing(db, admin, users):
    alice = users.create()
    info = await record(db, alice, exchange("hello", "hi"), client_message_id="cm-1")
    before = session_row(admin, info.id)

    with pytest.raises(DuplicateClientMessage):
        await store.record_turn(
            db, alice, turn(info.id, exchange("hello again", "hi again"), client_message_id="cm-1")
        )

    assert contents(admin, info.id) == [("human", "hello"), ("ai", "hi")]
    assert session_row(admin, info.id) == before


async def test_concurrent_retries_with_the_same_client_message_id(db, admin, users):
    alice = users.create()
    sid = uuid.uuid4()
    await record(db, alice, exchange("hello", "hi"), session_id=sid)

    results = await asyncio.gather(
        *(
            store.record_turn(
                db, alice, turn(sid, exchange("retry", f"answer {i}"), client_message_id="cm-2")
            )
            for i in range(5)
        ),
        return_exceptions=True,
    )

    stored = [r for r in results if isinstance(r, store.SessionInfo)]
    duplicates = [r for r in results if isinstance(r, DuplicateClientMessage)]
    assert (len(stored), len(duplicates)) == (1, 4), results
    assert len(contents(admin, sid)) == 4
    assert session_row(admin, sid)["message_count"] == 4
