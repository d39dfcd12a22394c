"""POST /chat streamed as Server-Sent Events: events, their order, failures,
retries, keep-alives and a client that leaves mid-answer.

Against the real PostgreSQL and the fake OpenAI-compatible server, which
streams its answers in chunks like OpenAI does. Most tests read the whole
body through the in-process transport; those about timing (no buffering, a
client disconnecting) run the app under a real uvicorn.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import psycopg

from memchat.api.schemas.chat import ChatResponse
from tests.utils.api import ApiClient
from tests.utils.chat_api import ERROR_KEYS, assert_error, chat, stored_notes
from tests.utils.fake_openai import FakeOpenAI, search_call, tool_call
from tests.utils.sse import Event, events_of, names, parse, serve
from tests.utils.store_data import contents, message_id_of, session_row, snapshot, stored_messages

STREAM = {"Accept": "text/event-stream"}


async def stream(
    api: httpx.AsyncClient, auth: dict[str, str], message: str, **fields: Any
) -> tuple[httpx.Response, list[Event]]:
    response = await api.post(
        "/chat", json={"message": message, **fields}, headers={**auth, **STREAM}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return response, parse(response.text)


def answer_of(events: list[Event]) -> str:
    return "".join(e.data["text"] for e in events if e.name == "delta")


def assert_turn(events: list[Event]) -> dict[str, Any]:
    """start, then deltas (and notes), then done: returns the done body."""
    kinds = names(events)
    assert kinds[0] == "start" and kinds[-1] == "done", kinds
    assert set(kinds[1:-1]) <= {"delta", "notes", "comment"}, kinds
    start, done = events[0].data, events[-1].data
    assert set(start) == {"session_id", "agent_name", "memory"}
    assert start["session_id"] == done["session_id"]
    assert start["agent_name"] == done["agent_name"]
    ChatResponse.model_validate(done)  # the non-streaming body's schema
    return dict(done)


async def test_accept_header_streams_the_answer_in_pieces_then_the_stored_body(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    model.script({"content": "Tea is brewed with water just off the boil."})
    response, events = await stream(api, auth, "How do I brew tea?")

    done = assert_turn(events)
    deltas = [e for e in events if e.name == "delta"]
    assert len(deltas) >= 5  # word by word, as the model sent it
    assert answer_of(events) == done["answer"] == "Tea is brewed with water just off the boil."
    assert response.headers["x-session-id"] == done["session_id"]
    assert response.headers["cache-control"] == "no-cache"
    assert "content-length" not in response.headers
    assert model.requests[-1]["stream"] is True
    session_id = uuid.UUID(done["session_id"])
    assert contents(admin, session_id) == [
        ("human", "How do I brew tea?"),
        ("ai", "Tea is brewed with water just off the boil."),
    ]
    assert done["session"]["message_count"] == 2


async def test_done_is_exactly_the_non_streaming_body(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    plain = await chat(api, auth, "first")
    _, events = await stream(api, auth, "second", session_id=plain["session_id"])
    done = assert_turn(events)

    def shape(body: Any) -> Any:
        if isinstance(body, dict):
            return {key: shape(value) for key, value in body.items()}
        return type(body).__name__

    assert shape(done) == shape(plain)
    assert done["session_id"] == plain["session_id"]
    assert done["session"]["message_count"] == 4
    assert done["memory"]["messages_in_context"] == 2
    # start describes the memory loaded; done adds what the turn did to it.
    start = events[0].data["memory"]
    assert {k: v for k, v in start.items() if k != "long_term_notes_updated"} == {
        k: v for k, v in done["memory"].items() if k != "long_term_notes_updated"
    }


async def test_body_stream_true_streams_and_accept_q0_does_not(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    response = await api.post("/chat", json={"message": "hi", "stream": True}, headers=auth)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert assert_turn(parse(response.text))["answer"] == "echo: hi"

    response = await api.post(
        "/chat",
        json={"message": "hello"},
        headers={**auth, "Accept": "text/event-stream;q=0, application/json"},
    )
    assert response.headers["content-type"] == "application/json"
    assert response.json()["answer"] == "echo: hello"

    response = await api.post(
        "/chat",
        json={"message": "both"},
        headers={**auth, "Accept": "application/json, text/event-stream"},
    )
    assert response.headers["content-type"].startswith("text/event-stream")


async def test_a_notes_edit_is_an_event_and_the_tool_round_is_not_text(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    model.script(
        tool_call("append", content="- Prefers green tea"), {"content": "Noted, green tea."}
    )
    _, events = await stream(api, auth, "I prefer green tea")

    done = assert_turn(events)
    kinds = [k for k in names(events) if k != "comment"]
    assert kinds[:2] == ["start", "notes"], kinds
    assert events[1].data == {"operation": "append"}
    assert answer_of(events) == done["answer"] == "Noted, green tea."
    assert events[0].data["memory"]["long_term_notes_updated"] is False
    assert done["memory"]["long_term_notes_updated"] is True
    notes = stored_notes(admin, user_id)
    assert notes is not None and "Prefers green tea" in notes[0]


async def test_start_reports_the_memory_loaded(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    first = await chat(api, auth, "My cat is called Miso")
    _, events = await stream(api, auth, "What is my cat called?", session_id=first["session_id"])
    memory = events[0].data["memory"]
    assert memory["enabled"] is True
    assert memory["messages_in_context"] == 2
    assert memory["context_tokens"] > 0

    _, events = await stream(api, auth, "no memory", use_memory=False)
    assert events[0].data["memory"]["enabled"] is False
    assert assert_turn(events)["answer"] == "echo: no memory"


async def test_a_retry_of_a_stored_turn_streams_it_without_the_model(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    model.script({"content": "The stored answer, in several words."})
    first = await chat(api, auth, "question", client_message_id="m-1")
    calls = model.calls

    _, events = await stream(api, auth, "question", client_message_id="m-1")
    assert names(events) == ["start", "delta", "done"]
    assert events[1].data == {"text": "The stored answer, in several words."}
    assert events[2].data["answer"] == first["answer"]
    assert events[2].data["session_id"] == first["session_id"]
    assert model.calls == calls


async def test_failures_known_before_the_stream_keep_their_status(
    api: ApiClient, custom_api: Any, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    calls = model.calls

    async def post(body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        return await api.post("/chat", json=body, headers={**headers, **STREAM})

    assert_error(await post({"message": "hi"}, {}), 401, "unauthorized")
    assert_error(await post({"message": "hi", "stream": "maybe"}, auth), 422, "validation_error")
    assert_error(await post({"message": "   "}, auth), 400, "bad_request")
    response = await post({"message": "hi", "session_id": "not-a-uuid"}, auth)
    assert_error(response, 400, "bad_request")
    too_long = "x" * (api.settings.max_message_chars + 1)
    assert_error(await post({"message": too_long}, auth), 413, "payload_too_large")

    throttled = custom_api(chat_rate_per_minute=1, chat_rate_burst=1)
    await stream(throttled, auth, "one")
    response = await throttled.post("/chat", json={"message": "two"}, headers={**auth, **STREAM})
    assert_error(response, 429, "rate_limited")
    assert "retry-after" in response.headers
    assert model.calls == calls + 1  # only the throttled client's first turn reached the model


async def test_a_model_failure_mid_stream_is_an_error_event_and_stores_nothing(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    before = snapshot(admin, user_id)
    model.script({"content": "one two three four five six", "fail_after": 3})
    _, events = await stream(api, auth, "tell me", client_message_id="c-1")

    assert names(events)[0] == "start" and names(events)[-1] == "error", names(events)
    assert 1 <= len([e for e in events if e.name == "delta"]) <= 3
    error = events[-1].data
    assert set(error) == ERROR_KEYS and error["error"] == "model_upstream_error"
    assert error["request_id"]
    assert session_row(admin, uuid.UUID(events[0].data["session_id"])) is None
    assert snapshot(admin, user_id) == before

    # The failed turn released its client_message_id: a retry answers at once.
    _, events = await stream(api, auth, "tell me", client_message_id="c-1")
    assert assert_turn(events)["answer"] == "echo: tell me"


async def test_the_turn_deadline_mid_stream_is_an_error_event(
    custom_api: Any, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    client = custom_api(turn_timeout_seconds=0.6)
    user_id, auth = client.new_user()
    before = snapshot(admin, user_id)
    model.script({"content": "slow words keep coming here", "chunk_delay": 0.25})
    _, events = await stream(client, auth, "go slowly")

    assert names(events)[0] == "start" and names(events)[-1] == "error", names(events)
    assert "delta" in names(events)
    assert events[-1].data["error"] == "model_timeout"
    assert snapshot(admin, user_id) == before


async def test_keep_alive_comments_while_the_model_is_silent(
    custom_api: Any, model: FakeOpenAI
) -> None:
    client = custom_api(stream_keepalive_seconds=0.1)
    _, auth = client.new_user()
    model.script({"content": "after a pause", "first_token_delay": 0.55})
    _, events = await stream(client, auth, "think first")

    kinds = names(events)
    first_delta = kinds.index("delta")
    assert kinds[1:first_delta].count("comment") >= 3, kinds
    assert all(e.data == "keep-alive" for e in events if e.name == "comment")
    assert assert_turn(events)["answer"] == "after a pause"


async def test_deltas_reach_the_client_while_the_model_is_still_writing(
    api: ApiClient, model: FakeOpenAI
) -> None:
    """Nothing buffers the stream: over a real socket, each delta arrives
    when the model sends it, long before the answer is done."""
    _, auth = api.new_user()
    model.script({"content": "one two three four", "chunk_delay": 0.3})
    async with serve(api.app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
        sent = time.perf_counter()
        async with client.stream(
            "POST", "/chat", json={"message": "count"}, headers={**auth, **STREAM}
        ) as response:
            assert response.status_code == 200
            events = [event async for event in events_of(response)]
    done = assert_turn(events)
    deltas = [e for e in events if e.name == "delta"]
    assert answer_of(events) == done["answer"] == "one two three four"
    # Four words 0.3 s apart: the first is in hand about 0.9 s before the last.
    assert deltas[-1].at - deltas[0].at > 0.6
    assert events[-1].at - deltas[0].at > 0.6
    assert events[0].at - sent < deltas[0].at - sent


async def test_a_client_that_leaves_mid_answer_still_gets_the_turn_stored(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    model.script({"content": "a long answer that keeps going for a while", "chunk_delay": 0.1})
    async with serve(api.app) as url:
        async with (
            httpx.AsyncClient(base_url=url, timeout=10) as client,
            client.stream(
                "POST", "/chat", json={"message": "talk"}, headers={**auth, **STREAM}
            ) as response,
        ):
            seen = []
            async for event in events_of(response):
                seen.append(event)
                if event.name == "delta":
                    break  # hang up after the first piece
        session_id = uuid.UUID(seen[0].data["session_id"])
        assert session_row(admin, session_id) is None  # the answer is not done yet
        deadline = time.perf_counter() + 10
        while session_row(admin, session_id) is None and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
    assert contents(admin, session_id) == [
        ("human", "talk"),
        ("ai", "a long answer that keeps going for a while"),
    ]
    # A reload sees it.
    response = await api.get(f"/chat/export/{session_id}", headers=auth)
    assert response.status_code == 200, response.text
    stored = [(m["role"], m["content"]) for m in response.json()["messages"]]
    assert stored == [("user", "talk"), ("assistant", "a long answer that keeps going for a while")]


async def test_the_openapi_document_names_the_event_stream(api: ApiClient) -> None:
    document = (await api.get("/openapi.json")).json()
    chat_200 = document["paths"]["/chat"]["post"]["responses"]["200"]
    assert set(chat_200["content"]) == {"application/json", "text/event-stream"}
    body = document["components"]["schemas"]["ChatBody"]["properties"]
    assert body["stream"]["default"] is False


async def test_the_response_ends_only_once_the_turn_is_stored(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """Lambda freezes an instance when its response ends: a client gone
    mid-answer (the server's send raising, as ASGI 2.4 servers do) must not
    end the response before the turn is stored."""
    _, auth = api.new_user()
    model.script({"content": "an answer written slowly word by word", "chunk_delay": 0.1})
    body = b'{"message": "hello there"}'
    headers = [(k.lower().encode(), v.encode()) for k, v in {**auth, **STREAM}.items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/chat",
        "raw_path": b"/chat",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"memchat.test"), (b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1234),
        "server": ("memchat.test", 80),
    }
    requested = False
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client sends nothing more
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            if any(b"event: delta" in chunk for chunk in sent):
                raise OSError("the client went away")
            sent.append(message["body"])

    await asyncio.wait_for(api.app(scope, receive, send), timeout=10)
    start = parse(b"".join(sent).decode())[0]
    session_id = uuid.UUID(start.data["session_id"])
    # Stored before the app returned: no waiting here.
    assert contents(admin, session_id) == [
        ("human", "hello there"),
        ("ai", "an answer written slowly word by word"),
    ]


async def test_a_streamed_turn_with_search_memory_reports_the_search_in_done(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    await chat(api, auth, "My sister Lena lives in Porto", session_id=str(uuid.uuid4()))
    model.script(search_call("sister Lena"), {"content": "In Porto."})
    _, events = await stream(
        api, auth, "Where does Lena live?", session_id=str(uuid.uuid4()), search_memory=True
    )
    done = assert_turn(events)
    assert answer_of(events) == done["answer"] == "In Porto."
    assert events[0].data["memory"]["search_memory"] == []  # nothing searched yet at start
    (search,) = done["memory"]["search_memory"]
    assert search["query"] == "sister Lena" and search["status"] == "ok"
    assert search["message_ids"][0] == message_id_of(
        admin, user_id, "My sister Lena lives in Porto"
    )
    stored = stored_messages(admin, uuid.UUID(done["session_id"]))
    assert stored[-1]["data"]["response_metadata"]["memchat"]["search_memory"] == [search]
