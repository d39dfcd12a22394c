"""GET/PUT/DELETE /memory through the HTTP API."""

from datetime import datetime, timedelta

import pytest

from tests.utils.chat_api import remembered, system_texts
from tests.utils.fake_openai import tool_call

UNICODE = "héllo 👋 日本"


def assert_error(r, status, code):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "detail", "request_id"} and body["error"] == code


async def put(api, auth, notes, **body):
    return await api.put("/memory", json={"notes": notes, **body}, headers=auth)


async def test_no_notes_yet(api):
    _, auth = api.new_user()
    r = await api.get("/memory", headers=auth)
    assert r.status_code == 200, r.text
    assert r.json() == {"agent_name": "default", "notes": "", "version": 0, "updated_at": None}


async def test_put_then_the_model_reads_exactly_those_notes(api, model):
    _, auth = api.new_user()
    notes = f"# Name\nAda Lovelace\n# Likes\n{UNICODE}"
    r = await put(api, auth, notes)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["notes"] == notes and body["version"] == 1 and body["agent_name"] == "default"
    assert datetime.fromisoformat(body["updated_at"]).utcoffset() == timedelta(0)
    assert (await api.get("/memory", headers=auth)).json() == body

    r = await api.post("/chat", json={"message": "who am I?"}, headers=auth)
    assert r.json()["memory"]["long_term_notes_used"] is True
    assert remembered(model.requests[-1]).notes == notes
    assert not any(notes in text for text in system_texts(model.requests[-1]))


async def test_what_the_agent_writes_is_what_get_shows(api, model):
    _, auth = api.new_user()
    model.script(tool_call("append", content="## Pets\na cat named Tom"))
    r = await api.post("/chat", json={"message": "remember my cat Tom"}, headers=auth)
    assert r.json()["memory"]["long_term_notes_updated"] is True
    shown = (await api.get("/memory", headers=auth)).json()
    assert "a cat named Tom" in shown["notes"] and shown["version"] == 1

    edited = shown["notes"].replace("Tom", "Tim")
    r = await put(api, auth, edited, expected_version=1)
    assert r.status_code == 200 and r.json()["version"] == 2
    await api.post("/chat", json={"message": "what is my cat called?"}, headers=auth)
    assert remembered(model.requests[-1]).notes == edited


async def test_expected_version(api):
    _, auth = api.new_user()
    assert (await put(api, auth, "v1", expected_version=0)).json()["version"] == 1
    assert_error(await put(api, auth, "again", expected_version=0), 409, "notes_conflict")
    assert (await put(api, auth, "v2", expected_version=1)).json()["version"] == 2
    r = await put(api, auth, "stale", expected_version=1)
    assert_error(r, 409, "notes_conflict")
    assert "read them again" in r.json()["detail"]
    assert (await put(api, auth, "v3")).json()["version"] == 3  # unconditional
    shown = (await api.get("/memory", headers=auth)).json()
    assert shown["notes"] == "v3" and shown["version"] == 3
    # A version for notes that do not exist yet.
    assert_error(
        await put(api, auth, "x", agent_name="new", expected_version=5), 409, "notes_conflict"
    )


async def test_notes_size_limit(api):
    _, auth = api.new_user()
    limit = api.settings.ltm_max_chars
    r = await put(api, auth, "é" * limit)
    assert r.status_code == 200 and len(r.json()["notes"]) == limit
    r = await put(api, auth, "x" * (limit + 1))
    assert_error(r, 413, "payload_too_large")
    assert str(limit) in r.json()["detail"]
    assert (await api.get("/memory", headers=auth)).json()["notes"] == "é" * limit


async def test_notes_per_agent_and_delete(api):
    _, auth = api.new_user()
    await put(api, auth, "for default")
    await put(api, auth, "for helper", agent_name="helper")
    r = await api.get("/memory", params={"agent_name": "helper"}, headers=auth)
    assert r.json()["notes"] == "for helper" and r.json()["agent_name"] == "helper"

    r = await api.delete("/memory", params={"agent_name": "helper"}, headers=auth)
    assert r.status_code == 200 and r.json() == {"deleted": 1, "versions_deleted": 1}
    r = await api.delete("/memory", params={"agent_name": "helper"}, headers=auth)
    assert r.json() == {"deleted": 0, "versions_deleted": 0}
    r = await api.get("/memory", params={"agent_name": "helper"}, headers=auth)
    assert r.json()["notes"] == "" and r.json()["version"] == 0
    assert (await api.get("/memory", headers=auth)).json()["notes"] == "for default"
    assert (await api.delete("/memory", headers=auth)).json() == {
        "deleted": 1,
        "versions_deleted": 1,
    }


async def test_notes_are_private(api, admin):
    alice_id, alice = api.new_user()
    _, bob = api.new_user()
    await put(api, alice, "alice's secret")
    assert (await api.get("/memory", headers=bob)).json()["notes"] == ""
    assert (await api.delete("/memory", headers=bob)).json() == {
        "deleted": 0,
        "versions_deleted": 0,
    }
    # Bob's write creates Bob's row; Alice's stays.
    assert_error(await put(api, bob, "bob", expected_version=1), 409, "notes_conflict")
    await put(api, bob, "bob's own")
    assert (await api.get("/memory", headers=alice)).json()["notes"] == "alice's secret"
    rows = admin.execute(
        "select notes from public.agent_long_term_memory where user_id = %s", (alice_id,)
    ).fetchall()
    assert rows == [("alice's secret",)]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"notes": None},
        {"notes": 5},
        {"notes": "x", "agent_name": "bad name"},
        {"notes": "x", "expected_version": -1},
        {"notes": "x", "expected_version": "one"},
        {"notes": "x", "other": True},
        {"notes": "nul \u0000 inside"},
    ],
)
async def test_put_validation(api, body):
    _, auth = api.new_user()
    r = await api.put("/memory", json=body, headers=auth)
    assert_error(r, 422, "validation_error")


@pytest.mark.parametrize("method", ["get", "delete"])
async def test_bad_agent_name_is_422(api, method):
    _, auth = api.new_user()
    r = await api.request(method.upper(), "/memory", params={"agent_name": "-" * 65}, headers=auth)
    assert_error(r, 422, "validation_error")


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_memory_needs_a_token(api, method):
    r = await api.request(method, "/memory", json={"notes": "x"} if method == "PUT" else None)
    assert_error(r, 401, "unauthorized")


async def test_put_for_a_deleted_account_is_401(api, admin):
    user_id, auth = api.new_user()
    admin.execute("delete from auth.users where id = %s", (user_id,))
    assert_error(await put(api, auth, "ghost"), 401, "unauthorized")


async def test_remembering_a_line_twice_keeps_it_once(api, model):
    """An append that repeats a line already in the section it joins changes
    nothing: no second line, no new version."""
    _, auth = api.new_user()
    for _ in range(2):
        model.script(tool_call("append", content="- I like green tea"), {"content": "Noted."})
        r = await api.post("/chat", json={"message": "remember I like green tea"}, headers=auth)
        assert r.status_code == 200, r.text
    notes = (await api.get("/memory", headers=auth)).json()
    assert notes["notes"] == "- I like green tea" and notes["version"] == 1
    assert r.json()["memory"]["long_term_notes_updated"] is False
    assert "say that already" in model.requests[-1]["messages"][-1]["content"]
