"""POST /chat under pressure: the per-user throttle, idempotency keys under
concurrency, two first messages at once, the turn deadline with memory off,
and the database's limits applied before the model is paid for."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from http.server import ThreadingHTTPServer
from typing import Any

import psycopg
import pytest

from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error, chat
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.store_data import contents


@pytest.fixture
async def build(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., tuple[ApiClient, FakeOpenAI]]]:
    """Apps with their own fake model (a listen backlog for bursts) and settings."""
    monkeypatch.setattr(ThreadingHTTPServer, "request_queue_size", 128)
    made: list[tuple[ApiClient, FakeOpenAI]] = []

    def make(**overrides: object) -> tuple[ApiClient, FakeOpenAI]:
        server = FakeOpenAI()
        client = ApiClient(make_settings(database_url, server.url, **overrides))
        made.append((client, server))
        return client, server

    yield make
    for client, server in made:
        await client.aclose()
        server.close()


def user_sessions(admin: psycopg.Connection, user_id: uuid.UUID) -> list[tuple[uuid.UUID, int]]:
    return admin.execute(
        "select id, message_count from public.chat_sessions where user_id = %s", (user_id,)
    ).fetchall()


# --------------------------------------------------------------- throttle


async def test_the_throttle_answers_429_with_retry_after_once_the_burst_is_spent(
    build: Any,
) -> None:
    api, model = build(chat_rate_per_minute=6, chat_rate_burst=3)
    _, auth = api.new_user()
    _, other = api.new_user()
    for i in range(3):
        await chat(api, auth, f"m{i}")

    refused = await api.post("/chat", json={"message": "one more"}, headers=auth)

    body = assert_error(refused, 429, "rate_limited")
    retry_after = int(refused.headers["retry-after"])
    assert 1 <= retry_after <= 10  # one token every 10 s at 6 a minute
    assert f"{retry_after} s" in body["detail"]
    assert model.calls == 3  # the refused turn never reached the model
    await chat(api, other, "someone else is not throttled")


async def test_the_bucket_refills_at_the_configured_rate(
    build: Any, admin: psycopg.Connection
) -> None:
    api, _ = build(chat_rate_per_minute=60, chat_rate_burst=1)
    user_id, auth = api.new_user()
    await chat(api, auth, "first")
    assert_error(await api.post("/chat", json={"message": "x"}, headers=auth), 429, "rate_limited")

    # A second has passed (as far as the bucket knows): one token back.
    # (Read first: Citus takes no column next to a time function in an UPDATE.)
    (refilled,) = admin.execute(
        "select refilled_at - interval '1.1 seconds' from memchat.rate_buckets"
        " where user_id = %s and bucket = 'chat'",
        (user_id,),
    ).fetchone() or (None,)
    admin.execute(
        "update memchat.rate_buckets set refilled_at = %s where user_id = %s and bucket = 'chat'",
        (refilled, user_id),
    )
    await chat(api, auth, "after a second")
    assert_error(await api.post("/chat", json={"message": "y"}, headers=auth), 429, "rate_limited")


async def test_simultaneous_turns_take_exactly_the_burst(build: Any) -> None:
    api, model = build(chat_rate_per_minute=1, chat_rate_burst=5)
    _, auth = api.new_user()
    responses = await asyncio.gather(
        *[api.post("/chat", json={"message": f"m{i}"}, headers=auth) for i in range(12)]
    )
    assert sorted(r.status_code for r in responses) == [200] * 5 + [429] * 7
    assert model.calls == 5


async def test_memory_off_turns_are_throttled_too(build: Any) -> None:
    api, _ = build(chat_rate_per_minute=6, chat_rate_burst=1)
    _, auth = api.new_user()
    await chat(api, auth, "one", use_memory=False)
    refused = await api.post("/chat", json={"message": "two", "use_memory": False}, headers=auth)
    assert_error(refused, 429, "rate_limited")


async def test_a_replayed_retry_costs_no_token(build: Any) -> None:
    api, model = build(chat_rate_per_minute=6, chat_rate_burst=1)
    _, auth = api.new_user()
    first = await chat(api, auth, "hello", client_message_id="k1")
    again = await chat(api, auth, "hello", client_message_id="k1", session_id=first["session_id"])
    assert again["answer"] == first["answer"] and model.calls == 1


async def test_throttle_zero_turns_it_off(build: Any) -> None:
    api, _ = build(chat_rate_per_minute=0, chat_rate_burst=1)
    _, auth = api.new_user()
    for i in range(5):
        await chat(api, auth, f"m{i}")


# ------------------------------------------------------------ idempotency


async def test_a_key_reused_with_another_message_is_409(
    build: Any, admin: psycopg.Connection
) -> None:
    api, model = build()
    _, auth = api.new_user()
    first = await chat(api, auth, "book a table", client_message_id="k-1")
    sid = first["session_id"]

    other = await api.post(
        "/chat",
        json={"message": "cancel it", "client_message_id": "k-1", "session_id": sid},
        headers=auth,
    )

    assert_error(other, 409, "idempotency_conflict")
    assert model.calls == 1
    assert contents(admin, uuid.UUID(sid)) == [("human", "book a table"), ("ai", first["answer"])]


async def test_fifty_concurrent_requests_with_one_key_call_the_model_once(
    build: Any, admin: psycopg.Connection
) -> None:
    api, model = build()
    user_id, auth = api.new_user()
    model.script({"delay": 0.5, "content": "the one answer"})
    request = {"message": "only once, please", "client_message_id": "same-key"}

    responses = await asyncio.gather(
        *[api.post("/chat", json=request, headers=auth) for _ in range(50)]
    )

    assert [r.status_code for r in responses] == [200] * 50, {r.text for r in responses}
    assert {r.json()["answer"] for r in responses} == {"the one answer"}
    assert model.calls == 1
    sessions = user_sessions(admin, user_id)
    assert [count for _, count in sessions] == [2]
    assert {r.json()["session_id"] for r in responses} == {str(sessions[0][0])}


async def test_the_same_key_with_another_message_while_in_flight_is_409(build: Any) -> None:
    api, model = build()
    _, auth = api.new_user()
    model.script({"delay": 0.6, "content": "slow answer"})
    first = asyncio.create_task(
        api.post("/chat", json={"message": "a", "client_message_id": "k"}, headers=auth)
    )
    await asyncio.sleep(0.2)
    second = await api.post("/chat", json={"message": "b", "client_message_id": "k"}, headers=auth)
    assert_error(second, 409, "idempotency_conflict")
    assert (await first).status_code == 200


async def test_a_failed_turn_frees_its_key_for_the_retry(
    build: Any, admin: psycopg.Connection
) -> None:
    api, model = build()
    user_id, auth = api.new_user()
    model.script({"status": 500, "error": "boom"})
    failed = await api.post("/chat", json={"message": "hi", "client_message_id": "k"}, headers=auth)
    assert_error(failed, 502, "model_upstream_error")

    retried = await chat(api, auth, "hi", client_message_id="k")  # at once, not a 409

    assert model.calls == 2
    (claims,) = admin.execute(
        "select count(*) from memchat.turn_claims where user_id = %s", (user_id,)
    ).fetchone()
    assert claims == 0 and retried["answer"] == "echo: hi"


async def test_a_retry_waiting_past_the_deadline_is_told_to_retry(build: Any) -> None:
    api, model = build(turn_timeout_seconds=0.5, openai_timeout_seconds=5)
    _, auth = api.new_user()
    model.script({"delay": 1.5, "content": "too slow"})
    request = {"message": "wait", "client_message_id": "slow"}
    first, second = await asyncio.gather(
        api.post("/chat", json=request, headers=auth),
        api.post("/chat", json=request, headers=auth),
    )
    codes = sorted([first.status_code, second.status_code])
    assert codes == [409, 504], [first.text, second.text]
    waited = first if first.status_code == 409 else second
    assert_error(waited, 409, "idempotency_in_flight")
    assert waited.headers["retry-after"] == "1"


# ------------------------------------------------------- first messages


@pytest.mark.parametrize("n", [2, 50])
async def test_concurrent_first_messages_land_in_one_session(
    build: Any, admin: psycopg.Connection, n: int
) -> None:
    api, _ = build()
    user_id, auth = api.new_user()

    responses = await asyncio.gather(
        *[api.post("/chat", json={"message": f"first {i}"}, headers=auth) for i in range(n)]
    )

    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    sessions = user_sessions(admin, user_id)
    assert len(sessions) == 1 and sessions[0][1] == 2 * n
    assert {r.json()["session_id"] for r in responses} == {str(sessions[0][0])}
    assert {r.headers["x-session-id"] for r in responses} == {str(sessions[0][0])}
    (pointer,) = admin.execute(
        "select active_session_id from public.user_agent_active_sessions where user_id = %s",
        (user_id,),
    ).fetchone()
    assert pointer == sessions[0][0]


async def test_first_messages_to_two_agents_make_two_sessions(
    build: Any, admin: psycopg.Connection
) -> None:
    api, _ = build()
    user_id, auth = api.new_user()
    await asyncio.gather(
        chat(api, auth, "to a", agent_name="a"), chat(api, auth, "to b", agent_name="b")
    )
    assert len(user_sessions(admin, user_id)) == 2


# ----------------------------------------------------------- the deadline


async def test_memory_off_turns_have_the_deadline_too(
    build: Any, admin: psycopg.Connection
) -> None:
    api, model = build(turn_timeout_seconds=0.5, openai_timeout_seconds=10)
    user_id, auth = api.new_user()
    model.script({"delay": 2.5, "content": "late"})
    response = await api.post(
        "/chat", json={"message": "quick?", "use_memory": False}, headers=auth
    )
    assert_error(response, 504, "model_timeout")
    assert user_sessions(admin, user_id) == []


# ------------------------------------------------ the database's limits


async def test_a_message_over_the_database_limit_is_413_before_the_model(
    build: Any, admin: psycopg.Connection
) -> None:
    """The API was configured above the database's limit: the database wins,
    and the model is not paid for a turn that could not be stored."""
    api, model = build(max_message_chars=20_000)
    user_id, auth = api.new_user()
    response = await api.post("/chat", json={"message": "x" * 16_001}, headers=auth)
    assert_error(response, 413, "payload_too_large")
    assert model.calls == 0 and user_sessions(admin, user_id) == []


async def test_notes_over_the_database_limit_are_413(build: Any) -> None:
    api, _ = build(ltm_max_chars=20_000)
    _, auth = api.new_user()
    response = await api.put(
        "/memory", json={"agent_name": "default", "notes": "n" * 8_001}, headers=auth
    )
    assert_error(response, 413, "payload_too_large")


async def test_a_session_ttl_above_the_database_maximum_is_clamped(build: Any) -> None:
    api, _ = build(session_ttl_hours=24 * 365)
    _, auth = api.new_user()
    body = await chat(api, auth, "hello")
    session = body["session"]
    lifetime = datetime.fromisoformat(session["expires_at"]) - datetime.fromisoformat(
        session["last_active_at"]
    )
    assert lifetime.total_seconds() == 168 * 3600
