"""POST /chat/clear-session through the HTTP API."""

import uuid

from tests.utils.store_data import session_row

OLD = "the secret word is pelican"


def sent_text(model):
    """Everything the model saw in its last request, as one string."""
    return "\n".join(str(m.get("content") or "") for m in model.requests[-1]["messages"])


async def chat(api, auth, message, **body):
    r = await api.post("/chat", json={"message": message, **body}, headers=auth)
    assert r.status_code == 200, r.text
    return r.json()


def assert_error(r, status, code=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "detail", "request_id"}
    assert body["detail"]
    if code:
        assert body["error"] == code


async def test_clear_active_session_then_nothing_old_reaches_the_model(api, model, admin):
    _, auth = api.new_user()
    old = (await chat(api, auth, OLD))["session_id"]
    await chat(api, auth, "and the colour is teal", session_id=old)
    assert "pelican" in sent_text(model)

    r = await api.post("/chat/clear-session", json={}, headers=auth)
    assert r.status_code == 200, r.text
    cleared = r.json()
    assert cleared["cleared_session_id"] == old
    assert cleared["deleted_messages"] == 4
    new = cleared["new_session_id"]
    assert uuid.UUID(new) and new != old

    assert (
        admin.execute(
            "select count(*) from public.chat_message_history where session_id = %s", (old,)
        ).fetchone()[0]
        == 0
    )
    row = session_row(admin, uuid.UUID(old))
    assert row["status"] == "cleared" and row["message_count"] == 0 and row["title"] is None
    r = await api.get("/sessions/active", headers=auth)
    assert r.json()["id"] == new

    # No session id: the fresh active session, empty.
    answer = await chat(api, auth, "what was the secret word?")
    assert answer["session_id"] == new
    assert answer["memory"]["messages_in_context"] == 0
    assert "pelican" not in sent_text(model) and "teal" not in sent_text(model)

    # The old id: its messages are gone too.
    answer = await chat(api, auth, "and now?", session_id=old)
    assert answer["memory"]["messages_in_context"] == 0
    assert "pelican" not in sent_text(model) and "teal" not in sent_text(model)


async def test_clear_by_id_any_case_and_other_agent(api, model, admin):
    _, auth = api.new_user()
    kept = (await chat(api, auth, "default agent stays"))["session_id"]
    other = (await chat(api, auth, "for the other agent", agent_name="helper"))["session_id"]

    r = await api.post("/chat/clear-session", json={"session_id": other.upper()}, headers=auth)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["cleared_session_id"] == other and body["deleted_messages"] == 2
    new = session_row(admin, uuid.UUID(body["new_session_id"]))
    assert new["agent_name"] == "helper" and new["status"] == "active"

    r = await api.get("/sessions/active", params={"agent_name": "helper"}, headers=auth)
    assert r.json()["id"] == body["new_session_id"]
    r = await api.get("/sessions/active", headers=auth)
    assert r.json()["id"] == kept
    assert session_row(admin, uuid.UUID(kept))["message_count"] == 2


async def test_clear_twice_clears_the_fresh_session(api, model):
    _, auth = api.new_user()
    await chat(api, auth, "hello")
    first = (await api.post("/chat/clear-session", json={}, headers=auth)).json()
    r = await api.post("/chat/clear-session", json={"agent_name": "default"}, headers=auth)
    assert r.status_code == 200, r.text
    second = r.json()
    assert second["cleared_session_id"] == first["new_session_id"]
    assert second["deleted_messages"] == 0


async def test_clear_without_active_session_is_404(api):
    _, auth = api.new_user()
    r = await api.post("/chat/clear-session", json={"session_id": None}, headers=auth)
    assert_error(r, 404, "session_not_found")
    assert "no active session" in r.json()["detail"]


async def test_clear_unknown_or_other_users_session_is_404(api, model, admin):
    _, alice = api.new_user()
    _, bob = api.new_user()
    alices = (await chat(api, alice, "alice's private chat"))["session_id"]

    for session_id in (alices, str(uuid.uuid4())):
        r = await api.post("/chat/clear-session", json={"session_id": session_id}, headers=bob)
        assert_error(r, 404, "session_not_found")
    row = session_row(admin, uuid.UUID(alices))
    assert row["status"] == "active" and row["message_count"] == 2
    assert (
        admin.execute(
            "select count(*) from public.chat_message_history where session_id = %s", (alices,)
        ).fetchone()[0]
        == 2
    )
    # Bob got no session out of it either.
    r = await api.get("/sessions", headers=bob)
    assert r.json()["sessions"] == []


async def test_clear_rejects_bad_input(api):
    _, auth = api.new_user()
    r = await api.post("/chat/clear-session", json={"session_id": "nope"}, headers=auth)
    assert_error(r, 400, "bad_request")
    assert "session_id must be a UUID" in r.json()["detail"]
    for body in ({"agent_name": "bad name!"}, {"session_id": None, "extra": 1}, {"session_id": 42}):
        r = await api.post("/chat/clear-session", json=body, headers=auth)
        assert_error(r, 422, "validation_error")
    r = await api.post(
        "/chat/clear-session",
        content=b"{",
        headers={**auth, "content-type": "application/json"},
    )
    assert_error(r, 400, "invalid_json")


async def test_clear_needs_a_token(api):
    r = await api.post("/chat/clear-session", json={})
    assert_error(r, 401, "unauthorized")
    r = await api.post(
        "/chat/clear-session", json={}, headers={"Authorization": "Bearer not-a-token"}
    )
    assert_error(r, 401, "unauthorized")
