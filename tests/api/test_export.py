"""GET /chat/export/{session_id} and GET /export through the HTTP API."""

import asyncio
import json
import re
import uuid
from datetime import datetime, timedelta

import httpx
import pytest

from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.fake_openai import tool_call

UNICODE = "héllo 👋 日本"
FORMATS = ["json", "ndjson", "markdown"]
MEDIA_TYPES = {
    "json": "application/json",
    "ndjson": "application/x-ndjson",
    "markdown": "text/markdown; charset=utf-8",
}

# A session filled in one statement: alternating human/ai messages in the
# LangChain dict shape, as a long-running conversation would have stored them.
FILL = """
insert into public.chat_message_history (session_id, user_id, message)
select %(session_id)s, %(user_id)s, jsonb_build_object(
    'type', t.kind,
    'data', jsonb_build_object('content', 'message ' || g || ' ' || %(text)s, 'type', t.kind,
                               'additional_kwargs', '{}'::jsonb,
                               'response_metadata', '{}'::jsonb, 'name', null, 'id', null))
  from generate_series(1, %(count)s) g
 cross join lateral (select case when g %% 2 = 1 then 'human' else 'ai' end as kind) t
 order by g
"""


def fill_session(admin, user_id, count, text="filler"):
    session_id = uuid.uuid4()
    admin.execute(
        "insert into public.chat_sessions (id, user_id, title, message_count)"
        " values (%s, %s, 'big one', %s)",
        (session_id, user_id, count),
    )
    admin.execute(
        FILL, {"session_id": session_id, "user_id": user_id, "count": count, "text": text}
    )
    return str(session_id)


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Like httpx.ASGITransport, but each body message reaches the client as
    the app sends it (httpx's joins the whole body before returning), with
    back-pressure: the app cannot run more than one message ahead."""

    def __init__(self, app):
        self.app = app
        self.app_done_at_first_chunk = None

    async def handle_async_request(self, request):
        body = b"".join([part async for part in request.stream])
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": ("127.0.0.1", 50000),
            "root_path": "",
        }
        messages = asyncio.Queue(maxsize=1)
        received = False

        async def receive():
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the client never disconnects

        async def run():
            try:
                await self.app(scope, receive, messages.put)
            finally:
                await messages.put(None)

        task = asyncio.create_task(run())
        start = await messages.get()
        assert start and start["type"] == "http.response.start"
        transport = self

        class Body(httpx.AsyncByteStream):
            async def __aiter__(self):
                while (message := await messages.get()) is not None:
                    if transport.app_done_at_first_chunk is None:
                        transport.app_done_at_first_chunk = task.done()
                    if message.get("body"):
                        yield message["body"]
                await task

            async def aclose(self):
                task.cancel()

        return httpx.Response(start["status"], headers=start["headers"], stream=Body())


def assert_error(r, status, code):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error", "detail", "request_id"} and body["error"] == code


def ndjson(r):
    text = r.content.decode()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.split("\n")[:-1]]


async def chat(api, auth, message, **body):
    r = await api.post("/chat", json={"message": message, **body}, headers=auth)
    assert r.status_code == 200, r.text
    return r.json()["session_id"]


async def test_session_export_json(api, model):
    _, auth = api.new_user()
    sid = await chat(api, auth, f"hi {UNICODE}")
    model.script(tool_call("append", content="## Name\nAda"), {"content": "noted"})
    await chat(api, auth, "call me Ada", session_id=sid)

    r = await api.get(f"/chat/export/{sid}", headers=auth)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.headers["content-disposition"] == f'attachment; filename="memchat-session-{sid}.json"'
    assert r.headers["cache-control"] == "no-store"
    body = r.json()
    assert set(body) == {"session", "messages"}
    assert body["session"]["id"] == sid and body["session"]["title"] == f"hi {UNICODE}"
    assert body["session"]["message_count"] == 6
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert [m["content"] for m in msgs] == [
        f"hi {UNICODE}",
        f"echo: hi {UNICODE}",
        "call me Ada",
        "",
        msgs[4]["content"],
        "noted",
    ]
    assert msgs[4]["content"].startswith("ok: notes updated")
    for m in msgs:
        assert {"role", "content", "created_at", "metadata"} <= set(m)
        assert datetime.fromisoformat(m["created_at"]).utcoffset() == timedelta(0)
    assert [m["id"] for m in msgs] == sorted(m["id"] for m in msgs)
    call = msgs[3]["metadata"]["tool_calls"][0]
    assert call["name"] == "manage_long_term_memory" and call["args"]["operation"] == "append"
    assert msgs[4]["metadata"]["tool_call_id"] == call["id"]
    assert msgs[1]["metadata"]["model"] == "fake-model"
    # Unicode travels as UTF-8, not as \\u escapes.
    assert UNICODE.encode() in r.content and b"\\u" not in r.content


async def test_session_export_ndjson_and_markdown(api, model):
    _, auth = api.new_user()
    sid = await chat(api, auth, f"first {UNICODE}")
    model.script(tool_call("append", content="## Pets\na cat"), {"content": "saved it"})
    await chat(api, auth, "I have a cat", session_id=sid)

    r = await api.get(f"/chat/export/{sid}", params={"format": "ndjson"}, headers=auth)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == MEDIA_TYPES["ndjson"]
    assert r.headers["content-disposition"].endswith(f'"memchat-session-{sid}.ndjson"')
    lines = ndjson(r)
    assert lines[0]["type"] == "session" and lines[0]["id"] == sid
    assert [line["type"] for line in lines[1:]] == ["message"] * 6
    assert {line["session_id"] for line in lines[1:]} == {sid}
    assert lines[1]["content"] == f"first {UNICODE}" and lines[1]["role"] == "user"
    assert UNICODE.encode() in r.content

    r = await api.get(f"/chat/export/{sid}", params={"format": "markdown"}, headers=auth)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == MEDIA_TYPES["markdown"]
    assert r.headers["content-disposition"].endswith(f'"memchat-session-{sid}.md"')
    text = r.text
    assert text.startswith(f"# first {UNICODE}\n")
    assert f"`{sid}`" in text
    assert re.search(r"^\*\*user\*\* · \d{4}-\d\d-\d\dT", text, re.M)
    assert f"first {UNICODE}\n" in text and "saved it" in text
    assert "→ `manage_long_term_memory(" in text
    assert "**tool** `manage_long_term_memory`" in text


@pytest.mark.parametrize("fmt", FORMATS)
async def test_cannot_export_unknown_or_another_users_session(api, model, fmt):
    _, alice = api.new_user()
    _, bob = api.new_user()
    alices = await chat(api, alice, "private")
    for sid in (alices, alices.upper(), str(uuid.uuid4())):
        r = await api.get(f"/chat/export/{sid}", params={"format": fmt}, headers=bob)
        assert_error(r, 404, "session_not_found")
    r = await api.get(f"/chat/export/{alices.upper()}", params={"format": fmt}, headers=alice)
    assert r.status_code == 200 and b"private" in r.content


async def test_export_rejects_bad_input(api):
    _, auth = api.new_user()
    r = await api.get("/chat/export/not-a-uuid", headers=auth)
    assert_error(r, 400, "bad_request")
    for path in (f"/chat/export/{uuid.uuid4()}", "/export"):
        for fmt in ("xml", "JSON", ""):
            r = await api.get(path, params={"format": fmt}, headers=auth)
            assert_error(r, 422, "validation_error")
            assert "format" in r.json()["detail"]


@pytest.mark.parametrize("path", [f"/chat/export/{uuid.uuid4()}", "/export"])
async def test_export_needs_a_token(api, path):
    assert_error(await api.get(path), 401, "unauthorized")


async def test_export_of_a_cleared_session_has_no_messages(api, model):
    _, auth = api.new_user()
    sid = await chat(api, auth, "soon forgotten")
    await api.post("/chat/clear-session", json={"session_id": sid}, headers=auth)
    body = (await api.get(f"/chat/export/{sid}", headers=auth)).json()
    assert body["session"]["status"] == "cleared" and body["messages"] == []
    assert b"forgotten" not in (await api.get("/export", headers=auth)).content


async def arrange_account(api, model, admin):
    """Alice: two agents, notes, a cleared session; Bob: his own marked data."""
    alice_id, alice = api.new_user()
    _, bob = api.new_user()
    first = await chat(api, alice, f"alice one {UNICODE}")
    await chat(api, alice, "alice two", session_id=first)
    helper = await chat(api, alice, "alice helper", agent_name="helper")
    await api.put("/memory", json={"notes": f"alice notes {UNICODE}"}, headers=alice)
    await api.put("/memory", json={"notes": "helper notes", "agent_name": "helper"}, headers=alice)
    cleared = await chat(api, alice, "alice cleared", agent_name="gone")
    await api.post("/chat/clear-session", json={"session_id": cleared}, headers=alice)
    await chat(api, bob, "BOB-MARKER message")
    await api.put("/memory", json={"notes": "BOB-MARKER notes"}, headers=bob)
    return alice_id, alice, {"first": first, "helper": helper, "cleared": cleared}


async def test_account_export_json_has_everything_and_nothing_else(api, model, admin):
    alice_id, alice, ids = await arrange_account(api, model, admin)
    r = await api.get("/export", headers=alice)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert re.fullmatch(
        r'attachment; filename="memchat-export-\d{4}-\d\d-\d\d\.json"',
        r.headers["content-disposition"],
    )
    assert b"BOB-MARKER" not in r.content
    assert UNICODE.encode() in r.content
    body = r.json()
    assert set(body) == {
        "user_id",
        "exported_at",
        "sessions",
        "active_sessions",
        "long_term_memory",
        "memories",
    }
    assert body["user_id"] == str(alice_id)
    assert datetime.fromisoformat(body["exported_at"]).utcoffset() == timedelta(0)

    rows = admin.execute(
        "select id::text from public.chat_sessions where user_id = %s order by created_at, id",
        (alice_id,),
    ).fetchall()
    assert [s["id"] for s in body["sessions"]] == [r[0] for r in rows]
    assert len(rows) == 4  # first, helper, cleared and its fresh successor
    by_id = {s["id"]: s for s in body["sessions"]}
    assert [m["content"] for m in by_id[ids["first"]]["messages"]] == [
        f"alice one {UNICODE}",
        f"echo: alice one {UNICODE}",
        "alice two",
        "echo: alice two",
    ]
    assert by_id[ids["helper"]]["agent_name"] == "helper"
    assert by_id[ids["cleared"]]["messages"] == []
    assert by_id[ids["cleared"]]["status"] == "cleared"
    stored = admin.execute(
        "select count(*) from public.chat_message_history where user_id = %s", (alice_id,)
    ).fetchone()[0]
    assert sum(len(s["messages"]) for s in body["sessions"]) == stored == 6

    assert {a["agent_name"] for a in body["active_sessions"]} == {"default", "helper", "gone"}
    assert {a["active_session_id"] for a in body["active_sessions"]} <= set(by_id)
    assert [(n["agent_name"], n["notes"]) for n in body["long_term_memory"]] == [
        ("default", f"alice notes {UNICODE}"),
        ("helper", "helper notes"),
    ]


async def test_account_export_ndjson_and_markdown(api, model, admin):
    alice_id, alice, _ids = await arrange_account(api, model, admin)
    r = await api.get("/export", params={"format": "ndjson"}, headers=alice)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == MEDIA_TYPES["ndjson"]
    assert r.headers["content-disposition"].endswith('.ndjson"')
    assert b"BOB-MARKER" not in r.content
    lines = ndjson(r)
    assert lines[0]["type"] == "export" and lines[0]["user_id"] == str(alice_id)
    types = [line["type"] for line in lines]
    assert types.count("session") == 4 and types.count("message") == 6
    assert types.count("active_session") == 3 and types.count("long_term_memory") == 2
    # Each message follows its session's line.
    current = None
    for line in lines:
        if line["type"] == "session":
            current = line["id"]
        elif line["type"] == "message":
            assert line["session_id"] == current
    assert types[-5:] == ["active_session"] * 3 + ["long_term_memory"] * 2

    r = await api.get("/export", params={"format": "markdown"}, headers=alice)
    assert r.status_code == 200, r.text
    assert r.headers["content-disposition"].endswith('.md"')
    text = r.text
    assert "BOB-MARKER" not in text
    assert f"# alice one {UNICODE}" in text and "# alice helper" in text
    assert "# Long-term notes" in text and f"alice notes {UNICODE}" in text
    assert "## helper" in text and str(alice_id) in text


@pytest.mark.parametrize("fmt", FORMATS)
async def test_account_export_of_an_empty_account(api, fmt):
    user_id, auth = api.new_user()
    r = await api.get("/export", params={"format": fmt}, headers=auth)
    assert r.status_code == 200, r.text
    if fmt == "json":
        body = r.json()
        assert body["user_id"] == str(user_id)
        assert body["sessions"] == body["active_sessions"] == body["long_term_memory"] == []
    elif fmt == "ndjson":
        assert [line["type"] for line in ndjson(r)] == ["export"]
    else:
        assert str(user_id) in r.text


async def test_export_database_down_is_503_not_a_broken_200(database_url, fake_openai):
    settings = make_settings("postgresql://memchat@127.0.0.1:9/none", fake_openai.url)
    async with ApiClient(settings) as client:
        headers = {"Authorization": f"Bearer {client.token_for(uuid.uuid4())}"}
        for path in ("/export", f"/chat/export/{uuid.uuid4()}"):
            r = await client.get(path, params={"format": "ndjson"}, headers=headers)
            assert_error(r, 503, "database_unavailable")


@pytest.mark.slow
async def test_large_session_export_streams_in_chunks(api, admin):
    user_id, auth = api.new_user()
    count = 20_000
    sid = fill_session(admin, user_id, count, text=UNICODE)

    transport = StreamingASGITransport(api.app)
    client = httpx.AsyncClient(transport=transport, base_url="http://memchat.test")

    chunks, data = 0, bytearray()
    async with client.stream("GET", f"/chat/export/{sid}", headers=auth) as r:
        assert r.status_code == 200
        async for chunk in r.aiter_bytes():
            chunks += 1
            data += chunk
    assert chunks > 1 and transport.app_done_at_first_chunk is False
    body = json.loads(data)
    assert len(body["messages"]) == count and body["session"]["message_count"] == count
    assert body["messages"][0]["content"] == f"message 1 {UNICODE}"
    assert body["messages"][-1]["content"] == f"message {count} {UNICODE}"
    assert [m["role"] for m in body["messages"][:2]] == ["user", "assistant"]

    chunks, lines = 0, 0
    async with client.stream(
        "GET", f"/chat/export/{sid}", params={"format": "ndjson"}, headers=auth
    ) as r:
        async for chunk in r.aiter_bytes():
            chunks += 1
            lines += chunk.count(b"\n")
    assert chunks > 1 and lines == count + 1
    await client.aclose()
