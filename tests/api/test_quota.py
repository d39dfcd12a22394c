"""USER_MAX_STORED_MESSAGES: a user's live sessions hold at most so many
messages. A turn past it (POST /chat, /v1) is refused whole with 413
`quota_exceeded` before the model is called; the database holds the same
limit (memchat.limits.max_stored_messages), also against two writes at once.
The import's side is in test_import.py."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg.types.json import Jsonb

from memchat import messages
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error, chat
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.openai_api import assert_openai_error
from tests.utils.store_data import acting_as, snapshot
from tests.utils.users import claims_for, create_user

Build = Callable[..., ApiClient]


async def test_a_turn_past_the_quota_is_refused_before_the_model_is_called(
    custom_api: Build, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    api = custom_api(user_max_stored_messages=4)
    user_id, auth = api.new_user()
    first = await chat(api, auth, "one")
    await chat(api, auth, "two", session_id=first["session_id"])
    before = snapshot(admin, user_id)
    calls = model.calls
    r = await api.post("/chat", json={"message": "three"}, headers=auth)
    detail = assert_error(r, 413, "quota_exceeded")["detail"]
    assert "limit of 4 stored messages" in detail and "you have 4 stored" in detail
    r = await api.post(
        "/v1/chat/completions",
        json={"model": "memchat", "messages": [{"role": "user", "content": "three"}]},
        headers=auth,
    )
    assert_openai_error(r, 413, "quota_exceeded")
    assert model.calls == calls
    assert snapshot(admin, user_id) == before

    stats = (await api.get("/chat/stats", headers=auth)).json()
    assert stats["storage"] == {"stored_messages": 4, "max_stored_messages": 4}
    # Clearing a session frees its messages.
    r = await api.post("/chat/clear-session", json={"session_id": first["session_id"]},
                       headers=auth)  # fmt: skip
    assert r.status_code == 200, r.text
    await chat(api, auth, "three")


async def test_an_expired_session_holds_no_messages(
    custom_api: Build, admin: psycopg.Connection
) -> None:
    """An expired session is gone for every purpose, whether or not the
    cleanup has deleted it yet."""
    api = custom_api(user_max_stored_messages=2)
    user_id, auth = api.new_user()
    first = await chat(api, auth, "one")
    r = await api.post("/chat", json={"message": "two"}, headers=auth)
    assert_error(r, 413, "quota_exceeded")
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute'"
        " where id = %s and user_id = %s",
        (first["session_id"], user_id),
    )
    again = await chat(api, auth, "two", session_id=first["session_id"])
    assert again["session"]["message_count"] == 2  # the expired session started empty


def waiting_on_advisory_lock(admin: psycopg.Connection, pid: int) -> bool:
    """Whether the backend `pid` waits for an advisory lock, polled until it
    does (a thread's statement may take a while to arrive under load)."""
    for _ in range(600):
        (waits,) = admin.execute(
            "select exists (select 1 from pg_locks where pid = %s and not granted"
            " and locktype = 'advisory')",
            (pid,),
        ).fetchone() or (False,)
        if waits:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.plain_only  # watches this server's locks; on Citus the worker's hold it
async def test_the_database_holds_the_quota_against_two_writes_at_once(
    database_url: str, admin: psycopg.Connection
) -> None:
    """record_turn counts the user's messages under a lock per user: a second
    write waits for the first to commit, counts it, and is refused."""
    user_id = uuid.uuid4()
    create_user(user_id)
    claims = claims_for(user_id)
    admin.execute("update memchat.limits set max_stored_messages = 3")
    turn = Jsonb([messages.human("hi"), messages.ai("hello")])
    record = (
        "select memchat.record_turn(%s, %s, 'default', 't', %s, interval '1 hour', null, null, 0,"
        " false, null, null, null)"
    )
    outcome: list[str] = []
    try:
        with (
            psycopg.connect(database_url, autocommit=True) as first,
            psycopg.connect(database_url, autocommit=True) as second,
        ):
            with acting_as(first, claims):
                first.execute(record, (user_id, uuid.uuid4(), turn))

                def other() -> None:
                    try:
                        with acting_as(second, claims):
                            second.execute(record, (user_id, uuid.uuid4(), turn))
                        outcome.append("stored")
                    except psycopg.Error as exc:
                        outcome.append(str(exc.sqlstate))

                waiting = threading.Thread(target=other)
                waiting.start()
                assert waiting_on_advisory_lock(admin, second.info.backend_pid)
            waiting.join(timeout=60)
    finally:
        admin.execute("update memchat.limits set max_stored_messages = default")
    assert outcome == ["MCQTA"]
    (count,) = admin.execute(
        "select count(*) from public.chat_message_history where user_id = %s", (user_id,)
    ).fetchone()
    assert count == 2
