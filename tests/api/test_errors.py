"""POST /chat error cases of the contract: status, error JSON, nothing stored.

Every error is `{"error", "detail", "request_id"}` with the X-Request-ID
header; a failed or timed-out model leaves the database as it was.
"""

from __future__ import annotations

import re
import socket
import uuid

import psycopg
import pytest

from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error, chat, seed_notes
from tests.utils.fake_openai import FakeOpenAI, tool_call
from tests.utils.store_data import snapshot

# ------------------------------------------------------------------ 400


@pytest.mark.parametrize(
    "session_id", ["not-a-uuid", "123", "", "123e4567-e89b-12d3-a456-42661417400g"]
)
async def test_malformed_session_id_in_the_body_is_400(
    api: ApiClient, model: FakeOpenAI, session_id: str
) -> None:
    _, auth = api.new_user()
    r = await api.post("/chat", json={"message": "hi", "session_id": session_id}, headers=auth)
    body = assert_error(r, 400, "bad_request")
    assert "session_id" in body["detail"]
    assert model.calls == 0


async def test_malformed_session_id_header_is_400(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    r = await api.post(
        "/chat", json={"message": "hi"}, headers={**auth, "X-Session-ID": "session-1"}
    )
    body = assert_error(r, 400, "bad_request")
    assert "X-Session-ID" in body["detail"]
    assert model.calls == 0


async def test_header_and_body_naming_different_sessions_is_400(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    r = await api.post(
        "/chat",
        json={"message": "hi", "session_id": str(uuid.uuid4())},
        headers={**auth, "X-Session-ID": str(uuid.uuid4())},
    )
    assert_error(r, 400, "bad_request")
    assert model.calls == 0


@pytest.mark.parametrize(
    "content", [b"{not json", b'{"message": "hi",}', b'{"message": "unterminated']
)
async def test_invalid_json_body_is_400(api: ApiClient, model: FakeOpenAI, content: bytes) -> None:
    _, auth = api.new_user()
    r = await api.post(
        "/chat", content=content, headers={**auth, "Content-Type": "application/json"}
    )
    assert_error(r, 400, "invalid_json")
    assert model.calls == 0


@pytest.mark.parametrize("message", ["", "   \n\t"], ids=["empty", "whitespace"])
async def test_an_empty_or_blank_message_is_the_same_400_before_the_model_is_called(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, message: str
) -> None:
    user_id, auth = api.new_user()
    r = await api.post("/chat", json={"message": message}, headers=auth)
    body = assert_error(r, 400, "bad_request")
    assert body["detail"] == "message is empty or only whitespace; send some text."
    assert model.calls == 0
    assert snapshot(admin, user_id)["chat_sessions"] == []


@pytest.mark.parametrize(
    ("content_type", "named"),
    [
        ("text/plain", "it was text/plain"),
        ("application/x-www-form-urlencoded", "it was application/x-www-form-urlencoded"),
        (None, "it had none"),
    ],
)
async def test_a_body_that_is_not_sent_as_json_is_415_naming_the_type(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    content_type: str | None,
    named: str,
) -> None:
    user_id, auth = api.new_user()
    headers = dict(auth) if content_type is None else {**auth, "Content-Type": content_type}
    r = await api.post("/chat", content=b'{"message": "hi"}', headers=headers)
    body = assert_error(r, 415, "unsupported_media_type")
    assert body["detail"] == (
        f"The request body must be JSON: send it with Content-Type: application/json ({named})."
    )
    assert model.calls == 0
    assert snapshot(admin, user_id)["chat_sessions"] == []


async def test_other_json_bodies_are_415_too(api: ApiClient) -> None:
    _, auth = api.new_user()
    r = await api.put(
        "/memory", content=b'{"notes": "x"}', headers={**auth, "Content-Type": "text/plain"}
    )
    assert_error(r, 415, "unsupported_media_type")


async def test_json_media_types_with_parameters_or_a_suffix_are_json(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    for content_type in ("application/json; charset=utf-8", "application/vnd.memchat+json"):
        r = await api.post(
            "/chat", content=b'{"message": "hi"}', headers={**auth, "Content-Type": content_type}
        )
        assert r.status_code == 200, r.text
    assert model.calls == 2


async def test_a_missing_body_is_still_422_naming_it(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    r = await api.post("/chat", headers=auth)
    body = assert_error(r, 422, "validation_error")
    assert body["detail"] == "body: is required."


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (b'{"message": "h\xffi"}', "the byte 0xFF at offset 14"),
        (b'{"message": "caf\xe9"}', "the byte 0xE9 at offset 16"),
    ],
)
async def test_a_body_that_is_not_utf8_is_400_saying_so_and_where(
    api: ApiClient, model: FakeOpenAI, content: bytes, where: str
) -> None:
    _, auth = api.new_user()
    r = await api.post(
        "/chat", content=content, headers={**auth, "Content-Type": "application/json"}
    )
    body = assert_error(r, 400, "invalid_json")
    assert body["detail"] == (
        f"The request body is not UTF-8: {where} (counting from 0) is not valid UTF-8;"
        " send the JSON encoded as UTF-8."
    )
    assert model.calls == 0


# ------------------------------------------------------------------ 413


async def test_message_over_max_message_chars_is_413(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    limit = api.settings.max_message_chars
    r = await api.post("/chat", json={"message": "é" * (limit + 1)}, headers=auth)
    body = assert_error(r, 413, "payload_too_large")
    assert str(limit) in body["detail"]
    assert model.calls == 0
    assert snapshot(admin, user_id)["chat_sessions"] == []

    # Exactly the limit (in characters, not bytes) is accepted.
    await chat(api, auth, "é" * limit)


async def test_a_body_over_the_size_limit_is_413(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    r = await api.post("/chat", json={"message": "x" * 1_100_000}, headers=auth)
    assert_error(r, 413, "payload_too_large")
    assert model.calls == 0


# ------------------------------------------------------------------ 422


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "message"),
        ({"session_id": None}, "message"),
        ({"message": 42}, "message"),
        ({"message": "hi", "agent_name": "bad name"}, "agent_name"),
        ({"message": "hi", "agent_name": "x" * 65}, "agent_name"),
        ({"message": "hi", "agent_name": ""}, "agent_name"),
        ({"message": "hi", "agent_name": "../etc"}, "agent_name"),
        ({"message": "hi", "colour": "blue"}, "colour"),
        ({"message": "hi", "use_memory": "maybe"}, "use_memory"),
        ({"message": "hi", "client_message_id": ""}, "client_message_id"),
        ({"message": "hi", "client_message_id": "x" * 129}, "client_message_id"),
        ({"message": "hi", "max_history_messages": "ten"}, "max_history_messages"),
    ],
    ids=[
        "missing-message",
        "only-session",
        "message-not-text",
        "agent-space",
        "agent-too-long",
        "agent-empty",
        "agent-path",
        "extra-field",
        "use-memory-not-bool",
        "client-id-empty",
        "client-id-too-long",
        "window-not-int",
    ],
)
async def test_body_validation_errors_are_422(
    api: ApiClient, model: FakeOpenAI, payload: dict[str, object], field: str
) -> None:
    _, auth = api.new_user()
    r = await api.post("/chat", json=payload, headers=auth)
    body = assert_error(r, 422, "validation_error")
    assert field in body["detail"]
    assert model.calls == 0


async def test_a_json_body_that_is_not_an_object_is_422(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    r = await api.post("/chat", json=["hi"], headers=auth)
    assert_error(r, 422, "validation_error")


# Text PostgreSQL cannot store: NUL, and UTF-16 surrogates that are not a pair
# (JSON's \uXXXX escapes can carry both). Raw JSON, so the escapes are sent as written.
UNSTORABLE = {
    "nul": "a\\u0000b",
    "lone-high-surrogate": "a\\ud800b",
    "lone-low-surrogate": "\\udc00",
    "reversed-pair": "\\ude00\\ud83d",
}
TEXT_FIELDS = [
    ("POST", "/chat", '{{"message": "{text}"}}', "message"),
    ("POST", "/chat", '{{"message": "hi", "client_message_id": "{text}"}}', "client_message_id"),
    ("PUT", "/memory", '{{"notes": "{text}"}}', "notes"),
]


@pytest.mark.parametrize("text", UNSTORABLE.values(), ids=UNSTORABLE.keys())
@pytest.mark.parametrize(
    ("method", "path", "template", "field"), TEXT_FIELDS, ids=[f[3] for f in TEXT_FIELDS]
)
async def test_unstorable_text_is_422_naming_the_field_and_nothing_is_stored(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    method: str,
    path: str,
    template: str,
    field: str,
    text: str,
) -> None:
    user_id, auth = api.new_user()
    before = snapshot(admin, user_id)
    r = await api.request(
        method,
        path,
        content=template.format(text=text).encode(),
        headers={**auth, "Content-Type": "application/json"},
    )
    body = assert_error(r, 422, "validation_error")
    assert body["detail"].startswith(f"{field}: "), body
    assert model.calls == 0
    assert snapshot(admin, user_id) == before


async def test_a_surrogate_pair_is_text_like_any_other(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """The check refuses unpaired surrogates only: an escaped emoji is stored."""
    _, auth = api.new_user()
    headers = {**auth, "Content-Type": "application/json"}
    r = await api.post(
        "/chat",
        content=b'{"message": "hi \\ud83d\\ude00", "client_message_id": "\\ud83d\\ude00"}',
        headers=headers,
    )
    assert r.status_code == 200, r.text
    assert model.requests[-1]["messages"][-1]["content"] == "hi \U0001f600"
    r = await api.put("/memory", content=b'{"notes": "\\ud83d\\ude00"}', headers=headers)
    assert r.status_code == 200 and r.json()["notes"] == "\U0001f600", r.text


async def test_an_unknown_field_named_with_a_lone_surrogate_is_422_not_500(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    r = await api.post(
        "/chat",
        content=b'{"message": "hi", "\\ud800": 1}',
        headers={**auth, "Content-Type": "application/json"},
    )
    body = assert_error(r, 422, "validation_error")
    assert "unpaired surrogates" in body["detail"]
    assert model.calls == 0


@pytest.mark.parametrize("version", [2**31, 2**63, 10**30])
async def test_expected_version_past_the_database_integer_is_422(
    api: ApiClient, version: int
) -> None:
    _, auth = api.new_user()
    r = await api.put("/memory", json={"notes": "x", "expected_version": version}, headers=auth)
    body = assert_error(r, 422, "validation_error")
    assert body["detail"].startswith("expected_version: "), body


async def test_the_largest_expected_version_reaches_the_version_check(api: ApiClient) -> None:
    _, auth = api.new_user()
    r = await api.put("/memory", json={"notes": "x", "expected_version": 2**31 - 1}, headers=auth)
    assert_error(r, 409, "notes_conflict")


# ------------------------------------------------------------------ 404


async def test_unknown_route_and_wrong_method_use_the_error_json(api: ApiClient) -> None:
    _, auth = api.new_user()
    assert_error(await api.get("/nope", headers=auth), 404, "not_found")
    assert_error(await api.get("/chat", headers=auth), 405, "method_not_allowed")


# ------------------------------------------------------- model failures


async def test_model_http_500_is_502_and_stores_nothing(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    model.script({"status": 500})
    r = await api.post("/chat", json={"message": "hello"}, headers=auth)
    body = assert_error(r, 502, "model_upstream_error")
    assert "nothing was stored" in body["detail"]
    assert "x-session-id" not in r.headers
    assert snapshot(admin, user_id) == {
        "chat_sessions": [],
        "user_agent_active_sessions": [],
        "chat_message_history": [],
        "agent_long_term_memory": [],
    }


async def test_model_failure_after_a_tool_round_stores_nothing(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """Notes edited in the failed turn are not saved; the session is not touched."""
    user_id, auth = api.new_user()
    seed_notes(admin, user_id, "- before")
    sid = (await chat(api, auth, "first"))["session_id"]
    before = snapshot(admin, user_id)

    model.script(tool_call("append", content="- during"), {"status": 500})
    r = await api.post("/chat", json={"message": "second", "session_id": sid}, headers=auth)
    assert_error(r, 502, "model_upstream_error")
    assert model.calls == 3
    assert snapshot(admin, user_id) == before

    # A new session id is not created either.
    fresh = uuid.uuid4()
    model.script({"status": 503})
    r = await api.post("/chat", json={"message": "x", "session_id": str(fresh)}, headers=auth)
    assert_error(r, 502, "model_upstream_error")
    assert snapshot(admin, user_id) == before


@pytest.mark.parametrize("status", [400, 401, 429])
async def test_other_provider_errors_are_502(
    api: ApiClient, model: FakeOpenAI, status: int
) -> None:
    _, auth = api.new_user()
    model.script({"status": status})
    r = await api.post("/chat", json={"message": "hello"}, headers=auth)
    assert_error(r, 502, "model_upstream_error")


async def test_unreachable_model_is_502_and_stores_nothing(
    database_url: str, admin: psycopg.Connection
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = ApiClient(make_settings(database_url, f"http://127.0.0.1:{port}/v1"))
    try:
        user_id, auth = api.new_user()
        r = await api.post("/chat", json={"message": "hello"}, headers=auth)
        assert_error(r, 502, "model_upstream_error")
        assert snapshot(admin, user_id)["chat_sessions"] == []
    finally:
        await api.aclose()


async def test_model_slower_than_the_timeout_is_504_and_stores_nothing(
    database_url: str, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    api = ApiClient(make_settings(database_url, model.url, openai_timeout_seconds=0.5))
    try:
        user_id, auth = api.new_user()
        seed_notes(admin, user_id, "- before")
        sid = (await chat(api, auth, "first"))["session_id"]
        before = snapshot(admin, user_id)

        model.script(tool_call("overwrite", content="- during"), {"delay": 1.5})
        r = await api.post("/chat", json={"message": "slow", "session_id": sid}, headers=auth)
        body = assert_error(r, 504, "model_timeout")
        assert "nothing was stored" in body["detail"]
        assert snapshot(admin, user_id) == before
    finally:
        await api.aclose()


# ----------------------------------------------------------- request ids


async def test_the_request_id_is_memchats_own_never_the_clients(
    api: ApiClient, model: FakeOpenAI
) -> None:
    """A client's X-Request-ID is neither the error's request_id nor the
    response's X-Request-ID: memchat's own id is (a client could otherwise
    pose as another request in the logs)."""
    _, auth = api.new_user()
    r = await api.post("/chat", json={}, headers={**auth, "X-Request-ID": "req-42"})
    request_id = assert_error(r, 422, "validation_error")["request_id"]
    assert request_id != "req-42" and re.fullmatch("[0-9a-f]{32}", request_id)
    r = await api.post("/chat", json={"message": "hi"}, headers={**auth, "X-Request-ID": "req-43"})
    assert r.status_code == 200 and r.headers["x-request-id"] not in ("", "req-43")
    r = await api.post("/chat", json={})
    first = assert_error(r, 401, "unauthorized")["request_id"]
    second = assert_error(await api.post("/chat", json={}), 401, "unauthorized")["request_id"]
    assert first != second


async def test_a_turn_past_its_overall_deadline_is_504_and_stores_nothing(
    database_url: str, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """Each model call is within its own timeout, but the tool rounds add up."""
    api = ApiClient(
        make_settings(database_url, model.url, openai_timeout_seconds=5, turn_timeout_seconds=1)
    )
    try:
        user_id, auth = api.new_user()
        before = snapshot(admin, user_id)
        model.script(
            {"delay": 0.4, **tool_call("append", content="- a")},
            {"delay": 0.4, **tool_call("append", content="- b")},
            {"delay": 0.4, **tool_call("append", content="- c")},
            {"delay": 0.4, "content": "done"},
        )
        r = await api.post("/chat", json={"message": "slow rounds"}, headers=auth)
        body = assert_error(r, 504, "model_timeout")
        assert "within 1 s" in body["detail"]
        assert snapshot(admin, user_id) == before
    finally:
        await api.aclose()


async def test_an_unexpected_error_is_a_json_500_and_its_text_is_not_logged(
    api: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    secret_text = "the user's private words"

    async def boom() -> None:
        raise RuntimeError(secret_text)

    api.app.add_api_route("/boom", boom)
    with caplog.at_level("DEBUG"):
        r = await api.get("/boom", headers={"X-Request-ID": "req-boom"})
    body = assert_error(r, 500, "internal_error")
    assert body["request_id"] != "req-boom" and secret_text not in r.text
    records = [rec for rec in caplog.records if rec.getMessage() == "unhandled error"]
    assert records and records[0].error_type == "builtins.RuntimeError"
    assert records[0].request_id == body["request_id"]
    assert any("boom" in frame for frame in records[0].where)
    assert all(secret_text not in rec.getMessage() and not rec.exc_info for rec in caplog.records)


@pytest.mark.parametrize(
    "url",
    [
        "/sessions?limit=5&limit=500",
        "/memory?agent_name=a&agent_name=b",
        "/chat/export/6f0c2a34-0000-4000-8000-000000000000?format=json&format=markdown",
    ],
)
async def test_a_repeated_query_parameter_is_422_not_the_last_one_wins(
    api: ApiClient, url: str
) -> None:
    _, auth = api.new_user()
    body = assert_error(await api.get(url, headers=auth), 422, "validation_error")
    assert "once" in body["detail"]


async def test_an_import_that_is_not_utf8_says_where_too(api: ApiClient) -> None:
    _, auth = api.new_user()
    body = b'{"sessions": [{"messages": [{"role": "user", "content": "\xc3("}]}]}'
    r = await api.post("/sessions/import", content=body, headers=auth)
    detail = assert_error(r, 400, "invalid_json")["detail"]
    at = body.index(b"\xc3")
    assert detail.startswith(f"The request body is not UTF-8: the byte 0xC3 at offset {at} ")


async def test_the_openapi_document_lists_the_415_of_every_json_body(api: ApiClient) -> None:
    doc = (await api.get("/openapi.json")).json()
    with_json_body = sorted(
        (path, method)
        for path, item in doc["paths"].items()
        for method, operation in item.items()
        if "application/json" in operation.get("requestBody", {}).get("content", {})
        and path != "/sessions/import"  # read as bytes by the route: any type
    )
    assert ("/chat", "post") in with_json_body and ("/memory", "put") in with_json_body
    for path, method in with_json_body:
        responses = doc["paths"][path][method]["responses"]
        # In the shape of the operation's other errors.
        assert responses["415"]["content"] == responses["400"]["content"], path
    assert "415" not in doc["paths"]["/sessions/import"]["post"]["responses"]
