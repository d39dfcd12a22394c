"""Concurrent clears of the active session act on the session they locked."""

import asyncio
import uuid
from datetime import timedelta

from memchat import messages, store


async def test_concurrent_clears_never_clear_a_fresh_session(db, users, admin):
    alice = users.create()
    sid = uuid.uuid4()
    await store.record_turn(
        db,
        alice,
        store.Turn(
            session_id=sid,
            agent_name="default",
            title="t",
            messages=[messages.human("old"), messages.ai("old answer")],
            ttl=timedelta(hours=1),
        ),
    )
    results = await asyncio.gather(
        *[
            store.clear_session(
                db, alice, session_id=None, agent_name="default", ttl=timedelta(hours=1)
            )
            for _ in range(6)
        ],
        return_exceptions=True,
    )
    cleared = [r for r in results if isinstance(r, store.Cleared)]
    assert cleared, results
    # Every session marked cleared is one that some clear reported clearing:
    # no clear acts on a session other than the one it locked and reports.
    marked = {
        r[0]
        for r in admin.execute(
            "select id from public.chat_sessions where user_id = %s and status = 'cleared'",
            (alice.user_id,),
        ).fetchall()
    }
    assert marked == {r.cleared_session_id for r in cleared}
    active = admin.execute(
        "select s.status from public.user_agent_active_sessions a"
        " join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id"
        " where a.user_id = %s",
        (alice.user_id,),
    ).fetchone()
    assert active == ("active",)
    assert (
        admin.execute(
            "select count(*) from public.chat_message_history where session_id = %s", (sid,)
        ).fetchone()[0]
        == 0
    )
