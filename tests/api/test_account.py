"""DELETE /me through the HTTP API."""

from tests.utils.store_data import snapshot


def assert_error(r, status, code):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "detail", "request_id"} and body["error"] == code


async def test_delete_me_erases_everything_and_only_mine(api, model, admin):
    alice_id, alice = api.new_user()
    bob_id, bob = api.new_user()
    first = (await api.post("/chat", json={"message": "one"}, headers=alice)).json()
    await api.post(
        "/chat", json={"message": "two", "session_id": first["session_id"]}, headers=alice
    )
    await api.post("/chat", json={"message": "three", "agent_name": "helper"}, headers=alice)
    await api.put("/memory", json={"notes": "alice notes"}, headers=alice)
    await api.post("/chat/clear-session", json={"agent_name": "helper"}, headers=alice)
    await api.post("/chat", json={"message": "bob's"}, headers=bob)
    await api.put("/memory", json={"notes": "bob notes"}, headers=bob)
    bob_before = snapshot(admin, bob_id)

    r = await api.delete("/me", headers=alice)
    assert r.status_code == 200, r.text
    # helper: the cleared session and its fresh successor; default: one session.
    assert r.json() == {
        "deleted": {
            "messages": 4,
            "sessions": 3,
            "active_sessions": 2,
            "long_term_memory": 1,
            "memories": 0,
        }
    }
    assert snapshot(admin, alice_id) == {
        "chat_sessions": [],
        "user_agent_active_sessions": [],
        "chat_message_history": [],
        "agent_long_term_memory": [],
    }
    assert snapshot(admin, bob_id) == bob_before

    r = await api.delete("/me", headers=alice)
    assert r.json() == {
        "deleted": {
            "messages": 0,
            "sessions": 0,
            "active_sessions": 0,
            "long_term_memory": 0,
            "memories": 0,
        }
    }
    # The account itself is Supabase Auth's; it can start over.
    r = await api.post("/chat", json={"message": "fresh start"}, headers=alice)
    assert r.status_code == 200 and r.json()["memory"]["messages_in_context"] == 0
    assert (await api.get("/memory", headers=alice)).json()["notes"] == ""


async def test_delete_me_needs_a_token(api):
    assert_error(await api.delete("/me"), 401, "unauthorized")
    r = await api.delete("/me", headers={"Authorization": "Basic abc"})
    assert_error(r, 401, "unauthorized")
