"""The cleanup next to chat turns and next to another cleanup.

Races are driven deterministically with two connections: the "turn" holds
its transaction open while the cleanup runs, the way a turn
(`store.record_turn`) holds the session row lock it takes first while it
extends `expires_at`.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg

from memchat import messages, store
from memchat.store.db import connect_kwargs
from memchat.store.distribute import on_citus
from tests.cleanup.conftest import Seeder, cleanup_on

# What a turn does to the session row (memchat.record_turn): lock it, then slide it.
LOCK = (
    "select 1 from public.chat_sessions where id = %(session_id)s and user_id = %(user_id)s"
    " for update"
)
EXTEND = (
    "update public.chat_sessions set expires_at = now() + interval '1 hour',"
    " last_active_at = now() where id = %(session_id)s and user_id = %(user_id)s"
)


def _open_turn(admin_url: str, session_id: uuid.UUID, user_id: uuid.UUID) -> psycopg.Connection:
    """A turn's transaction, left open: the session locked and extended."""
    turn = psycopg.connect(admin_url)  # not autocommit: the transaction stays open
    keys = {"session_id": session_id, "user_id": user_id}
    turn.execute(LOCK, keys)
    turn.execute(EXTEND, keys)
    return turn


def test_a_session_a_turn_is_extending_is_skipped_without_waiting(
    admin_url, cleanup_url, users, seed: Seeder
):
    user = users.create()
    extended = seed.session(user.user_id, messages=3, active=True)
    idle = seed.session(user.user_id, messages=2)

    turn = _open_turn(admin_url, extended, user.user_id)
    try:
        with psycopg.connect(cleanup_url, **connect_kwargs()) as cleaner:
            cleaner.execute("set lock_timeout = '5s'")  # waiting would fail, not hang
            began = time.monotonic()
            deleted_sessions, _ = store.expire_sessions_batch(cleaner, 1000, 365)
            took = time.monotonic() - began
        assert took < 2.0, f"the batch waited {took:.1f} s on the turn's lock"
        assert deleted_sessions >= 1
        assert not seed.exists(idle)  # the batch went on with the others
        assert seed.exists(extended)

        # The whole use case too, on its own connection, while the turn is still open.
        with ThreadPoolExecutor(1) as pool:
            result = pool.submit(cleanup_on(cleanup_url, batch_size=1000).run).result(timeout=10)
        assert result.finished and seed.exists(extended)
        turn.commit()
    finally:
        turn.close()

    assert seed.exists(extended) and seed.message_count(extended) == 3
    assert seed.pointer(user.user_id, "default") == extended
    cleanup_on(cleanup_url, batch_size=1000).run()
    assert seed.exists(extended) and seed.message_count(extended) == 3


def test_an_extension_committed_just_before_the_batch_is_seen(
    admin_url, cleanup_url, users, seed: Seeder
):
    user = users.create()
    extended = seed.session(user.user_id, messages=3)
    turn = _open_turn(admin_url, extended, user.user_id)
    turn.commit()
    turn.close()

    cleanup_on(cleanup_url, batch_size=1000).run()

    assert seed.exists(extended) and seed.message_count(extended) == 3


async def test_a_turn_on_an_expired_session_not_yet_cleaned_keeps_it(
    db, cleanup_url, users, seed: Seeder
):
    user = users.create()
    sid = seed.session(user.user_id, messages=4, expires_in=-timedelta(seconds=5))

    info = await store.record_turn(
        db,
        user,
        store.Turn(
            session_id=sid,
            agent_name="default",
            messages=[messages.human("back again"), messages.ai("welcome back")],
            title=None,
            ttl=timedelta(hours=1),
        ),
    )
    cleanup_on(cleanup_url, batch_size=1000).run()

    # The expired history was reset by the turn; the session and the new turn live on.
    assert info.message_count == 2
    assert seed.exists(sid) and seed.message_count(sid) == 2


def test_two_cleanups_at_once_delete_each_row_once(cleanup_url, users, seed: Seeder):
    user = users.create()
    seed.expired_bulk(user.user_id, sessions=6000, messages_each=3)
    live = seed.session(users.create().user_id, expires_in=timedelta(hours=1), messages=2)
    sessions_before, messages_before = seed.totals()
    start = threading.Barrier(2)

    def run() -> object:
        start.wait()
        return cleanup_on(cleanup_url, batch_size=100).run()

    with ThreadPoolExecutor(2) as pool:
        first, second = (f.result(timeout=120) for f in [pool.submit(run) for _ in "ab"])

    sessions_after, messages_after = seed.totals()
    assert first.finished and second.finished
    # Every deleted row was counted by exactly one of them.
    assert first.deleted_sessions + second.deleted_sessions == sessions_before - sessions_after
    assert first.deleted_messages + second.deleted_messages == messages_before - messages_after
    # They shared the work. On Citus a batch reads its sessions without a
    # lock and passes over those the other holds: the one that meets only
    # held ones stops (docs/deploy.md, "Citus").
    if not on_citus(seed.admin):
        assert first.deleted_sessions > 0 and second.deleted_sessions > 0
    assert seed.user_sessions(user.user_id) == 0 and seed.user_messages(user.user_id) == 0
    assert seed.exists(live) and seed.message_count(live) == 2
