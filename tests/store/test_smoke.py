import uuid
from datetime import timedelta

from memchat import messages, store


async def test_turn_roundtrip(db, users):
    alice = users.create()
    ctx = await store.load_context(db, alice, session_id=None, agent_name="default", window=10)
    assert ctx.session is None and ctx.messages == [] and ctx.notes.version == 0
    sid = uuid.uuid4()
    info = await store.record_turn(
        db,
        alice,
        store.Turn(
            session_id=sid,
            agent_name="default",
            title="hi",
            messages=[messages.human("hello"), messages.ai("hi there")],
            ttl=timedelta(hours=1),
            notes="# Name\nAlice",
            notes_version=0,
        ),
    )
    assert info.message_count == 2 and info.id == sid
    ctx = await store.load_context(db, alice, session_id=None, agent_name="default", window=10)
    assert ctx.session.id == sid
    assert [m["data"]["content"] for m in ctx.messages] == ["hello", "hi there"]
    assert ctx.notes.notes == "# Name\nAlice" and ctx.notes.version == 1
