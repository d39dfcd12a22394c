"""Regression tests for the security review (issue 20), through the HTTP API.

Each test's docstring names the finding it attacks; each failed on the main
branch the review was made against.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import psycopg
import pytest

from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error, chat
from tests.utils.fake_openai import FakeOpenAI

Build = Callable[..., ApiClient]


@pytest.fixture
def build(custom_api: Build) -> Build:
    return custom_api


# ------------------------------------------------ 1. delete-me and the throttle


async def test_deleting_the_account_does_not_reset_the_chat_throttle(
    build: Build, model: FakeOpenAI
) -> None:
    """Finding 1: DELETE /me deleted the caller's throttle row, so alternating
    turns and deletes gave unlimited model calls (40 turns in 0.6 s against a
    limit of a few a second). The attack now stays at the configured rate."""
    api = build(chat_rate_per_minute=6, chat_rate_burst=3, erase_rate_per_minute=0)
    _, auth = api.new_user()
    statuses = []
    for i in range(40):
        r = await api.post("/chat", json={"message": f"m{i}"}, headers=auth)
        statuses.append(r.status_code)
        assert (await api.delete("/me", headers=auth)).status_code == 200
    # The burst, then refused: refilling 6 a minute adds none in a few seconds.
    assert statuses == [200] * 3 + [429] * 37, statuses
    assert model.calls == 3


async def test_deleting_the_account_is_throttled_itself(build: Build) -> None:
    """Finding 1: deleting must itself be throttled (ERASE_RATE_*)."""
    api = build(erase_rate_per_minute=0.1, erase_rate_burst=2)
    _, auth = api.new_user()
    for _ in range(2):
        assert (await api.delete("/me", headers=auth)).status_code == 200
    refused = await api.delete("/me", headers=auth)
    body = assert_error(refused, 429, "rate_limited")
    assert int(refused.headers["retry-after"]) >= 1
    assert "requests to delete your data" in body["detail"]


# ------------------------------------------- 10. every write and costly read


async def _rate_one(api: ApiClient, auth: dict[str, str], sid: str, answer_id: int) -> Any:
    return await api.post(
        "/chat/feedback", json={"message_id": answer_id, "rating": 1}, headers=auth
    )


ENDPOINTS: dict[
    str, tuple[str, Callable[[ApiClient, dict[str, str], str, int], Awaitable[Any]]]
] = {
    "put notes": (
        "write",
        lambda api, auth, sid, mid: api.put(
            "/memory", json={"agent_name": "default", "notes": "x"}, headers=auth
        ),
    ),
    "delete notes": ("write", lambda api, auth, sid, mid: api.delete("/memory", headers=auth)),
    "restore notes": (
        "write",
        lambda api, auth, sid, mid: api.post(
            "/memory/restore", json={"agent_name": "default", "version": 1}, headers=auth
        ),
    ),
    "clear a session": (
        "write",
        lambda api, auth, sid, mid: api.post(
            "/chat/clear-session", json={"session_id": sid}, headers=auth
        ),
    ),
    "rate an answer": ("write", _rate_one),
    "unrate an answer": (
        "write",
        lambda api, auth, sid, mid: api.delete(f"/chat/feedback/{mid}", headers=auth),
    ),
    "export a session": (
        "read",
        lambda api, auth, sid, mid: api.get(f"/chat/export/{sid}", headers=auth),
    ),
    "export everything": ("export", lambda api, auth, sid, mid: api.get("/export", headers=auth)),
    "stats": ("read", lambda api, auth, sid, mid: api.get("/chat/stats", headers=auth)),
    "session stats": (
        "read",
        lambda api, auth, sid, mid: api.get(f"/chat/stats/{sid}", headers=auth),
    ),
    "delete me": ("erase", lambda api, auth, sid, mid: api.delete("/me", headers=auth)),
    "import history": (
        "import",
        lambda api, auth, sid, mid: api.post(
            "/sessions/import", json={"sessions": [{"messages": []}]}, headers=auth
        ),
    ),
}


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
async def test_every_write_and_costly_read_is_throttled(
    build: Build, model: FakeOpenAI, endpoint: str
) -> None:
    """Finding 10: only /chat was rate limited. Each of these now takes a
    token from its bucket and answers 429 with Retry-After past the burst,
    without doing anything; another user is not affected."""
    bucket, call = ENDPOINTS[endpoint]
    api = build(**{f"{bucket}_rate_per_minute": 1, f"{bucket}_rate_burst": 2})
    # Arranged through an unthrottled app: none of the tokens under test is taken.
    arrange = build()
    _, auth = api.new_user()
    _, other = api.new_user()
    turn = await chat(arrange, auth, "hello")
    other_turn = await chat(arrange, other, "hello")
    await arrange.put("/memory", json={"agent_name": "default", "notes": "v1"}, headers=auth)
    sid, mid = turn["session_id"], turn["message_id"]

    statuses = [(await call(api, auth, sid, mid)).status_code for _ in range(2)]
    assert statuses == [200, 200], statuses  # the burst
    refused = await call(api, auth, sid, mid)
    assert_error(refused, 429, "rate_limited")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    theirs = await call(api, other, other_turn["session_id"], other_turn["message_id"])
    if endpoint == "restore notes":  # they kept no notes: served, not throttled
        assert_error(theirs, 404, "not_found")
    else:
        assert theirs.status_code == 200, theirs.text


async def test_a_throttled_write_changes_nothing(build: Build, admin: psycopg.Connection) -> None:
    """The token is taken in the request's own transaction: a refused write
    does nothing at all."""
    api = build(write_rate_per_minute=1, write_rate_burst=1)
    user_id, auth = api.new_user()
    assert (
        await api.put("/memory", json={"agent_name": "default", "notes": "one"}, headers=auth)
    ).status_code == 200
    refused = await api.put("/memory", json={"agent_name": "default", "notes": "two"}, headers=auth)
    assert_error(refused, 429, "rate_limited")
    row = admin.execute(
        "select notes, version from public.agent_long_term_memory where user_id = %s", (user_id,)
    ).fetchone()
    assert row == ("one", 1)


# ------------------------------------------------------ 14. session ids


SESSION_READS = {
    "export": lambda api, auth, sid: api.get(f"/chat/export/{sid}", headers=auth),
    "markdown export": lambda api, auth, sid: api.get(
        f"/chat/export/{sid}?format=markdown", headers=auth
    ),
    "session stats": lambda api, auth, sid: api.get(f"/chat/stats/{sid}", headers=auth),
    "clear": lambda api, auth, sid: api.post(
        "/chat/clear-session", json={"session_id": sid}, headers=auth
    ),
}


def _without_request_id(response: httpx.Response) -> tuple[int, dict[str, Any]]:
    body = dict(response.json())
    body.pop("request_id", None)
    return response.status_code, body


@pytest.mark.parametrize("endpoint", list(SESSION_READS))
async def test_someone_elses_session_and_an_unknown_id_answer_alike(
    api: ApiClient, endpoint: str
) -> None:
    """Finding 14: someone else's session id and an id nobody holds must answer
    identically (status and body), so an answer never tells that an id exists."""
    _, owner = api.new_user()
    theirs = (await chat(api, owner, "a private matter"))["session_id"]
    _, caller = api.new_user()
    call = SESSION_READS[endpoint]

    someone_elses = await call(api, caller, theirs)
    nobodys = await call(api, caller, str(uuid.uuid4()))

    assert _without_request_id(someone_elses) == _without_request_id(nobodys)
    assert someone_elses.status_code == 404
    assert set(someone_elses.headers) == set(nobodys.headers)


async def test_creating_a_session_with_someone_elses_id_reveals_nothing(
    api: ApiClient, model: FakeOpenAI
) -> None:
    """Finding 14: a first message under an id another user holds gets what a
    first message under a new id gets: the caller's own new session."""
    _, owner = api.new_user()
    theirs = (await chat(api, owner, "a private matter"))["session_id"]
    _, caller = api.new_user()

    taken = await api.post("/chat", json={"message": "hi", "session_id": theirs}, headers=caller)
    new_id = str(uuid.uuid4())
    fresh = await api.post("/chat", json={"message": "hi", "session_id": new_id}, headers=caller)

    assert taken.status_code == fresh.status_code == 200
    for response, sid in ((taken, theirs), (fresh, new_id)):
        body = response.json()
        assert body["session_id"] == sid == response.headers["x-session-id"]
        assert body["session"]["message_count"] == 2
        assert body["memory"]["messages_in_context"] == 0
    assert "private" not in str(model.requests[-2])


# ------------------------------------------------ 16. an idempotent replay


async def test_a_replayed_retry_makes_no_model_or_embedding_call(
    api: ApiClient, model: FakeOpenAI
) -> None:
    """Finding 16: a replay of a stored turn still sent an embedding request
    (started before the context load found the stored answer)."""
    _, auth = api.new_user()
    first = await chat(api, auth, "hello there", client_message_id="k-1")
    chats, embeddings = model.calls, len(model.embedding_requests)

    again = await chat(
        api, auth, "hello there", client_message_id="k-1", session_id=first["session_id"]
    )
    await asyncio.sleep(0.2)  # an embedding request would have arrived by now

    assert again["answer"] == first["answer"] and again["message_id"] == first["message_id"]
    assert (model.calls, len(model.embedding_requests)) == (chats, embeddings)


# ---------------------------------------------------------- 12. max_tokens


async def test_every_model_call_has_a_max_tokens(build: Build, model: FakeOpenAI) -> None:
    """Finding 12: no max_tokens on model calls, so one request could spend
    the model budget without bound."""
    api = build(openai_max_tokens=321)
    _, auth = api.new_user()
    await chat(api, auth, "hi")
    await api.post("/chat", json={"message": "streamed", "stream": True}, headers=auth)
    await chat(api, auth, "no memory", use_memory=False)
    assert [r["max_tokens"] for r in model.requests] == [321, 321, 321]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat", {"message": "hi", "recall_k": True}),
        ("/chat", {"message": "hi", "max_history_messages": True}),
        ("/chat", {"message": "hi", "use_memory": 1}),
        ("/chat", {"message": "hi", "stream": "true"}),
        ("/chat", {"message": "hi", "recall_k": "2"}),
    ],
)
async def test_numbers_and_booleans_are_not_coerced(
    api: ApiClient, path: str, body: dict[str, object]
) -> None:
    """`true` is not 1 and "2" is not 2: what the OpenAPI document says is
    what is accepted (schemathesis found `recall_k: true` answered 200)."""
    _, auth = api.new_user()
    response = await api.post(path, json=body, headers=auth)
    assert response.status_code == 422 and response.json()["error"] == "validation_error"


async def test_expected_version_false_is_refused(api: ApiClient) -> None:
    _, auth = api.new_user()
    response = await api.put(
        "/memory", json={"notes": "x", "expected_version": False}, headers=auth
    )
    assert response.status_code == 422


async def test_an_integral_number_is_an_integer(api: ApiClient) -> None:
    """JSON Schema's integer includes 2.0, so the API takes it."""
    _, auth = api.new_user()
    response = await api.post("/chat", json={"message": "hi", "recall_k": 2.0}, headers=auth)
    assert response.status_code == 200


async def test_a_rating_of_true_is_refused(api: ApiClient) -> None:
    _, auth = api.new_user()
    response = await api.post(
        "/chat/feedback", json={"message_id": True, "rating": 1}, headers=auth
    )
    assert response.status_code == 422
