"""POST /sessions/import and GET /sessions/import/status, through the HTTP API
against the real database: what is stored (times, order, metadata), the
round trip with the exports, idempotency, limits, malformed records, a
failure partway and its retry, and the embeddings waiting for the backfill."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from memchat import bootstrap
from memchat.usecases import history_import
from memchat.usecases.backfill import MAX_ATTEMPTS
from tests.api.test_body_limit import chunked
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error, chat
from tests.utils.fake_openai import FakeOpenAI, tool_call

Build = Callable[..., ApiClient]

T0 = datetime(2023, 5, 20, 9, 30, tzinfo=UTC)
SESSION = "3f1c2b4a-8d2e-4f61-9a0b-5c7d6e8f9a01"


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat()


def plain_session(n: int = 4, *, start: float = 0, **fields: Any) -> dict[str, Any]:
    """A plain-shape session of `n` messages, user and assistant in turn, a minute apart."""
    return {
        **fields,
        "messages": [
            {
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"message {i} of a session at {start}",
                "created_at": at(start + i),
            }
            for i in range(n)
        ],
    }


async def import_(api: ApiClient, auth: dict[str, str], body: Any, **params: str) -> Any:
    r = await api.post("/sessions/import", json=body, headers=auth, params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def export(api: ApiClient, auth: dict[str, str], path: str = "/export") -> Any:
    r = await api.get(path, headers=auth)
    assert r.status_code == 200, r.text
    return r.json()


def stored_messages(admin: psycopg.Connection, session_id: str) -> list[tuple[Any, ...]]:
    return admin.execute(
        "select message->>'type', message->'data'->>'content', created_at"
        " from public.chat_message_history where session_id = %s order by id",
        (session_id,),
    ).fetchall()


# ------------------------------------------------------------ the plain shape


async def test_the_plain_shape_keeps_times_order_and_agent(
    api: ApiClient, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    body = {
        "sessions": [
            plain_session(4, start=0),
            plain_session(3, start=100, agent_name="travel", title="Lisbon"),
        ]
    }
    result = await import_(api, auth, body, agent_name="lme")

    assert result["imported_sessions"] == 2 and result["skipped_sessions"] == 0
    assert result["imported_messages"] == 7
    first, second = (s["session_id"] for s in result["sessions"])
    assert [s["status"] for s in result["sessions"]] == ["imported", "imported"]
    assert [s["messages"] for s in result["sessions"]] == [4, 3]

    rows = stored_messages(admin, first)
    assert [r[0] for r in rows] == ["human", "ai", "human", "ai"]
    assert [r[1] for r in rows] == [m["content"] for m in body["sessions"][0]["messages"]]
    assert [r[2] for r in rows] == [T0 + timedelta(minutes=i) for i in range(4)]

    sessions = {s["id"]: s for s in (await api.get("/sessions", headers=auth)).json()["sessions"]}
    one, two = sessions[first], sessions[second]
    assert (one["agent_name"], two["agent_name"]) == ("lme", "travel")
    assert one["title"] == "message 0 of a session at 0"  # as a chat turn titles it
    assert two["title"] == "Lisbon"
    assert datetime.fromisoformat(one["created_at"]) == T0
    assert datetime.fromisoformat(one["last_active_at"]) == T0 + timedelta(minutes=3)
    assert one["message_count"] == 4 and one["status"] == "active"
    # Expiry counts from the import, whatever the session's dates.
    expires = datetime.fromisoformat(one["expires_at"])
    ttl = timedelta(hours=api.settings.session_ttl_hours)
    assert abs(expires - (datetime.now(UTC) + ttl)) < timedelta(minutes=1)
    # An import never makes a session the one a message without session_id continues.
    r = await api.get("/sessions/active", params={"agent_name": "lme"}, headers=auth)
    assert_error(r, 404, "session_not_found")


async def test_the_plain_shapes_id_is_the_sessions_id_per_user(api: ApiClient) -> None:
    _, alice = api.new_user()
    _, bob = api.new_user()
    chosen = "1b4e28ba-2fa1-41d2-883f-0016d3cca427"
    body = {"sessions": [plain_session(2, id=chosen.upper())]}
    assert (await import_(api, alice, body))["sessions"][0]["session_id"] == chosen
    # Session ids are per user: Bob's import of the same id is his own session.
    theirs = await import_(api, bob, body)
    assert theirs["sessions"] == [{"session_id": chosen, "status": "imported", "messages": 2}]
    alices = await export(api, alice, f"/chat/export/{chosen}")
    assert len(alices["messages"]) == 2


async def test_importing_the_same_file_twice_stores_nothing_twice(
    api: ApiClient, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    body = {
        "sessions": [
            plain_session(4, start=0),  # no id: its id comes from its content
            plain_session(2, start=50, id="9a5c1f9e-8f0e-4a4e-9d55-3f1a2b3c4d5e"),
        ]
    }
    first = await import_(api, auth, body)
    again = await import_(api, auth, body)

    assert again["imported_sessions"] == 0 and again["skipped_sessions"] == 2
    assert again["imported_messages"] == 0
    assert [s["session_id"] for s in again["sessions"]] == [
        s["session_id"] for s in first["sessions"]
    ]
    assert {s["status"] for s in again["sessions"]} == {"skipped"}
    counts = admin.execute(
        "select (select count(*) from public.chat_sessions where user_id = %(u)s),"
        " (select count(*) from public.chat_message_history where user_id = %(u)s)",
        {"u": user_id},
    ).fetchone()
    assert counts == (2, 6)

    # Other content is another session; the same content under another agent too.
    changed = {"sessions": [plain_session(5, start=0)]}
    assert (await import_(api, auth, changed))["imported_sessions"] == 1
    other_agent = {"sessions": [plain_session(4, start=0)]}
    assert (await import_(api, auth, other_agent, agent_name="x"))["imported_sessions"] == 1


async def test_a_session_twice_in_one_request_is_stored_once(api: ApiClient) -> None:
    _, auth = api.new_user()
    session = plain_session(2)
    result = await import_(api, auth, {"sessions": [session, session]})
    assert [s["status"] for s in result["sessions"]] == ["imported", "skipped"]
    assert result["imported_messages"] == 2


# ------------------------------------------------------------ the round trip


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """An account export without what an import may not keep: ids of messages
    (a summary's last message by its place instead), expiry, notes' versions,
    active sessions, and who and when exported."""
    sessions = []
    for session in document["sessions"]:
        ids = [m["id"] for m in session["messages"]]
        covers = session.pop("summary_covers_until")
        session.pop("expires_at")
        session["summary_covers"] = ids.index(covers) if covers is not None else None
        for message in session["messages"]:
            message.pop("id")
        sessions.append(session)
    notes = [
        {k: v for k, v in n.items() if k not in ("version", "earlier_versions")}
        for n in document["long_term_memory"]
    ]
    return {"sessions": sessions, "long_term_memory": notes}


@pytest.fixture
async def history(api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection) -> dict[str, str]:
    """A user with what an account can hold: turns with and without tool
    rounds, a client_message_id, two agents, a rated answer, notes with
    earlier versions, a summary, a cleared session and the fresh one after it."""
    _, auth = api.new_user()
    first = await chat(api, auth, "hi, I am Ada", client_message_id="cm-1")
    model.script(tool_call("append", content="## Drinks\ntea"))
    answer = await chat(api, auth, "remember I like tea")
    await chat(api, auth, "a question ünïcödé ✓", agent_name="work")
    await chat(api, auth, "something to forget", agent_name="scratch")
    r = await api.post("/chat/clear-session", json={"agent_name": "scratch"}, headers=auth)
    assert r.status_code == 200, r.text
    r = await api.post(
        "/chat/feedback",
        json={"message_id": answer["message_id"], "rating": 1, "comment": "spot on"},
        headers=auth,
    )
    assert r.status_code == 200, r.text
    for notes in ("## Work\nmemchat", "## Work\nmemchat, imports"):
        r = await api.put("/memory", json={"agent_name": "work", "notes": notes}, headers=auth)
        assert r.status_code == 200, r.text
    admin.execute(
        "update public.chat_sessions set summary = 'Ada likes tea.',"
        " summary_covers_until = (select min(id) + 1 from public.chat_message_history"
        "                          where session_id = %(s)s),"
        " summary_covers_count = 2, summary_updated_at = now() where id = %(s)s",
        {"s": first["session_id"]},
    )
    return auth


async def test_an_account_export_imported_exports_the_same(
    api: ApiClient, history: dict[str, str]
) -> None:
    original = await export(api, history)
    assert len(original["sessions"]) == 4 and original["long_term_memory"]
    _, auth = api.new_user()
    result = await import_(api, auth, original)
    assert result["imported_sessions"] == 4
    assert result["imported_notes"] == ["default", "work"] and result["skipped_notes"] == []

    again = await export(api, auth)
    assert comparable(again) == comparable(original)
    assert again["active_sessions"] == []  # which session goes on is the account's own


async def test_a_sessions_export_imported_exports_the_same(
    api: ApiClient, history: dict[str, str]
) -> None:
    (session,) = [
        s for s in (await export(api, history))["sessions"] if s["agent_name"] == "default"
    ]
    original = await export(api, history, f"/chat/export/{session['id']}")
    _, auth = api.new_user()
    result = await import_(api, auth, original)
    assert result["sessions"] == [
        {"session_id": session["id"], "status": "imported", "messages": 6}
    ]
    again = await export(api, auth, f"/chat/export/{session['id']}")
    assert comparable({"sessions": [{**again["session"], "messages": again["messages"]}],
                       "long_term_memory": []}) == comparable(
        {"sessions": [{**original["session"], "messages": original["messages"]}],
         "long_term_memory": []}
    )  # fmt: skip


async def test_notes_are_imported_only_where_there_are_none(
    api: ApiClient, history: dict[str, str]
) -> None:
    original = await export(api, history)
    _, auth = api.new_user()
    r = await api.put("/memory", json={"agent_name": "work", "notes": "mine"}, headers=auth)
    assert r.status_code == 200
    result = await import_(api, auth, original)
    assert result["imported_notes"] == ["default"] and result["skipped_notes"] == ["work"]
    r = await api.get("/memory", params={"agent_name": "work"}, headers=auth)
    assert r.json()["notes"] == "mine"
    # Imported notes start their own history: one version, the imported text.
    r = await api.get("/memory/versions", params={"agent_name": "default"}, headers=auth)
    (version,) = r.json()["versions"]
    assert version["notes"] == "## Drinks\ntea"


async def test_imported_turns_count_in_the_stats(api: ApiClient, history: dict[str, str]) -> None:
    before = (await api.get("/chat/stats", headers=history)).json()
    _, auth = api.new_user()
    await import_(api, auth, await export(api, history))
    after = (await api.get("/chat/stats", headers=auth)).json()
    for field in ("messages", "feedback", "first_activity_at", "last_activity_at"):
        assert after[field] == before[field], field
    # Turns and tokens of a cleared session are not exported, so not imported.
    assert after["turns"] == before["turns"] - 1
    assert 0 < after["tokens"]["prompt"] <= before["tokens"]["prompt"]


async def test_an_imported_session_goes_on_as_any_other(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    result = await import_(api, auth, {"sessions": [plain_session(4)]})
    session_id = result["sessions"][0]["session_id"]
    turn = await chat(api, auth, "and now?", session_id=session_id)
    assert turn["session"]["message_count"] == 6
    assert turn["memory"]["messages_in_context"] == 4
    (request,) = model.requests
    assert "message 3 of a session at 0" in json.dumps(request["messages"])


# ------------------------------------------------------------ malformed records


def with_message(**fields: Any) -> dict[str, Any]:
    """A plain body whose second session's second message has `fields` (None: left out)."""
    session = plain_session(3)
    message = {**session["messages"][1], **fields}
    session["messages"][1] = {k: v for k, v in message.items() if v is not None}
    return {"sessions": [plain_session(2), session]}


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            with_message(created_at="2023-05-20T09:30:00"),
            "sessions[1].messages[1].created_at: not an ISO 8601 time with a zone",
        ),
        (
            with_message(created_at="20 May 2023"),
            "sessions[1].messages[1].created_at: not an ISO 8601 time with a zone",
        ),
        (with_message(created_at=None), "sessions[1].messages[1].created_at: is required"),
        (with_message(created_at=1684575000), "sessions[1].messages[1].created_at: not an ISO"),
        (
            with_message(role="system"),
            "sessions[1].messages[1].role: must be user, assistant or tool",
        ),
        (with_message(role=None), "sessions[1].messages[1].role: is required"),
        (with_message(content=None), "sessions[1].messages[1].content: is required"),
        (with_message(content=7), "sessions[1].messages[1].content: must be a string"),
        (with_message(content="a\x00b"), "sessions[1].messages[1].content: must not contain NUL"),
        (with_message(content="a\ud800b"), "sessions[1].messages[1].content: must not contain NUL"),
        (with_message(mood="happy"), "sessions[1].messages[1].mood: is not a field of an import"),
        (
            with_message(role="tool"),
            "sessions[1].messages[1].metadata: is required",
        ),
        (
            with_message(metadata={"usage": {"input_tokens": -1}}),
            "sessions[1].messages[1].metadata.usage.input_tokens:",
        ),
        (
            with_message(feedback={"rating": 5}),
            "sessions[1].messages[1].feedback.rating:",
        ),
        (
            with_message(metadata={"tool_calls": [{"id": "c", "name": "n", "args": {"k\x00": 1}}]}),
            "sessions[1].messages[1].metadata.tool_calls[0].args: must not contain NUL",
        ),
        ({"sessions": [{"id": "not-a-uuid", "messages": []}]}, "sessions[0].id: not a UUID"),
        ({"sessions": [{"agent_name": "no spaces", "messages": []}]}, "sessions[0].agent_name:"),
        (
            {"sessions": [{"title": "x" * 201, "messages": []}]},
            "sessions[0].title: must be 0 to 200",
        ),
        ({"sessions": [{}]}, "sessions[0].messages: is required"),
        ({"sessions": {}}, "sessions: must be a JSON array"),
        ({}, "sessions: is required"),
        ([], "body: must be a JSON object"),
        ({"sessions": [], "extra": 1}, "extra: is not a field of an import"),
        (
            {"session": {"id": "x"}, "messages": [{"role": "user"}]},
            "session.id: not a UUID, e.g. 123e4567-e89b-12d3-a456-426614174000;"
            " messages[0].content: is required; messages[0].created_at: is required.",
        ),
    ],
)
async def test_each_malformed_record_is_a_422_naming_it(
    api: ApiClient, admin: psycopg.Connection, body: Any, detail: str
) -> None:
    user_id, auth = api.new_user()
    # As JSON text with \u escapes: a lone surrogate can only be sent so.
    headers = {**auth, "Content-Type": "application/json"}
    r = await api.post("/sessions/import", content=json.dumps(body), headers=headers)
    got = assert_error(r, 422, "validation_error")
    assert got["detail"].startswith(detail), got["detail"]
    stored = admin.execute(
        "select count(*) from public.chat_sessions where user_id = %s", (user_id,)
    ).fetchone()
    assert stored == (0,)


async def test_many_malformed_records_are_named_a_few_at_a_time(api: ApiClient) -> None:
    _, auth = api.new_user()
    body = {"sessions": [{"messages": [{"role": "user", "content": "x"}] * 8}]}
    r = await api.post("/sessions/import", json=body, headers=auth)
    detail = assert_error(r, 422, "validation_error")["detail"]
    assert detail.count("created_at: is required") == 5 and detail.endswith("; and 3 more.")


async def test_any_offset_python_reads_is_stored_as_its_instant(
    api: ApiClient, admin: psycopg.Connection
) -> None:
    """PostgreSQL's timestamptz takes offsets up to 15:59, ISO 8601 (and
    Python) up to 23:59: a time is stored as its instant, whatever its
    offset; one that is no instant of years 1 to 9999 is a 422 naming it."""
    user_id, auth = api.new_user()
    body = with_message(created_at="2023-05-20T09:30:00+21:59")
    result = await import_(api, auth, body)
    (stored,) = admin.execute(
        "select created_at from public.chat_message_history"
        " where session_id = %s order by id offset 1 limit 1",
        (result["sessions"][1]["session_id"],),
    ).fetchone()
    assert stored == datetime(2023, 5, 19, 11, 31, tzinfo=UTC)

    r = await api.post(
        "/sessions/import", json=with_message(created_at="0001-01-01T00:00:00+01:00"), headers=auth
    )
    detail = assert_error(r, 422, "validation_error")["detail"]
    assert detail.startswith("sessions[1].messages[1].created_at: not an ISO 8601 time")
    (count,) = admin.execute(
        "select count(*) from public.chat_sessions where user_id = %s", (user_id,)
    ).fetchone()
    assert count == 2


@pytest.mark.parametrize(
    "content", [b"{not json", b'{"sessions": [NaN]}', b"[" * 100_000, b"\xff\xfe{}"]
)
async def test_a_body_that_is_not_json_is_400(api: ApiClient, content: bytes) -> None:
    _, auth = api.new_user()
    r = await api.post(
        "/sessions/import", content=content, headers={**auth, "Content-Type": "application/json"}
    )
    assert_error(r, 400, "invalid_json")


# ------------------------------------------------------------ limits


async def test_more_sessions_than_a_request_may_hold_is_413_naming_the_limit(
    custom_api: Build,
) -> None:
    api = custom_api(import_max_sessions=2)
    _, auth = api.new_user()
    r = await api.post("/sessions/import", json={"sessions": [plain_session(1)] * 3}, headers=auth)
    detail = assert_error(r, 413, "payload_too_large")["detail"]
    assert detail.startswith("sessions: 3 in one request; the limit is 2 (IMPORT_MAX_SESSIONS)")


async def test_a_session_over_the_message_limit_is_413_naming_it(custom_api: Build) -> None:
    api = custom_api(import_max_messages_per_session=3)
    _, auth = api.new_user()
    body = {"sessions": [plain_session(3), plain_session(4)]}
    r = await api.post("/sessions/import", json=body, headers=auth)
    detail = assert_error(r, 413, "payload_too_large")["detail"]
    assert detail.startswith("sessions[1].messages: 4 messages; a session may have at most 3")
    assert "IMPORT_MAX_MESSAGES_PER_SESSION" in detail


async def test_a_message_over_import_max_message_chars_is_413_naming_it(
    custom_api: Build, admin: psycopg.Connection
) -> None:
    api = custom_api(import_max_message_chars=100)
    user_id, auth = api.new_user()
    for role in ("user", "assistant"):
        r = await api.post("/sessions/import", json=with_message(role=role, content="x" * 101),
                           headers=auth)  # fmt: skip
        detail = assert_error(r, 413, "payload_too_large")["detail"]
        assert detail.startswith("sessions[1].messages[1].content: 101 characters")
        assert "IMPORT_MAX_MESSAGE_CHARS" in detail
    (count,) = admin.execute(
        "select count(*) from public.chat_sessions where user_id = %s", (user_id,)
    ).fetchone()
    assert count == 0


async def test_a_user_message_longer_than_a_new_turns_imports(
    custom_api: Build, admin: psycopg.Connection, model: FakeOpenAI
) -> None:
    """An imported message is only stored: one pasted document over
    MAX_MESSAGE_CHARS must not refuse years of chats. The window, recall and
    the summary cope with it."""
    api = custom_api(max_message_chars=1000)
    _, auth = api.new_user()
    document = "My passport number is in the drawer. " + "lorem ipsum " * 16_000
    body = with_message(role="user", content=document)
    result = await import_(api, auth, body)
    assert result["imported_messages"] == 5
    stored = stored_messages(admin, result["sessions"][1]["session_id"])
    assert stored[1][1] == document  # whole, as imported
    # The session goes on: a new turn in it is held to MAX_MESSAGE_CHARS,
    # its window to MEMORY_MAX_CONTEXT_CHARS.
    session_id = result["sessions"][1]["session_id"]
    reply = await chat(api, auth, "what did I paste?", session_id=session_id)
    assert reply["session_id"] == session_id
    prompt = json.dumps(model.requests[-1]["messages"])
    assert len(prompt) < 2 * api.settings.memory_max_context_chars + 20_000
    r = await api.post("/chat", json={"message": "y" * 1001, "session_id": session_id},
                       headers=auth)  # fmt: skip
    assert_error(r, 413, "payload_too_large")


async def test_a_message_over_the_databases_size_is_413_naming_it(api: ApiClient) -> None:
    _, auth = api.new_user()
    # Within IMPORT_MAX_MESSAGE_CHARS, over max_message_bytes as UTF-8.
    body = with_message(content="é" * 150_000)
    r = await api.post("/sessions/import", json=body, headers=auth)
    detail = assert_error(r, 413, "payload_too_large")["detail"]
    assert detail.startswith("sessions[1].messages[1]: ") and "262144" in detail


async def test_notes_over_ltm_max_chars_are_413_naming_them(custom_api: Build) -> None:
    api = custom_api(ltm_max_chars=100)
    _, auth = api.new_user()
    body = {"sessions": [], "long_term_memory": [{"agent_name": "a", "notes": "n" * 101}]}
    r = await api.post("/sessions/import", json=body, headers=auth)
    detail = assert_error(r, 413, "payload_too_large")["detail"]
    assert detail.startswith("long_term_memory[0].notes: 101 characters")


async def test_an_import_has_its_own_body_cap(custom_api: Build) -> None:
    api = custom_api(import_max_bytes=3_000_000)
    _, auth = api.new_user()
    # Over every other request's 1 MB, within the import's own cap.
    sessions = [plain_session(2, start=i) for i in range(40)]
    for session in sessions:
        session["messages"][1]["content"] = "y" * 40_000
    body = json.dumps({"sessions": sessions}).encode()
    assert 1_000_000 < len(body) < 3_000_000
    headers = {**auth, "Content-Type": "application/json"}
    r = await api.post("/sessions/import", content=body, headers=headers)
    assert r.status_code == 200 and r.json()["imported_sessions"] == 40, r.text
    # Over it: refused before it is read, with Content-Length or without.
    big = b'{"sessions": [' + b" " * 3_000_000 + b"]}"
    r = await api.post("/sessions/import", content=big, headers=headers)
    detail = assert_error(r, 413, "payload_too_large")["detail"]
    assert detail == "The request body is over 3000000 bytes."

    r = await api.post("/sessions/import", content=chunked(big), headers=headers)
    assert_error(r, 413, "payload_too_large")
    # Every other route keeps its 1 MB.
    r = await api.put("/memory", content=b'{"notes": "' + b"n" * 1_000_001 + b'"}', headers=headers)
    assert assert_error(r, 413, "payload_too_large")["detail"].endswith("1000000 bytes.")


# ------------------------------------------------------------ partway


async def test_a_failure_partway_keeps_what_was_stored_and_a_retry_completes_it(
    api: ApiClient, admin: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large import is several transactions: one that fails rolls back only
    itself; the same request sent again stores what is missing, once."""
    monkeypatch.setattr(history_import, "TRANSACTION_MESSAGES", 4)
    user_id, auth = api.new_user()
    body = {"sessions": [plain_session(4, start=10 * i, title=f"s{i}") for i in range(3)]}
    # The database refuses the second transaction's session (a real refusal:
    # a constraint the test adds for this user's "s1" only).
    admin.execute(
        "alter table public.chat_sessions add constraint import_test_refusal"
        " check (user_id <> %s::uuid or title <> 's1') not valid".replace("%s", f"'{user_id}'")
    )
    try:
        r = await api.post("/sessions/import", json=body, headers=auth)
        assert_error(r, 422, "validation_error")
    finally:
        admin.execute("alter table public.chat_sessions drop constraint import_test_refusal")
    kept = admin.execute(
        "select title from public.chat_sessions where user_id = %s", (user_id,)
    ).fetchall()
    assert kept == [("s0",)]

    retried = await import_(api, auth, body)
    assert [s["status"] for s in retried["sessions"]] == ["skipped", "imported", "imported"]
    counts = admin.execute(
        "select count(*), sum(message_count) from public.chat_sessions where user_id = %s",
        (user_id,),
    ).fetchone()
    assert counts == (3, 12)


# ------------------------------------------------------------ embeddings


async def test_imported_user_messages_wait_for_embeddings_until_the_backfill(
    api: ApiClient, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    status = (await api.get("/sessions/import/status", headers=auth)).json()
    assert status["embeddings_pending"] == 0 and status["recall_ready"] is True
    assert status["limits"] == {
        "max_request_bytes": api.settings.import_max_bytes,
        "max_sessions_per_request": api.settings.import_max_sessions,
        "max_messages_per_session": api.settings.import_max_messages_per_session,
        "max_message_chars": api.settings.import_max_message_chars,
    }

    result = await import_(api, auth, {"sessions": [plain_session(4), plain_session(3, start=9)]})
    assert result["embeddings_pending"] == 7  # every message with text: 4 + 3
    status = (await api.get("/sessions/import/status", headers=auth)).json()
    assert (status["embeddings_pending"], status["recall_ready"]) == (7, False)
    queued = admin.execute(
        "select count(*) from memchat.embedding_queue where user_id = %s", (user_id,)
    ).fetchone()
    assert queued == (2,)

    # What the backfill stores (here as the owner): then recall sees them all.
    embed = (
        "insert into memchat.message_embeddings"
        " (message_id, user_id, session_id, agent_name, created_at, embedding, model)"
        " select h.id, h.user_id, h.session_id, s.agent_name, h.created_at,"
        "        array_fill(0.1, array[%s])::extensions.vector, 'test'"
        "   from public.chat_message_history h"
        "   join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id"
        "  where h.user_id = %s and h.message->>'type' = %s"
    )
    admin.execute(embed, (api.settings.embedding_dimensions, user_id, "human"))
    status = (await api.get("/sessions/import/status", headers=auth)).json()
    # A user message also waits for its fact keys and memories (facts_save).
    assert (status["embeddings_pending"], status["recall_ready"]) == (7, False)
    admin.execute(
        "insert into memchat.message_facts_made (message_id, user_id, model)"
        " select message_id, user_id, model from memchat.message_embeddings where user_id = %s",
        (user_id,),
    )
    status = (await api.get("/sessions/import/status", headers=auth)).json()
    assert (status["embeddings_pending"], status["recall_ready"]) == (3, False)  # the answers
    admin.execute(embed, (api.settings.embedding_dimensions, user_id, "ai"))
    status = (await api.get("/sessions/import/status", headers=auth)).json()
    assert (status["embeddings_pending"], status["recall_ready"]) == (0, True)
    # Importing the same again queues nothing new.
    assert (await import_(api, auth, {"sessions": [plain_session(4)]}))["embeddings_pending"] == 0


async def test_messages_the_backfill_gave_up_on_are_reported_until_imported_again(
    api: ApiClient,
    admin: psycopg.Connection,
    model: FakeOpenAI,
    worker_url: str,
) -> None:
    """A session whose embeddings failed again and again is given up: its
    messages no longer wait (pending), but recall cannot find them, so the
    status and the import say so (embeddings_failed) and recall is not ready;
    importing it again queues it again."""
    user_id, auth = api.new_user()
    body = {"sessions": [plain_session(4, start=0), plain_session(3, start=9)]}
    result = await import_(api, auth, body)
    assert (result["embeddings_pending"], result["embeddings_failed"]) == (7, 0)
    given_up, retried = (s["session_id"] for s in result["sessions"])

    # The backfill, as the worker runs it, against a provider that keeps failing:
    # one session at its last attempt is given up, the other backs off.
    admin.execute("delete from memchat.embedding_queue where user_id <> %s", (user_id,))
    admin.execute(
        "update memchat.embedding_queue set attempts = %s where session_id = %s",
        (MAX_ATTEMPTS - 1, given_up),
    )
    model.script_embeddings(*[{"status": 503}] * 4)
    embedder = bootstrap.embedder(make_settings(worker_url, model.url, job="summaries"))
    try:
        run = await embedder.run()
    finally:
        await embedder.close()
    assert (run.failed, run.gave_up) == (2, 1)

    status = (await api.get("/sessions/import/status", headers=auth)).json()
    assert status["embeddings_pending"] == 3  # the session retried later
    assert status["embeddings_failed"] == 4  # the one given up
    assert status["recall_ready"] is False
    assert retried != given_up

    # The same file again: its sessions are queued again, the given-up one too.
    again = await import_(api, auth, body)
    assert [s["status"] for s in again["sessions"]] == ["skipped", "skipped"]
    assert (again["embeddings_pending"], again["embeddings_failed"]) == (7, 0)


# ------------------------------------------------------------ the throttle


async def test_the_token_is_taken_before_the_body_is_read(
    custom_api: Build, admin: psycopg.Connection
) -> None:
    """Every import spends a token, a refused one too (its body was read and
    parsed), and a throttled one is refused before its body is read: an
    invalid body cannot be sent again and again at no cost."""
    api = custom_api(import_rate_per_minute=0.01, import_rate_burst=2)
    user_id, auth = api.new_user()
    r = await api.post("/sessions/import", json=with_message(created_at="noon"), headers=auth)
    assert_error(r, 422, "validation_error")
    await import_(api, auth, {"sessions": [plain_session(2)]})
    for body in (with_message(created_at="noon"), {"sessions": [plain_session(2, start=5)]}):
        r = await api.post("/sessions/import", json=body, headers=auth)
        assert_error(r, 429, "rate_limited")
        assert r.headers["connection"] == "close"  # the rest of the body is not read
    # Refused before the body is read: one that is not even JSON is a 429 too.
    r = await api.post(
        "/sessions/import",
        content=b"{not json",
        headers={**auth, "Content-Type": "application/json"},
    )
    assert_error(r, 429, "rate_limited")
    (count,) = admin.execute(
        "select count(*) from public.chat_sessions where user_id = %s", (user_id,)
    ).fetchone()
    assert count == 1  # the refused ones stored nothing


# ------------------------------------------------------------ expired sessions


async def test_an_expired_sessions_id_imports_anew(
    api: ApiClient, admin: psycopg.Connection
) -> None:
    """An expired session is gone for every purpose, whether or not the
    cleanup has deleted it yet: importing its id imports, and the cleanup
    then leaves the imported session alone."""
    user_id, auth = api.new_user()
    first = await import_(api, auth, {"sessions": [plain_session(2, id=SESSION)]})
    assert first["imported_sessions"] == 1
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute'"
        " where id = %s and user_id = %s",
        (SESSION, user_id),
    )
    again = await import_(api, auth, {"sessions": [plain_session(4, start=60, id=SESSION)]})
    assert (again["imported_sessions"], again["skipped_sessions"]) == (1, 0)
    assert again["sessions"][0] == {"session_id": SESSION, "status": "imported", "messages": 4}
    rows = stored_messages(admin, SESSION)
    assert [r[1] for r in rows] == [f"message {i} of a session at 60" for i in range(4)]
    (live,) = admin.execute(
        "select expires_at > now() from public.chat_sessions where id = %s and user_id = %s",
        (SESSION, user_id),
    ).fetchone()
    assert live


# ------------------------------------------------------------ the quota


async def test_an_import_past_the_quota_is_refused_whole(
    custom_api: Build, admin: psycopg.Connection
) -> None:
    """USER_MAX_STORED_MESSAGES: an import that would take the user past it
    stores nothing (413 quota_exceeded naming the limit), across all of its
    transactions; the messages of sessions already stored are not counted
    again, so a retry of a partly stored import completes."""
    api = custom_api(user_max_stored_messages=10)
    user_id, auth = api.new_user()
    sessions = [plain_session(4, start=10 * i, title=f"s{i}") for i in range(3)]
    r = await api.post("/sessions/import", json={"sessions": sessions}, headers=auth)
    detail = assert_error(r, 413, "quota_exceeded")["detail"]
    assert "limit of 10 stored messages" in detail and "USER_MAX_STORED_MESSAGES" in detail
    (count,) = admin.execute(
        "select count(*) from public.chat_message_history where user_id = %s", (user_id,)
    ).fetchone()
    assert count == 0
    # Two sessions (8 messages) fit; then the whole request again: only the
    # third is new, and it does not fit either.
    await import_(api, auth, {"sessions": sessions[:2]})
    r = await api.post("/sessions/import", json={"sessions": sessions}, headers=auth)
    assert_error(r, 413, "quota_exceeded")
    again = await import_(api, auth, {"sessions": sessions[:2]})  # nothing new: fits
    assert again["imported_sessions"] == 0
    stats = (await api.get("/chat/stats", headers=auth)).json()
    assert stats["storage"] == {"stored_messages": 8, "max_stored_messages": 10}


async def test_the_databases_quota_holds_whatever_the_api_allows(
    custom_api: Build, admin: psycopg.Connection
) -> None:
    """memchat.limits.max_stored_messages holds too: the lower of the two applies."""
    api = custom_api(user_max_stored_messages=1_000)
    _, auth = api.new_user()
    admin.execute("update memchat.limits set max_stored_messages = 5")
    try:
        r = await api.post("/sessions/import", json={"sessions": [plain_session(6)]}, headers=auth)
        assert "limit of 5 stored" in assert_error(r, 413, "quota_exceeded")["detail"]
        stats = (await api.get("/chat/stats", headers=auth)).json()
        assert stats["storage"] == {"stored_messages": 0, "max_stored_messages": 5}
    finally:
        admin.execute("update memchat.limits set max_stored_messages = default")


async def test_other_requests_are_answered_while_a_large_import_is_read(
    api: ApiClient,
) -> None:
    """A large body is parsed and validated off the event loop: a GET /health
    sent while an invalid 10 MB import is being read is answered before it."""
    _, auth = api.new_user()
    sessions = [plain_session(100, start=i) for i in range(300)]
    for session in sessions:
        for message in session["messages"]:
            message["content"] += " lorem ipsum" * 20
    sessions[-1]["messages"][-1]["created_at"] = "bad"
    body = json.dumps({"sessions": sessions}).encode()
    assert len(body) > 10_000_000
    done: list[str] = []

    async def send_import() -> None:
        r = await api.post(
            "/sessions/import", content=body, headers={**auth, "Content-Type": "application/json"}
        )
        assert_error(r, 422, "validation_error")
        done.append("import")

    async def send_health() -> None:
        r = await api.get("/health")
        assert r.status_code == 200
        done.append("health")

    importing = asyncio.create_task(send_import())
    await asyncio.sleep(0)  # the import goes first
    await asyncio.gather(importing, send_health())
    assert done == ["health", "import"]
