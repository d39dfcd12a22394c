"""GET /sessions and GET /sessions/active through the HTTP API."""

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

BASE = datetime(2026, 1, 1, tzinfo=UTC)


def add_session(admin, user_id, *, minutes, agent="default", title=None, session_id=None):
    """A session row last active `minutes` after BASE (expires far in the future)."""
    session_id = session_id or uuid.uuid4()
    at = BASE + timedelta(minutes=minutes)
    admin.execute(
        "insert into public.chat_sessions"
        " (id, user_id, agent_name, title, created_at, last_active_at, expires_at)"
        " values (%s, %s, %s, %s, %s, %s, now() + interval '1 day')",
        (session_id, user_id, agent, title, at, at),
    )
    return str(session_id)


async def all_pages(api, auth, **params):
    ids, cursor, pages = [], None, 0
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        r = await api.get("/sessions", params=query, headers=auth)
        assert r.status_code == 200, r.text
        body = r.json()
        pages += 1
        ids += [s["id"] for s in body["sessions"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return ids, pages


def assert_error(r, status, code):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "detail", "request_id"} and body["error"] == code


async def test_no_sessions(api):
    _, auth = api.new_user()
    r = await api.get("/sessions", headers=auth)
    assert r.status_code == 200
    assert r.json() == {"sessions": [], "next_cursor": None}


async def test_sessions_newest_first_with_fields(api, model):
    _, auth = api.new_user()
    first = (await api.post("/chat", json={"message": "first one"}, headers=auth)).json()
    second = (
        await api.post("/chat", json={"message": "second", "agent_name": "b"}, headers=auth)
    ).json()
    r = await api.get("/sessions", headers=auth)
    sessions = r.json()["sessions"]
    assert [s["id"] for s in sessions] == [second["session_id"], first["session_id"]]
    one = sessions[1]
    assert set(one) == {
        "id",
        "agent_name",
        "title",
        "status",
        "message_count",
        "created_at",
        "last_active_at",
        "expires_at",
    }
    assert one["agent_name"] == "default" and one["title"] == "first one"
    assert one["status"] == "active" and one["message_count"] == 2
    for key in ("created_at", "last_active_at", "expires_at"):
        assert datetime.fromisoformat(one[key]).utcoffset() == timedelta(0)


async def test_pagination_walks_every_session_once(api, admin):
    user_id, auth = api.new_user()
    expected = [add_session(admin, user_id, minutes=m) for m in range(7)]
    # Ties on last_active_at are ordered by id and still paginate exactly.
    tied = [add_session(admin, user_id, minutes=3) for _ in range(4)]
    expected = expected[:3] + sorted([expected[3], *tied]) + expected[4:]
    ids, pages = await all_pages(api, auth, limit=2)
    assert ids == list(reversed(expected))
    assert pages == 6

    r = await api.get("/sessions", params={"limit": 11}, headers=auth)
    assert len(r.json()["sessions"]) == 11 and r.json()["next_cursor"] is None
    r = await api.get("/sessions", params={"limit": 10}, headers=auth)
    assert r.json()["next_cursor"] is not None


async def test_filter_by_agent(api, admin):
    user_id, auth = api.new_user()
    a = [add_session(admin, user_id, minutes=m, agent="a") for m in range(3)]
    add_session(admin, user_id, minutes=10, agent="b")
    ids, _ = await all_pages(api, auth, agent_name="a", limit=2)
    assert ids == list(reversed(a))
    r = await api.get("/sessions", params={"agent_name": "nobody"}, headers=auth)
    assert r.json()["sessions"] == []


async def test_never_lists_another_users_sessions(api, admin):
    alice_id, alice = api.new_user()
    bob_id, _bob = api.new_user()
    add_session(admin, alice_id, minutes=1)
    bobs = add_session(admin, bob_id, minutes=2)
    ids, _ = await all_pages(api, alice)
    assert bobs not in ids and len(ids) == 1
    # A cursor naming Bob's session reveals nothing either.
    raw = json.dumps([(BASE + timedelta(days=1)).isoformat(), bobs]).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    r = await api.get("/sessions", params={"cursor": cursor}, headers=alice)
    assert [s["id"] for s in r.json()["sessions"]] == ids


def b64(text):
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "not a cursor",
        "%%%",
        b64("not json"),
        b64("[1, 2]"),
        b64('["2026-01-01T00:00:00", "' + str(uuid.uuid4()) + '"]'),  # no zone
        b64('["2026-01-01T00:00:00+00:00", "nope"]'),
        b64('["2026-01-01T00:00:00+00:00"]'),
        b64("{}"),
    ],
)
async def test_bad_cursor_is_400(api, cursor):
    _, auth = api.new_user()
    r = await api.get("/sessions", params={"cursor": cursor}, headers=auth)
    assert_error(r, 400, "bad_request")
    assert "cursor" in r.json()["detail"]


@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": 101}, {"limit": "x"}, {"agent_name": "bad name"}]
)
async def test_bad_query_is_422(api, params):
    _, auth = api.new_user()
    r = await api.get("/sessions", params=params, headers=auth)
    assert_error(r, 422, "validation_error")


async def test_active_session(api, model, admin):
    _user_id, auth = api.new_user()
    r = await api.get("/sessions/active", headers=auth)
    assert_error(r, 404, "session_not_found")

    sid = (await api.post("/chat", json={"message": "hi"}, headers=auth)).json()["session_id"]
    r = await api.get("/sessions/active", params={"agent_name": "default"}, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == sid and r.json()["message_count"] == 2
    r = await api.get("/sessions/active", params={"agent_name": "other"}, headers=auth)
    assert_error(r, 404, "session_not_found")

    # An expired session is not the active one any more.
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute' where id = %s",
        (sid,),
    )
    r = await api.get("/sessions/active", headers=auth)
    assert_error(r, 404, "session_not_found")

    r = await api.get("/sessions/active", params={"agent_name": "x y"}, headers=auth)
    assert_error(r, 422, "validation_error")


async def test_active_session_is_per_user(api, model):
    _, alice = api.new_user()
    _, bob = api.new_user()
    await api.post("/chat", json={"message": "hi"}, headers=alice)
    r = await api.get("/sessions/active", headers=bob)
    assert_error(r, 404, "session_not_found")


@pytest.mark.parametrize("path", ["/sessions", "/sessions/active"])
async def test_sessions_need_a_token(api, path):
    r = await api.get(path)
    assert_error(r, 401, "unauthorized")
