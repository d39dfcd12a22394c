"""POST /chat through the HTTP API: memory, the notes tool, sessions, retries.

Against the real PostgreSQL (rows checked with the superuser connection) and
the fake OpenAI-compatible server (every request it received is inspected).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from typing import Any

import psycopg
import pytest

from memchat.prompts.memory import NOTES_PREAMBLE
from memchat.usecases.chat import DEFAULT_SYSTEM_PROMPT, NO_ROUNDS_LEFT
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import (
    assert_error,
    chat,
    conversation,
    memory_text,
    remembered,
    seed_notes,
    stored_notes,
    system_texts,
)
from tests.utils.fake_openai import FakeOpenAI, search_call, tool_call
from tests.utils.store_data import (
    contents,
    message_id_of,
    session_row,
    snapshot,
    stored_messages,
)

ROLE = {"human": "user", "ai": "assistant"}


def history_rows(admin: psycopg.Connection, session_id: str) -> list[tuple[str, str]]:
    """The stored user/assistant answers of a session as (role, content), in order."""
    return [
        (ROLE[m["type"]], m["data"]["content"])
        for m in stored_messages(admin, uuid.UUID(session_id))
        if m["type"] in ROLE and not m["data"].get("tool_calls")
    ]


# ------------------------------------------------------------------ history


async def test_follow_up_sees_the_history_oldest_first(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    first = await chat(api, auth, "My name is Ada")
    sid = first["session_id"]
    model.script({"content": "Nice to meet you, Ada."})
    await chat(api, auth, "I live in Lyon", session_id=sid)
    third = await chat(api, auth, "Where do I live?", session_id=sid)

    request = model.requests[-1]
    assert request["messages"][0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    assert conversation(request) == [
        ("user", "My name is Ada"),
        ("assistant", "echo: My name is Ada"),
        ("user", "I live in Lyon"),
        ("assistant", "Nice to meet you, Ada."),
        ("user", "Where do I live?"),
    ]
    assert request["messages"][-1] == {"role": "user", "content": "Where do I live?"}
    assert third["memory"]["messages_in_context"] == 4
    assert third["session"]["message_count"] == 6
    assert third["answer"] == "echo: Where do I live?"


async def test_history_window_is_the_requested_number_of_last_messages(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    sid = (await chat(api, auth, "turn 0"))["session_id"]
    for i in range(1, 7):
        await chat(api, auth, f"turn {i}", session_id=sid)

    for window in (1, 3, 13, 50, None):
        before = history_rows(admin, sid)
        fields: dict[str, Any] = {"session_id": sid}
        if window is not None:
            fields["max_history_messages"] = window
        body = await chat(api, auth, f"window {window}", **fields)
        expected = window or api.settings.memory_max_history_messages
        assert len(before) > 12
        assert conversation(model.requests[-1]) == [
            *before[-expected:],
            ("user", f"window {window}"),
        ], window
        assert body["memory"]["messages_in_context"] == min(expected, len(before))


async def test_default_window_comes_from_the_settings(
    custom_api: Any, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    api = custom_api(memory_max_history_messages=3)
    _, auth = api.new_user()
    sid = (await chat(api, auth, "a"))["session_id"]
    await chat(api, auth, "b", session_id=sid)
    before = history_rows(admin, sid)
    body = await chat(api, auth, "c", session_id=sid)
    assert conversation(model.requests[-1]) == [*before[-3:], ("user", "c")]
    assert body["memory"]["messages_in_context"] == 3


@pytest.mark.parametrize("window", [0, 51, -1])
async def test_window_out_of_range_is_422(api: ApiClient, model: FakeOpenAI, window: int) -> None:
    _, auth = api.new_user()
    r = await api.post(
        "/chat", json={"message": "hi", "max_history_messages": window}, headers=auth
    )
    body = assert_error(r, 422, "validation_error")
    assert "max_history_messages" in body["detail"]
    assert model.calls == 0


async def test_long_history_is_cut_to_the_context_budget(
    custom_api: Any, model: FakeOpenAI
) -> None:
    api = custom_api(memory_max_context_chars=1000)
    _, auth = api.new_user()
    sid = (await chat(api, auth, "x" * 480))["session_id"]  # 480 + 486 chars stored
    body = await chat(api, auth, "y" * 30, session_id=sid)
    assert body["memory"]["context_truncated"] is False
    assert body["memory"]["messages_in_context"] == 2
    body = await chat(api, auth, "z", session_id=sid)
    # 4 stored messages, 1032 chars: the oldest no longer fits in 1000.
    assert conversation(model.requests[-1]) == [
        ("assistant", "echo: " + "x" * 480),
        ("user", "y" * 30),
        ("assistant", "echo: " + "y" * 30),
        ("user", "z"),
    ]
    assert body["memory"]["context_truncated"] is True
    assert body["memory"]["messages_in_context"] == 3


# ------------------------------------------------------------ long-term notes


async def test_notes_written_by_the_tool_reach_a_new_session_of_the_same_agent(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    model.script(tool_call("append", content="- Prefers tea"), {"content": "Noted."})
    first = await chat(api, auth, "I prefer tea")
    assert first["answer"] == "Noted."
    assert first["memory"]["long_term_notes_updated"] is True
    assert first["memory"]["long_term_notes_used"] is False
    assert stored_notes(admin, user_id) == ("- Prefers tea", 1)

    fresh = str(uuid.uuid4())
    second = await chat(api, auth, "What do I drink?", session_id=fresh)
    assert second["session_id"] == fresh
    assert second["memory"]["messages_in_context"] == 0
    assert second["memory"]["long_term_notes_used"] is True
    request = model.requests[-1]
    # The notes come as quoted data in the memory block, never as a system message.
    assert system_texts(request) == [DEFAULT_SYSTEM_PROMPT]
    assert f'{NOTES_PREAMBLE} "- Prefers tea"' in (memory_text(request) or "")
    assert remembered(request).notes == "- Prefers tea"
    assert conversation(request) == [("user", "What do I drink?")]

    other = await chat(api, auth, "What do I drink?", agent_name="other")
    assert other["memory"]["long_term_notes_used"] is False
    assert system_texts(model.requests[-1]) == [DEFAULT_SYSTEM_PROMPT]
    assert memory_text(model.requests[-1]) is None
    assert stored_notes(admin, user_id, "other") is None


NOTES = "## Profile\nName: Ada\n\n## Preferences\n- tea"


@pytest.mark.parametrize(
    ("operation", "arguments", "expected"),
    [
        ("overwrite", {"content": "## Fresh\nonly this"}, "## Fresh\nonly this"),
        ("append", {"content": "- likes Lyon"}, NOTES + "\n\n- likes Lyon"),
        ("prepend", {"content": "# About Ada"}, "# About Ada\n\n" + NOTES),
        (
            "replace_section_by_header",
            {"header": "Profile", "content": "Name: Ada Lovelace"},
            "## Profile\nName: Ada Lovelace\n\n## Preferences\n- tea",
        ),
        (
            "replace_section_by_header",
            {"header": "## Projects", "content": "- engine"},
            NOTES + "\n\n## Projects\n- engine",
        ),
        ("delete_section_by_header", {"header": "Profile"}, "## Preferences\n- tea"),
        ("delete_all_notes", {}, ""),
    ],
    ids=[
        "overwrite",
        "append",
        "prepend",
        "replace",
        "replace-new",
        "delete-section",
        "delete-all",
    ],
)
async def test_each_editing_operation_of_the_tool(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    operation: str,
    arguments: dict[str, str],
    expected: str,
) -> None:
    user_id, auth = api.new_user()
    seed_notes(admin, user_id, NOTES)
    call = tool_call(operation, **arguments)
    model.script(call, {"content": "Done."})

    body = await chat(api, auth, "update my notes")

    assert body["answer"] == "Done."
    assert body["memory"]["long_term_notes_updated"] is True
    assert stored_notes(admin, user_id) == (expected, 2)
    call_id = call["tool_calls"][0]["id"]
    result = f"ok: notes updated ({len(expected)} characters)"
    # The model got the notes in the prompt, then the tool's result back.
    assert remembered(model.requests[0]).notes == NOTES
    assert model.requests[1]["messages"][-2]["tool_calls"] == call["tool_calls"]
    assert model.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": call_id,
        "content": result,
    }
    stored = stored_messages(admin, uuid.UUID(body["session_id"]))
    assert [m["type"] for m in stored] == ["human", "ai", "tool", "ai"]
    assert stored[1]["data"]["tool_calls"] == [
        {
            "name": "manage_long_term_memory",
            "args": {"operation": operation, **arguments},
            "id": call_id,
            "type": "tool_call",
        }
    ]
    assert stored[2]["data"]["content"] == result
    assert stored[2]["data"]["tool_call_id"] == call_id
    assert stored[3]["data"]["content"] == "Done."


@pytest.mark.parametrize("seeded", [NOTES, None])
async def test_read_operation_returns_the_notes_and_changes_nothing(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, seeded: str | None
) -> None:
    user_id, auth = api.new_user()
    if seeded:
        seed_notes(admin, user_id, seeded)
    model.script(tool_call("read"), {"content": "Here they are."})
    body = await chat(api, auth, "what do you know about me?")
    assert model.requests[1]["messages"][-1]["content"] == (seeded or "(no notes yet)")
    assert body["memory"]["long_term_notes_updated"] is False
    assert stored_notes(admin, user_id) == ((seeded, 1) if seeded else None)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (tool_call("delete_section_by_header", header="Hobbies"), "no section with header"),
        (tool_call("replace_section_by_header", content="x"), "needs a header"),
        (tool_call("append"), "append needs content"),
        (tool_call("compress"), "unknown operation 'compress'"),
        (
            {
                "tool_calls": [
                    {
                        "id": "call_raw",
                        "type": "function",
                        "function": {"name": "manage_long_term_memory", "arguments": "{not json"},
                    }
                ]
            },
            "arguments must be a JSON object",
        ),
        (
            {
                "tool_calls": [
                    {
                        "id": "call_web",
                        "type": "function",
                        "function": {"name": "web_search", "arguments": "{}"},
                    }
                ]
            },
            "unknown tool 'web_search'",
        ),
    ],
    ids=["missing-section", "no-header", "no-content", "unknown-op", "bad-json", "other-tool"],
)
async def test_a_failing_tool_call_reports_the_error_and_keeps_the_notes(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    reply: dict[str, Any],
    error: str,
) -> None:
    user_id, auth = api.new_user()
    seed_notes(admin, user_id, NOTES)
    model.script(reply, {"content": "Sorry."})
    body = await chat(api, auth, "edit")
    result = model.requests[1]["messages"][-1]
    assert result["role"] == "tool"
    assert result["content"].startswith("error: ") and error in result["content"]
    assert body["answer"] == "Sorry."
    assert body["memory"]["long_term_notes_updated"] is False
    assert stored_notes(admin, user_id) == (NOTES, 1)


async def test_notes_are_capped_at_ltm_max_chars(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    limit = api.settings.ltm_max_chars
    user_id, auth = api.new_user()
    seeded = "x" * (limit - 20)
    seed_notes(admin, user_id, seeded)
    model.script(tool_call("append", content="y" * 9), {"content": "ok"})
    await chat(api, auth, "fits")
    assert stored_notes(admin, user_id) == (seeded + "\n\n" + "y" * 9, 2)

    # One more character than the limit: refused, the notes stay as they are.
    current = stored_notes(admin, user_id)
    assert current is not None
    room = limit - len(current[0])
    model.script(tool_call("append", content="z" * (room - 1)), {"content": "too long"})
    body = await chat(api, auth, "overflow")
    result = model.requests[-1]["messages"][-1]["content"]
    assert result == (
        f"error: the notes would be {limit + 1} characters, over the limit of {limit}; "
        "condense them (e.g. overwrite with a shorter version)"
    )
    assert body["memory"]["long_term_notes_updated"] is False
    assert stored_notes(admin, user_id) == current

    # Exactly at the limit is accepted.
    model.script(tool_call("overwrite", content="w" * limit), {"content": "ok"})
    await chat(api, auth, "at the limit")
    assert stored_notes(admin, user_id) == ("w" * limit, 3)


async def test_several_edits_in_one_round_apply_in_order(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    first = tool_call("append", content="## Pets\n- cat")
    second = tool_call("replace_section_by_header", header="Pets", content="- dog")
    model.script({"tool_calls": first["tool_calls"] + second["tool_calls"]}, {"content": "ok"})
    body = await chat(api, auth, "I have a dog, not a cat")
    assert stored_notes(admin, user_id) == ("## Pets\n- dog", 1)
    results = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [
        first["tool_calls"][0]["id"],
        second["tool_calls"][0]["id"],
    ]
    assert body["session"]["message_count"] == 5  # human, ai(2 calls), tool, tool, ai


async def test_a_model_that_always_calls_tools_still_answers(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    rounds = api.settings.max_tool_rounds
    user_id, auth = api.new_user()
    model.script(*[tool_call("append", content=f"- fact {i}") for i in range(rounds + 5)])

    body = await chat(api, auth, "remember everything")

    assert model.calls == rounds + 1
    assert [r.get("tool_choice") for r in model.requests] == ["auto"] * rounds + ["none"]
    assert body["answer"] == NO_ROUNDS_LEFT
    # The calls of the last completion were not run.
    assert stored_notes(admin, user_id) == (
        "\n\n".join(f"- fact {i}" for i in range(rounds)),
        1,
    )
    stored = stored_messages(admin, uuid.UUID(body["session_id"]))
    assert [m["type"] for m in stored] == ["human", *["ai", "tool"] * rounds, "ai"]
    assert stored[-1]["data"]["content"] == NO_ROUNDS_LEFT
    assert stored[-1]["data"]["tool_calls"] == []


async def test_tool_rounds_follow_max_tool_rounds(custom_api: Any, model: FakeOpenAI) -> None:
    api = custom_api(max_tool_rounds=1)
    _, auth = api.new_user()
    model.script(
        tool_call("append", content="a"),
        {**tool_call("append", content="b"), "content": "partial answer"},
    )
    body = await chat(api, auth, "go")
    assert model.calls == 2
    assert body["answer"] == "partial answer"


async def test_concurrent_note_change_is_merged_not_lost(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """The notes change (another tab) while the model is answering: our edit is
    replayed on the newer notes instead of overwriting them."""
    user_id, auth = api.new_user()
    seed_notes(admin, user_id, "- a")
    model.script(tool_call("append", content="- from chat"), {"content": "ok", "delay": 1.0})
    turn = asyncio.ensure_future(api.post("/chat", json={"message": "note it"}, headers=auth))
    while model.calls < 2:  # the second model call is in flight
        await asyncio.sleep(0.01)
    admin.execute(
        "update public.agent_long_term_memory set notes = '- a\n- from another tab',"
        " version = version + 1 where user_id = %s",
        (user_id,),
    )
    response = await turn
    assert response.status_code == 200, response.text
    assert stored_notes(admin, user_id) == ("- a\n- from another tab\n\n- from chat", 3)


async def test_nul_characters_from_the_model_are_dropped(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    model.script(tool_call("append", content="tea\u0000time"), {"content": "o\u0000k"})
    body = await chat(api, auth, "hi")
    assert body["answer"] == "ok"
    assert stored_notes(admin, user_id) == ("teatime", 1)
    assert contents(admin, uuid.UUID(body["session_id"]))[-1] == ("ai", "ok")


# -------------------------------------------------------------- isolation


async def test_another_users_session_id_is_the_callers_own_and_reveals_nothing(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """Session ids are per user (review finding 14): an id another user holds is,
    for this caller, an id with no session yet, answered exactly as one nobody
    holds (a 404 would tell that it exists). Nothing of the other user's
    session reaches the prompt or changes."""
    owner_id, owner = api.new_user()
    seed_notes(admin, owner_id, "- owner's note: 1234-SECRET")
    sid = (await chat(api, owner, "my PIN is 4711"))["session_id"]
    before = snapshot(admin, owner_id)

    intruder_id, intruder = api.new_user()
    question = "what is my PIN?"
    attempts: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"message": question, "session_id": sid}, {}),
        ({"message": question, "session_id": sid.upper()}, {}),
        ({"message": question}, {"X-Session-ID": sid}),
        ({"message": question, "session_id": sid, "use_memory": False}, {}),
    ]
    for body, headers in attempts:
        r = await api.post("/chat", json=body, headers={**intruder, **headers})
        assert r.status_code == 200, r.text
        assert r.json()["session_id"] == sid
        sent = json.dumps(model.requests[-1])
        assert "4711" not in sent and "SECRET" not in sent

    assert snapshot(admin, owner_id) == before
    (mine,) = snapshot(admin, intruder_id)["chat_sessions"]
    assert mine["id"] == sid and mine["message_count"] == 6  # three turns with memory
    unknown = str(uuid.uuid4())
    fresh = await chat(api, intruder, question, session_id=unknown)
    first = await chat(api, (await _new_auth(api)), question, session_id=sid)
    # The first turn under someone else's id and under a new id look alike.
    for body in (fresh, first):
        assert body["memory"]["messages_in_context"] == 0
        assert body["session"]["message_count"] == 2


async def _new_auth(api: ApiClient) -> dict[str, str]:
    return api.new_user()[1]


# ------------------------------------------------------------ idempotency


async def test_retry_with_client_message_id_replays_the_stored_answer(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    model.script(tool_call("append", content="- x"), {"content": "the first answer"})
    first = await chat(api, auth, "hello", client_message_id="msg-1")
    sid = first["session_id"]
    calls, before = model.calls, snapshot(admin, user_id)

    again = await chat(api, auth, "hello", session_id=sid, client_message_id="msg-1")
    by_header = await api.post(
        "/chat",
        json={"message": "hello", "client_message_id": "msg-1"},
        headers={**auth, "X-Session-ID": sid},
    )

    assert model.calls == calls
    assert snapshot(admin, user_id) == before
    assert again["answer"] == "the first answer" == by_header.json()["answer"]
    assert again["session_id"] == sid
    assert again["session"]["message_count"] == first["session"]["message_count"] == 4
    assert again["usage"] == first["usage"]
    assert again["model"] == first["model"]

    # Another id in the same session is a new turn.
    await chat(api, auth, "hello", session_id=sid, client_message_id="msg-2")
    assert model.calls == calls + 1
    assert len(stored_messages(admin, uuid.UUID(sid))) == 6


async def test_concurrent_retries_store_the_turn_once(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    sid = (await chat(api, auth, "start"))["session_id"]
    model.script({"content": "answer one", "delay": 0.2}, {"content": "answer two", "delay": 0.2})
    responses = await asyncio.gather(
        *[
            api.post(
                "/chat",
                json={"message": "once", "session_id": sid, "client_message_id": "k"},
                headers=auth,
            )
            for _ in range(2)
        ]
    )
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    answers = {r.json()["answer"] for r in responses}
    stored = contents(admin, uuid.UUID(sid))
    assert len(stored) == 4
    assert stored[2] == ("human", "once")
    assert answers == {stored[3][1]}


@pytest.fixture
async def roomy_api(database_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ApiClient]:
    """An app and its own fake model whose listen backlog takes a burst of
    connections (the stdlib default of 5 resets some of 20+ at once)."""
    monkeypatch.setattr(ThreadingHTTPServer, "request_queue_size", 128)
    server = FakeOpenAI()
    client = ApiClient(make_settings(database_url, server.url))
    yield client
    await client.aclose()
    server.close()


async def test_concurrent_turns_on_one_session_lose_nothing(
    roomy_api: ApiClient, admin: psycopg.Connection
) -> None:
    api = roomy_api
    _, auth = api.new_user()
    sid = (await chat(api, auth, "start"))["session_id"]
    n = 24
    responses = await asyncio.gather(
        *[
            api.post("/chat", json={"message": f"m{i}", "session_id": sid}, headers=auth)
            for i in range(n)
        ]
    )
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    assert {r.json()["session_id"] for r in responses} == {sid}
    counts = sorted(r.json()["session"]["message_count"] for r in responses)
    assert counts == list(range(4, 2 * n + 3, 2))

    rows = admin.execute(
        "select id, message from public.chat_message_history where session_id = %s order by id",
        (sid,),
    ).fetchall()
    assert len(rows) == 2 * (n + 1)
    pairs = [(rows[i][1], rows[i + 1][1]) for i in range(0, len(rows), 2)]
    for human, ai in pairs:
        assert human["type"] == "human" and ai["type"] == "ai"
        assert ai["data"]["content"] == "echo: " + human["data"]["content"]
    assert sorted(h["data"]["content"] for h, _ in pairs[1:]) == sorted(f"m{i}" for i in range(n))
    row = session_row(admin, uuid.UUID(sid))
    assert row is not None and row["message_count"] == 2 * (n + 1)


# ------------------------------------------------------------- memory off


async def test_use_memory_false_reads_and_stores_nothing(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    seed_notes(admin, user_id, "- a note")
    sid = (await chat(api, auth, "remembered"))["session_id"]
    before = snapshot(admin, user_id)

    model.script(tool_call("append", content="- should not run"), {"content": "plain"})
    body = await chat(api, auth, "ephemeral", session_id=sid, use_memory=False)
    fresh = await chat(api, auth, "ephemeral too", use_memory=False)

    assert model.requests[-2]["messages"] == [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "ephemeral"},
    ]
    assert "tools" not in model.requests[-2]
    assert body["memory"] == {
        "enabled": False,
        "messages_in_context": 0,
        "long_term_notes_used": False,
        "long_term_notes_updated": False,
        "context_truncated": False,
        "retrieval_ms": 0.0,
        "context_tokens": 0,
        "recall_ms": 0.0,
        "recall_status": "disabled",
        "recalled": [],
        "summary_used": False,
        "summary_covers_until": None,
        "search_memory": [],
    }
    assert body["session"] is None and fresh["session"] is None
    assert body["session_id"] == sid
    assert snapshot(admin, user_id) == before


async def test_memory_disabled_globally_reads_and_stores_nothing(
    custom_api: Any, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    api = custom_api(memory_enabled=False)
    user_id, auth = api.new_user()
    seed_notes(admin, user_id, "- a note")
    first = await chat(api, auth, "one")
    second = await chat(api, auth, "two", session_id=first["session_id"], use_memory=True)
    for request, text in zip(model.requests, ("one", "two"), strict=True):
        assert request["messages"] == [
            {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
            {"role": "user", "content": text},
        ]
    assert first["memory"]["enabled"] is False and second["memory"]["enabled"] is False
    assert first["session"] is None and second["session"] is None
    after = snapshot(admin, user_id)
    assert after["chat_sessions"] == after["chat_message_history"] == []
    assert after["user_agent_active_sessions"] == []
    assert [r["notes"] for r in after["agent_long_term_memory"]] == ["- a note"]


# --------------------------------------------------------- response, sessions


def _utc(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    assert parsed.utcoffset() == timedelta(0), value
    return parsed


async def test_response_shape_is_the_contracts(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    started = datetime.now(UTC)
    clock = time.perf_counter()
    r = await api.post("/chat", json={"message": "hello"}, headers=auth)
    wall_ms = (time.perf_counter() - clock) * 1000
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {
        "answer",
        "session_id",
        "agent_name",
        "model",
        "usage",
        "memory",
        "session",
        "message_id",
        "user_message_id",
        "suggestions",
    }
    assert body["suggestions"] is None  # not asked for
    assert body["answer"] == "echo: hello"
    assert body["agent_name"] == "default"
    assert body["model"] == "fake-model"
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 7}
    assert set(body["memory"]) == {
        "enabled",
        "messages_in_context",
        "long_term_notes_used",
        "long_term_notes_updated",
        "context_truncated",
        "retrieval_ms",
        "context_tokens",
        "recall_ms",
        "recall_status",
        "recalled",
        "summary_used",
        "summary_covers_until",
        "search_memory",
    }
    assert body["memory"]["enabled"] is True
    assert body["memory"]["search_memory"] == []  # not offered (SEARCH_MEMORY_TOOL off)
    assert body["memory"]["recall_status"] == "ok" and body["memory"]["recalled"] == []
    assert body["memory"]["context_tokens"] == 0  # a first message: nothing to remember yet
    assert isinstance(body["memory"]["retrieval_ms"], float)
    # A database round trip within the request, in milliseconds.
    assert 0 < body["memory"]["retrieval_ms"] < wall_ms
    assert set(body["session"]) == {"message_count", "created_at", "last_active_at", "expires_at"}
    assert body["session"]["message_count"] == 2
    created = _utc(body["session"]["created_at"])
    last = _utc(body["session"]["last_active_at"])
    expires = _utc(body["session"]["expires_at"])
    assert created >= started.replace(microsecond=0) and last >= created
    assert abs((expires - last).total_seconds() - api.settings.session_ttl_hours * 3600) < 5
    assert r.headers["x-session-id"] == body["session_id"] == str(uuid.UUID(body["session_id"]))
    assert r.headers["x-request-id"]
    # Tool rounds add up the usage of every model call.
    model.script(tool_call("read"), {"content": "ok"})
    again = await chat(api, auth, "read", session_id=body["session_id"])
    assert again["usage"] == {"prompt_tokens": 22, "completion_tokens": 14}


async def test_times_are_utc_whatever_the_database_time_zone(
    database_url: str, model: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGTZ", "Asia/Kolkata")  # libpq sends it as the session TimeZone
    api = ApiClient(make_settings(database_url, model.url))
    try:
        _, auth = api.new_user()
        body = await chat(api, auth, "what time is it?")
        for key in ("created_at", "last_active_at", "expires_at"):
            _utc(body["session"][key])
    finally:
        await api.aclose()


async def test_session_id_any_case_in_lowercase_out_and_unknown_id_is_created(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    wanted = uuid.uuid4()
    r = await api.post(
        "/chat", json={"message": "hi", "session_id": str(wanted).upper()}, headers=auth
    )
    assert r.status_code == 200, r.text
    assert r.json()["session_id"] == str(wanted) == r.headers["x-session-id"]
    row = session_row(admin, wanted)
    assert row is not None and row["user_id"] == str(user_id) and row["agent_name"] == "default"

    r = await api.post(
        "/chat", json={"message": "again"}, headers={**auth, "X-Session-ID": str(wanted).upper()}
    )
    assert r.json()["session_id"] == str(wanted) == r.headers["x-session-id"]
    assert r.json()["session"]["message_count"] == 4
    # The same id in header and body, in different cases, is no conflict.
    r = await api.post(
        "/chat",
        json={"message": "third", "session_id": str(wanted)},
        headers={**auth, "X-Session-ID": str(wanted).upper()},
    )
    assert r.status_code == 200 and r.json()["session"]["message_count"] == 6


async def test_no_session_id_continues_the_active_session_of_each_agent(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    a1 = await chat(api, auth, "to a")
    b1 = await chat(api, auth, "to b", agent_name="b")
    a2 = await chat(api, auth, "to a again")
    b2 = await chat(api, auth, "to b again", agent_name="b")
    assert a1["session_id"] == a2["session_id"] != b1["session_id"] == b2["session_id"]
    assert a2["agent_name"] == "default" and b2["agent_name"] == "b"
    assert conversation(model.requests[-1]) == [
        ("user", "to b"),
        ("assistant", "echo: to b"),
        ("user", "to b again"),
    ]
    pointers = admin.execute(
        "select agent_name, active_session_id::text from public.user_agent_active_sessions"
        " where user_id = %s order by agent_name",
        (user_id,),
    ).fetchall()
    assert pointers == [("b", b1["session_id"]), ("default", a1["session_id"])]

    # A turn in another session of the agent makes that one active.
    other = str(uuid.uuid4())
    await chat(api, auth, "elsewhere", session_id=other)
    a3 = await chat(api, auth, "where am I?")
    assert a3["session_id"] == other
    assert a3["memory"]["messages_in_context"] == 2


async def test_an_expired_session_starts_empty(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    sid = (await chat(api, auth, "old news"))["session_id"]
    await chat(api, auth, "more old news", session_id=sid)
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 hour' where id = %s",
        (sid,),
    )

    # Without an id, the expired active session is not continued.
    fresh = await chat(api, auth, "new start")
    assert fresh["session_id"] != sid
    assert fresh["memory"]["messages_in_context"] == 0

    # Named explicitly, it starts over: no history, count from zero, new expiry.
    body = await chat(api, auth, "hello again", session_id=sid)
    assert body["session_id"] == sid
    assert conversation(model.requests[-1]) == [("user", "hello again")]
    assert body["memory"]["messages_in_context"] == 0
    assert body["session"]["message_count"] == 2
    assert _utc(body["session"]["expires_at"]) > datetime.now(UTC)
    assert contents(admin, uuid.UUID(sid)) == [
        ("human", "hello again"),
        ("ai", "echo: hello again"),
    ]


async def test_a_session_keeps_its_agent(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    sid = (await chat(api, auth, "hi", agent_name="cook"))["session_id"]
    body = await chat(api, auth, "again", session_id=sid, agent_name="other")
    assert body["agent_name"] == "cook"
    assert body["memory"]["messages_in_context"] == 2


# -------------------------------------------------------------- observers


async def test_each_answered_turn_is_reported_to_the_observer(
    api: ApiClient, model: FakeOpenAI
) -> None:
    seen: list[Any] = []
    api.app.state.memchat.chat.on_turn = seen.append
    _, auth = api.new_user()
    model.script({"delay": 0.2})  # the first turn's model call takes 200 ms
    clock = time.perf_counter()
    first = await chat(api, auth, "hi", client_message_id="c")
    first_ms = (time.perf_counter() - clock) * 1000
    await chat(api, auth, "hi", session_id=first["session_id"], client_message_id="c")
    await chat(api, auth, "quiet", use_memory=False)
    model.script({"status": 500})
    r = await api.post("/chat", json={"message": "fails"}, headers=auth)
    assert r.status_code == 502

    assert [(t.answer, t.replayed) for t in seen] == [
        ("echo: hi", False),
        ("echo: hi", True),
        ("echo: quiet", False),
    ]
    timings = seen[0].timings
    assert set(timings) == {"retrieval_ms", "recall_ms", "model_ms", "record_ms"}
    # Each a step of the first turn, in milliseconds: the model's 200 ms in
    # model_ms, a database round trip or more in each of the others.
    assert 200 <= timings["model_ms"] < first_ms, timings
    assert all(timings[k] > 0 for k in ("retrieval_ms", "recall_ms", "record_ms")), timings
    assert sum(timings.values()) < first_ms, (timings, first_ms)
    assert set(seen[2].timings) == {"model_ms"}


async def test_a_failing_observer_does_not_fail_the_turn(api: ApiClient, model: FakeOpenAI) -> None:
    def broken(result: Any) -> None:
        raise RuntimeError("metrics backend down")

    api.app.state.memchat.chat.on_turn = broken
    _, auth = api.new_user()
    assert (await chat(api, auth, "still answered"))["answer"] == "echo: still answered"


# ------------------------------------------------------------ search_memory


def offered_tools(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools") or []]


async def test_search_memory_on_chat_is_opt_in_reported_and_stored_with_the_turn(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """`search_memory: true` offers the model the tool; its call searches the
    user's earlier sessions, and is reported in `memory.search_memory` and kept
    in the stored answer's metadata, as on /v1."""
    user_id, auth = api.new_user()
    await chat(api, auth, "My dentist is Dr. Moreau", session_id=str(uuid.uuid4()))
    plain = await chat(api, auth, "hello", session_id=str(uuid.uuid4()))
    assert offered_tools(model.requests[-1]) == ["manage_long_term_memory"]  # off by default
    assert plain["memory"]["search_memory"] == []

    model.script(search_call("dentist"), {"content": "Dr. Moreau."})
    body = await chat(
        api, auth, "Who is my dentist?", session_id=str(uuid.uuid4()), search_memory=True
    )
    first, second = model.requests[-2:]
    assert offered_tools(first) == ["manage_long_term_memory", "search_memory"]
    result = second["messages"][-1]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_search"
    assert json.loads(result["content"])[0]["user"] == "My dentist is Dr. Moreau"
    assert body["answer"] == "Dr. Moreau."
    (search,) = body["memory"]["search_memory"]
    earlier = message_id_of(admin, user_id, "My dentist is Dr. Moreau")
    assert (search["query"], search["k"], search["status"]) == ("dentist", 5, "ok")
    assert search["message_ids"][0] == earlier
    stored = stored_messages(admin, uuid.UUID(body["session_id"]))
    assert [m["type"] for m in stored] == ["human", "ai", "tool", "ai"]
    assert stored[-1]["data"]["response_metadata"]["memchat"]["search_memory"] == [search]


async def test_the_setting_offers_search_memory_on_chat_unless_the_request_declines(
    custom_api: Any, model: FakeOpenAI
) -> None:
    api = custom_api(search_memory_tool=True)
    _, auth = api.new_user()
    await chat(api, auth, "hi")
    assert "search_memory" in offered_tools(model.requests[-1])
    await chat(api, auth, "hi again", search_memory=None)  # null: the setting
    assert "search_memory" in offered_tools(model.requests[-1])
    await chat(api, auth, "and again", search_memory=False)
    assert "search_memory" not in offered_tools(model.requests[-1])


@pytest.mark.parametrize("value", ["yes", 1, 0, "true", [True], {"on": True}])
async def test_search_memory_must_be_a_boolean(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, value: Any
) -> None:
    user_id, auth = api.new_user()
    r = await api.post("/chat", json={"message": "hi", "search_memory": value}, headers=auth)
    body = assert_error(r, 422, "validation_error")
    assert "search_memory" in body["detail"]
    assert model.calls == 0
    assert snapshot(admin, user_id)["chat_sessions"] == []


async def test_the_sampling_fields_reach_the_model(custom_api, model):
    """POST /chat takes the sampling fields /v1 does: sent to the model,
    max_tokens capped at OPENAI_MAX_TOKENS."""
    api = custom_api(openai_max_tokens=300)
    _, auth = api.new_user()
    body = {"message": "hi", "max_tokens": 1000, "temperature": 0.1, "stop": "END", "seed": 3}
    r = await api.post("/chat", json=body, headers=auth)
    assert r.status_code == 200, r.text
    sent = model.requests[-1]
    assert (sent["max_tokens"], sent["temperature"], sent["stop"], sent["seed"]) == (
        300,
        0.1,
        ["END"],
        3,
    )
    assert "top_p" not in sent and "presence_penalty" not in sent
    for field, value in (("temperature", 3), ("max_tokens", 0), ("stop", ["a"] * 5), ("seed", "1")):
        r = await api.post("/chat", json={"message": "hi", field: value}, headers=auth)
        assert r.status_code == 422 and field in r.json()["detail"], r.text
