async def test_chat_follow_up(api, model):
    _, auth = api.new_user()
    r = await api.post("/chat", json={"message": "My name is Ada"}, headers=auth)
    assert r.status_code == 200, r.text
    body = r.json()
    sid = body["session_id"]
    assert r.headers["x-session-id"] == sid
    r = await api.post(
        "/chat", json={"message": "What is my name?", "session_id": sid}, headers=auth
    )
    assert r.status_code == 200, r.text
    sent = model.requests[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] in ("user", "assistant")] == [
        "My name is Ada",
        "echo: My name is Ada",
        "What is my name?",
    ]
    assert r.json()["memory"]["messages_in_context"] == 2
    assert r.json()["session"]["message_count"] == 4
