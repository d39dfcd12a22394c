"""A token for a user who no longer exists gets 401 on every endpoint."""

import pytest


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/sessions", None),
        ("GET", "/sessions/active", None),
        ("GET", "/memory", None),
        ("PUT", "/memory", {"agent_name": "default", "notes": "x"}),
        ("DELETE", "/memory", None),
        ("GET", "/export", None),
        ("POST", "/chat/clear-session", {"session_id": None}),
        ("POST", "/chat", {"message": "hello"}),
        ("DELETE", "/me", None),
    ],
)
async def test_deleted_user_is_unauthorized(api, admin, model, method, path, body):
    user_id, auth = api.new_user()
    admin.execute("delete from auth.users where id = %s", (user_id,))
    r = await api.request(method, path, json=body, headers=auth)
    assert r.status_code == 401, r.text
    assert r.json()["error"] == "unauthorized"
    assert model.calls == 0
