"""POST /v1/chat/completions and GET /v1/models over HTTP: the Chat
Completions contract, memchat's memory behind it, what is refused.

Against the real PostgreSQL (rows checked with the superuser connection)
and the fake OpenAI-compatible model server (every prompt it received is
inspected). The official clients are tested in test_openai_clients.py.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest

from memchat.prompts.memory import SYSTEM_PROMPT
from tests.utils.api import ApiClient
from tests.utils.chat_api import conversation, remembered, seed_notes, system_texts
from tests.utils.fake_openai import FakeOpenAI, search_call, tool_call
from tests.utils.openai_api import WEATHER_TOOL, assert_openai_error
from tests.utils.sse import parse, serve
from tests.utils.store_data import contents, message_id_of, snapshot, stored_messages

URL = "/v1/chat/completions"


def user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


async def complete(
    api: ApiClient, auth: dict[str, str], messages: list[dict[str, Any]], **fields: Any
) -> dict[str, Any]:
    """One successful non-streamed completion; returns its body."""
    headers = {**auth, **fields.pop("headers", {})}
    body = {"model": "memchat", "messages": messages, **fields}
    r = await api.post(URL, json=body, headers=headers)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    assert r.headers["x-memchat-session-id"] == answer["memchat"]["session_id"]
    return answer


def chunks_of(text: str) -> list[dict[str, Any]]:
    """The JSON chunks of a streamed completion, which must end with [DONE]."""
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    return [e.data for e in parse(text[: -len("data: [DONE]\n\n")])]


def streamed_tool_calls(chunks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The `delta.tool_calls` of each chunk that has some."""
    return [
        c["choices"][0]["delta"]["tool_calls"]
        for c in chunks
        if c["choices"][0]["delta"].get("tool_calls")
    ]


# ------------------------------------------------------------ the answer


async def test_a_completion_has_openais_shape_and_reports_memory(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    model.script({"content": "Hello, Ada."})
    r = await api.post(URL, json={"model": "memchat", "messages": [user("I am Ada")]}, headers=auth)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "memchat"
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello, Ada.", "refusal": None}
    assert choice["finish_reason"] == "stop" and choice["index"] == 0
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    info = body["memchat"]
    sid = info["session_id"]
    assert r.headers["x-memchat-session-id"] == r.headers["x-session-id"] == sid
    assert r.headers["x-memchat-context-tokens"] == str(info["memory"]["context_tokens"])
    assert r.headers["x-memchat-recalled"] == str(len(info["memory"]["recalled"]))
    assert info["agent_name"] == "default" and info["model"] == "fake-model"
    assert contents(admin, uuid.UUID(sid)) == [("human", "I am Ada"), ("ai", "Hello, Ada.")]
    ids = [
        r[0]
        for r in admin.execute(
            "select id from public.chat_message_history where session_id = %s order by id", (sid,)
        ).fetchall()
    ]
    assert [info["user_message_id"], info["message_id"]] == ids


async def test_a_later_call_is_answered_from_memory_of_an_earlier_one(
    api: ApiClient, model: FakeOpenAI
) -> None:
    """The second call sends only its question: memchat's memory brings the first."""
    _, auth = api.new_user()
    await complete(api, auth, [user("My favourite colour is teal")])
    model.script({"content": "Teal."})
    answer = await complete(api, auth, [user("What is my favourite colour?")])
    assert answer["choices"][0]["message"]["content"] == "Teal."
    assert conversation(model.requests[-1]) == [
        ("user", "My favourite colour is teal"),
        ("assistant", "echo: My favourite colour is teal"),
        ("user", "What is my favourite colour?"),
    ]
    assert answer["memchat"]["memory"]["messages_in_context"] == 2


async def test_resending_the_whole_history_stores_only_the_last_user_message(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """The client's copy of the conversation is neither stored again nor sent:
    the request goes on in the session that stored its last answer, and the
    model sees those exchanges as memchat stored them."""
    _, auth = api.new_user()
    first = await complete(api, auth, [user("I live in Lyon")])
    sid = first["memchat"]["session_id"]
    history = [
        user("I live in Lyon"),
        assistant("echo: I live in Lyon"),
        user("Where do I live?"),
    ]
    second = await complete(api, auth, history)
    assert second["memchat"]["session_id"] == sid
    assert conversation(model.requests[-1]) == [
        ("user", "I live in Lyon"),
        ("assistant", "echo: I live in Lyon"),
        ("user", "Where do I live?"),
    ]
    assert contents(admin, uuid.UUID(sid)) == [
        ("human", "I live in Lyon"),
        ("ai", "echo: I live in Lyon"),
        ("human", "Where do I live?"),
        ("ai", "echo: Where do I live?"),
    ]


async def test_a_history_memchat_never_stored_reaches_neither_the_model_nor_memory(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """An edited or forged history: its exchanges memchat did not store are
    not sent; one whose last answer memchat did not store is a chat memchat
    does not know, so it starts a session of its own."""
    user_id, auth = api.new_user()
    first = await complete(api, auth, [user("I live in Lyon")])
    sid = first["memchat"]["session_id"]
    forged = [
        user("I live in Lyon"),
        assistant("echo: I live in Lyon"),
        user("forged: I live in Oslo"),
        assistant("forged answer"),
        user("Where do I live?"),
    ]
    second = await complete(api, auth, forged)
    assert second["memchat"]["session_id"] != sid
    assert conversation(model.requests[-1]) == [("user", "Where do I live?")]
    assert "forged" not in json.dumps(model.requests[-1])
    stored = [c for _, c in contents(admin, uuid.UUID(second["memchat"]["session_id"]))]
    assert stored == ["Where do I live?", "echo: Where do I live?"]
    # An exchange the client changed in a chat memchat knows is left out.
    edited = [
        user("I live in Lyon"),
        assistant("echo: I live in Lyon (edited)"),
        user("Where do I live?"),
        assistant("echo: Where do I live?"),
        user("And now?"),
    ]
    third = await complete(api, auth, edited)
    assert third["memchat"]["session_id"] == second["memchat"]["session_id"]
    assert conversation(model.requests[-1]) == [
        ("user", "Where do I live?"),
        ("assistant", "echo: Where do I live?"),
        ("user", "And now?"),
    ]
    assert len(snapshot(admin, user_id)["chat_sessions"]) == 2


async def test_system_messages_are_instructions_after_memchats_and_never_stored(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    messages = [
        {"role": "system", "content": "Answer in French."},
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "!"}],
        },
    ]
    answer = await complete(api, auth, messages)
    assert system_texts(model.requests[-1]) == [SYSTEM_PROMPT, "Answer in French.\n\nBe brief."]
    assert model.requests[-1]["messages"][-1] == user("Hi !")
    sid = uuid.UUID(answer["memchat"]["session_id"])
    assert contents(admin, sid) == [("human", "Hi !"), ("ai", "echo: Hi !")]


async def test_the_session_comes_from_the_header_or_metadata(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    sid = str(uuid.uuid4())
    by_header = await complete(api, auth, [user("one")], headers={"X-Session-ID": sid})
    assert by_header["memchat"]["session_id"] == sid
    by_metadata = await complete(api, auth, [user("two")], metadata={"session_id": sid.upper()})
    assert by_metadata["memchat"]["session_id"] == sid
    assert by_metadata["memchat"]["memory"]["messages_in_context"] == 2
    other = str(uuid.uuid4())
    r = await api.post(
        URL,
        json={"model": "memchat", "messages": [user("x")], "metadata": {"session_id": other}},
        headers={**auth, "X-Session-ID": sid},
    )
    assert (
        "X-Session-ID and metadata.session_id"
        in assert_openai_error(r, 400, "bad_request")["message"]
    )


async def test_the_model_names_the_agent_and_v1_models_lists_the_callers(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    r = await api.get("/v1/models", headers=auth)
    assert r.status_code == 200, r.text
    assert [m["id"] for m in r.json()["data"]] == ["memchat"]
    answer = await complete(api, auth, [user("hi")], model="memchat:support")
    assert answer["memchat"]["agent_name"] == "support" and answer["model"] == "memchat:support"
    r = await api.get("/v1/models", headers=auth)
    body = r.json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in body["data"]] == [
        ("memchat", "model", "memchat"),
        ("memchat:support", "model", "memchat"),
    ]
    # Another user's agents are not listed (RLS).
    _, other = api.new_user()
    r = await api.get("/v1/models", headers=other)
    assert [m["id"] for m in r.json()["data"]] == ["memchat"]


async def test_a_client_message_id_makes_a_retry_a_replay(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    options = {"memchat": {"client_message_id": "retry-1"}}
    first = await complete(api, auth, [user("once")], **options)
    again = await complete(api, auth, [user("once")], **options)
    assert model.calls == 1
    assert again["memchat"]["replayed"] is True
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    assert len(contents(admin, uuid.UUID(first["memchat"]["session_id"]))) == 2


def weather_call(call_id: str, city: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }


def key(client_message_id: str) -> dict[str, Any]:
    return {"memchat": {"client_message_id": client_message_id}}


async def ask_weather(
    api: ApiClient, model: FakeOpenAI, auth: dict[str, str], call: dict[str, Any], ask: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ask for the weather with the client's tool and the key `ask`; the model
    answers with `call`. The question, and the completion (the call)."""
    model.script({"tool_calls": [call]})
    city = json.loads(call["function"]["arguments"])["city"]
    question = user(f"Weather in {city}?")
    first = await complete(api, auth, [question], tools=[WEATHER_TOOL], **key(ask))
    assert first["choices"][0]["message"]["tool_calls"] == [call]
    return question, first


async def test_a_retried_client_tool_call_and_its_continuation_are_replayed(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """With client_message_ids, a retry of a turn that ended with a call of the
    client's tools gets the same call back, and a retried continuation the
    same answer, without the model and without storing anything again."""
    _, auth = api.new_user()
    call = weather_call("call_k1", "Lyon")
    question, first = await ask_weather(api, model, auth, call, "ask-1")
    sid = uuid.UUID(first["memchat"]["session_id"])
    stored_before = stored_messages(admin, sid)

    again = await complete(api, auth, [question], tools=[WEATHER_TOOL], **key("ask-1"))
    assert model.calls == 1
    (choice,) = again["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [call] and choice["message"]["content"] is None
    assert again["memchat"]["replayed"] is True
    for field in ("session_id", "message_id", "user_message_id"):
        assert again["memchat"][field] == first["memchat"][field], field
    assert stored_messages(admin, sid) == stored_before

    model.script({"content": "Sunny in Lyon."})
    result = {"role": "tool", "tool_call_id": "call_k1", "content": "sunny, 21C"}
    continued = [question, choice["message"], result]
    answer = await complete(api, auth, continued, tools=[WEATHER_TOOL], **key("result-1"))
    assert answer["choices"][0]["message"]["content"] == "Sunny in Lyon."
    assert model.calls == 2
    stored_after = stored_messages(admin, sid)
    assert [m["type"] for m in stored_after] == ["human", "ai", "tool", "ai"]

    replayed = await complete(api, auth, continued, tools=[WEATHER_TOOL], **key("result-1"))
    assert model.calls == 2
    assert replayed["choices"][0]["message"]["content"] == "Sunny in Lyon."
    assert replayed["choices"][0]["finish_reason"] == "stop"
    assert replayed["memchat"]["replayed"] is True
    assert replayed["memchat"]["message_id"] == answer["memchat"]["message_id"]
    assert replayed["memchat"]["user_message_id"] is None  # a continuation's, as the first
    # The first request, retried after its continuation: still its own call.
    late = await complete(api, auth, [question], tools=[WEATHER_TOOL], **key("ask-1"))
    assert late["choices"][0]["message"]["tool_calls"] == [call]
    assert late["choices"][0]["finish_reason"] == "tool_calls"
    assert model.calls == 2
    assert stored_messages(admin, sid) == stored_after


async def test_a_replayed_client_tool_call_skips_memchats_own_rounds(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """The turn's end is the call of the client's tools, not a round of
    memchat's own (here the notes tool) before it; streamed, the replay is
    the call's chunk and finish_reason tool_calls."""
    user_id, auth = api.new_user()
    call = weather_call("call_k2", "Oslo")
    model.script(tool_call("append", content="- lives in Oslo"), {"tool_calls": [call]})
    question = user("I live in Oslo; will it rain?")
    first = await complete(api, auth, [question], tools=[WEATHER_TOOL], **key("ask-2"))
    assert first["choices"][0]["message"]["tool_calls"] == [call]
    assert model.calls == 2
    body = {
        "model": "memchat",
        "messages": [question],
        "tools": [WEATHER_TOOL],
        "stream": True,
        **key("ask-2"),
    }
    chunks = chunks_of((await api.post(URL, json=body, headers=auth)).text)
    calls = streamed_tool_calls(chunks)
    assert calls == [[{"index": 0, **call}]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["memchat"]["replayed"] is True
    assert model.calls == 2
    (notes,) = snapshot(admin, user_id)["agent_long_term_memory"]
    assert notes["notes"].strip() == "- lives in Oslo"  # edited once


async def test_a_client_message_id_of_a_tool_turn_used_again_for_another_request_is_409(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    call = weather_call("call_k3", "Rome")
    question, first = await ask_weather(api, model, auth, call, "ask-3")
    sid = uuid.UUID(first["memchat"]["session_id"])
    message = first["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": "call_k3", "content": "rain"}
    model.script({"content": "Rain in Rome."})
    await complete(api, auth, [question, message, result], tools=[WEATHER_TOOL], **key("res-3"))
    stored = stored_messages(admin, sid)
    calls = model.calls
    for messages, client_message_id in [
        ([user("Weather in Paris?")], "ask-3"),  # another question
        ([question, message, result], "ask-3"),  # the question's key on its results
        ([question, message, {**result, "content": "snow"}], "res-3"),  # other results
    ]:
        r = await api.post(
            URL,
            json={
                "model": "memchat",
                "messages": messages,
                "tools": [WEATHER_TOOL],
                **key(client_message_id),
            },
            headers=auth,
        )
        assert_openai_error(r, 409, "idempotency_conflict")
    assert model.calls == calls
    assert stored_messages(admin, sid) == stored


# ------------------------------------------------------------- refused


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("response_format", {"type": "json_object"}),
        ("logprobs", True),
        ("logit_bias", {"50256": -100}),
        ("tool_choice", "required"),
        ("tool_choice", {"type": "function", "function": {"name": "get_weather"}}),
        ("parallel_tool_calls", False),
        ("functions", [{"name": "f"}]),
        ("modalities", ["text", "audio"]),
    ],
)
async def test_a_field_that_would_change_the_answer_is_refused_naming_it(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, field: str, value: Any
) -> None:
    user_id, auth = api.new_user()
    body = {"model": "memchat", "messages": [user("hi")], field: value}
    error = assert_openai_error(await api.post(URL, json=body, headers=auth), 400, "bad_request")
    assert error["param"] == field and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{field}: ")
    assert model.calls == 0
    assert snapshot(admin, user_id)["chat_sessions"] == []


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"messages": [user("hi")]}, 422, "validation_error", "model"),
        ({"model": "gpt-4o", "messages": [user("hi")]}, 404, "model_not_found", "model"),
        ({"model": "memchat:no spaces", "messages": [user("hi")]}, 404, "model_not_found", "model"),
        ({"model": "memchat", "messages": []}, 422, "validation_error", "messages"),
        ({"model": "memchat", "messages": [assistant("hi")]}, 400, "bad_request", "messages"),
        (
            {"model": "memchat", "messages": [user("hi"), assistant("a reply")]},
            400,
            "bad_request",
            "messages[1]",
        ),
        ({"model": "memchat", "messages": [{"role": "robot"}]}, 422, "validation_error", None),
        (
            {
                "model": "memchat",
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ],
            },
            400,
            "bad_request",
            "messages[0].content[0]",
        ),
        ({"model": "memchat", "messages": [user("a\u0000b")]}, 422, "validation_error", None),
        ({"model": "memchat", "messages": [user("   ")]}, 400, "bad_request", None),
        (
            {"model": "memchat", "messages": [user("hi")], "temperature2": 1},
            422,
            "validation_error",
            "temperature2",
        ),
        (
            {"model": "memchat", "messages": [user("hi")], "metadata": {"session_id": "nope"}},
            400,
            "bad_request",
            "metadata.session_id",
        ),
        (
            {"model": "memchat", "messages": [user("hi")], "tools": [{"type": "web_search"}]},
            400,
            "bad_request",
            "tools[0].type",
        ),
        (
            {
                "model": "memchat",
                "messages": [user("hi")],
                "tools": [{"type": "function", "function": {"name": "manage_long_term_memory"}}],
            },
            400,
            "bad_request",
            "tools[0].function.name",
        ),
        (
            {"model": "memchat", "messages": [user("hi")], "memchat": {"recall": 3}},
            422,
            "validation_error",
            "memchat.recall",
        ),
        (
            {"model": "memchat", "messages": [user("hi")], "memchat": {"search_memory": "yes"}},
            422,
            "validation_error",
            "memchat.search_memory",
        ),
    ],
)
async def test_a_bad_request_is_a_clear_4xx_in_openais_shape_and_stores_nothing(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    body: dict[str, Any],
    status: int,
    code: str,
    param: str | None,
) -> None:
    user_id, auth = api.new_user()
    error = assert_openai_error(await api.post(URL, json=body, headers=auth), status, code)
    if param is not None:
        assert error["param"] == param, error
    assert model.calls == 0
    assert snapshot(admin, user_id)["chat_sessions"] == []


async def test_the_sampling_fields_reach_the_model(custom_api: Any, model: FakeOpenAI) -> None:
    """Chat front ends send max_tokens (or max_completion_tokens) and sampling
    hints on every call: they are sent to the model, max_tokens capped at
    OPENAI_MAX_TOKENS, with every call of the turn (a tool round too)."""
    api = custom_api(openai_max_tokens=500)
    _, auth = api.new_user()
    fields = {
        "max_tokens": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["\n\n", "END"],
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "user": "u-1",
        "n": 1,
    }
    model.script(tool_call("append", content="- likes tea"), {"content": "Noted."})
    answer = await complete(api, auth, [user("hi")], **fields)
    assert answer["choices"][0]["message"]["content"] == "Noted."
    for sent in model.requests[-2:]:
        assert {k: sent.get(k) for k in SAMPLED} == {
            "max_tokens": 100,
            "temperature": 0.2,
            "top_p": 0.9,
            "stop": ["\n\n", "END"],
            "seed": 7,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
        }
        assert "user" not in sent and "n" not in sent
    # Over the server's cap: capped, not refused; the smaller of the two names.
    await complete(api, auth, [user("again")], max_tokens=100_000)
    assert model.requests[-1]["max_tokens"] == 500
    await complete(api, auth, [user("again")], max_tokens=300, max_completion_tokens=200)
    assert model.requests[-1]["max_tokens"] == 200
    # None given: the server's cap, and nothing else.
    await complete(api, auth, [user("plain")], stop=None, temperature=None)
    assert {k: model.requests[-1].get(k) for k in SAMPLED} == {
        "max_tokens": 500,
        **dict.fromkeys(sorted(set(SAMPLED) - {"max_tokens"})),
    }


SAMPLED = (
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", "10"),
        ("max_completion_tokens", True),
        ("temperature", 2.5),
        ("temperature", "hot"),
        ("top_p", -0.1),
        ("presence_penalty", 3),
        ("frequency_penalty", -2.1),
        ("seed", 1.5),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", [""]),
        ("stop", 7),
    ],
)
async def test_a_sampling_field_out_of_its_range_is_422_naming_it(
    api: ApiClient, model: FakeOpenAI, field: str, value: Any
) -> None:
    _, auth = api.new_user()
    body = {"model": "memchat", "messages": [user("hi")], field: value}
    error = assert_openai_error(
        await api.post(URL, json=body, headers=auth), 422, "validation_error"
    )
    assert error["param"] == field and error["message"].startswith(f"{field}: ")
    assert model.calls == 0


async def test_errors_keep_memchats_status_code_and_headers(
    api: ApiClient, custom_api: Any, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    body = {"model": "memchat", "messages": [user("hi")]}
    error = assert_openai_error(await api.post(URL, json=body), 401, "unauthorized")
    assert error["type"] == "authentication_error"
    r = await api.post(URL, json=body, headers={"Authorization": "Bearer garbage"})
    assert_openai_error(r, 401, "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"
    r = await api.get("/v1/models")
    assert_openai_error(r, 401, "unauthorized")

    user_id, auth = api.new_user()
    r = await api.post(
        URL, content=b"{not json", headers={**auth, "Content-Type": "application/json"}
    )
    assert_openai_error(r, 400, "invalid_json")

    model.script({"status": 500})
    error = assert_openai_error(
        await api.post(URL, json=body, headers=auth), 502, "model_upstream_error"
    )
    assert error["type"] == "server_error"
    assert snapshot(admin, user_id)["chat_sessions"] == []

    throttled = custom_api(chat_rate_per_minute=1, chat_rate_burst=1)
    _, auth = throttled.new_user()
    await complete(throttled, auth, [user("the one allowed")])
    r = await throttled.post(URL, json=body, headers=auth)
    error = assert_openai_error(r, 429, "rate_limited")
    assert error["type"] == "rate_limit_error" and int(r.headers["retry-after"]) >= 1


# ------------------------------------------------------------ streaming


async def test_a_streamed_completion_is_chunks_then_done(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    model.script({"content": "one two three"})
    body = {"model": "memchat", "messages": [user("count")], "stream": True}
    r = await api.post(URL, json=body, headers=auth)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = chunks_of(r.text)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "one two three"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [
        "stop"
    ]
    assert all("usage" not in c for c in chunks)  # not asked for
    sid = chunks[0]["memchat"]["session_id"]
    assert r.headers["x-memchat-session-id"] == sid == chunks[-1]["memchat"]["session_id"]
    assert contents(admin, uuid.UUID(sid)) == [("human", "count"), ("ai", "one two three")]


async def test_include_usage_adds_a_usage_chunk(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    body = {
        "model": "memchat",
        "messages": [user("hi")],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = chunks_of((await api.post(URL, json=body, headers=auth)).text)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


async def test_a_stream_that_fails_ends_with_an_error_chunk_and_stores_nothing(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    model.script({"content": "a b c d", "fail_after": 2})
    body = {"model": "memchat", "messages": [user("hi")], "stream": True}
    r = await api.post(URL, json=body, headers=auth)
    assert r.status_code == 200
    events = parse(r.text)
    assert "[DONE]" not in r.text
    error = events[-1].data
    assert (
        set(error) == {"error", "request_id"} and error["error"]["code"] == "model_upstream_error"
    )
    assert snapshot(admin, user_id)["chat_sessions"] == []


# --------------------------------------------------------------- tools


async def test_a_client_tool_call_ends_the_answer_and_its_result_continues_the_turn(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    call = {
        "id": "call_w1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'},
    }
    model.script({"tool_calls": [call]})
    question = user("Weather in Lyon?")
    first = await complete(api, auth, [question], tools=[WEATHER_TOOL])
    (choice,) = first["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [call] and choice["message"]["content"] is None
    sent = model.requests[-1]["tools"]
    assert [t["function"]["name"] for t in sent] == ["manage_long_term_memory", "get_weather"]
    sid = uuid.UUID(first["memchat"]["session_id"])

    model.script({"content": "Sunny in Lyon."})
    result = {"role": "tool", "tool_call_id": "call_w1", "content": "sunny, 21C"}
    second = await complete(api, auth, [question, choice["message"], result], tools=[WEATHER_TOOL])
    assert second["choices"][0]["message"]["content"] == "Sunny in Lyon."
    assert second["memchat"]["session_id"] == str(sid)
    assert second["memchat"]["user_message_id"] is None  # stored by the first request
    prompt = model.requests[-1]["messages"]
    assert prompt[-3:] == [
        question,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_w1", "content": "sunny, 21C"},
    ]
    stored = stored_messages(admin, sid)
    assert [m["type"] for m in stored] == ["human", "ai", "tool", "ai"]
    assert stored[1]["data"]["tool_calls"][0]["name"] == "get_weather"
    assert stored[2]["data"]["tool_call_id"] == "call_w1"
    assert stored[2]["data"]["name"] == "get_weather"
    assert stored[3]["data"]["content"] == "Sunny in Lyon."

    # A later question sees the whole exchange once.
    await complete(api, auth, [user("and tomorrow?")])
    assert conversation(model.requests[-1]) == [
        ("user", "Weather in Lyon?"),
        ("assistant", "Sunny in Lyon."),
        ("user", "and tomorrow?"),
    ]


async def test_memchats_own_tool_calls_never_reach_the_client(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    model.script(tool_call("append", content="- likes tea"), {"content": "Noted."})
    answer = await complete(api, auth, [user("I like tea")], tools=[WEATHER_TOOL])
    (choice,) = answer["choices"]
    assert choice == {
        "index": 0,
        "message": {"role": "assistant", "content": "Noted.", "refusal": None},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert answer["memchat"]["memory"]["long_term_notes_updated"] is True
    (notes,) = snapshot(admin, user_id)["agent_long_term_memory"]
    assert notes["notes"].strip() == "- likes tea"


async def test_a_streamed_client_tool_call_ends_with_tool_calls(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    call = {
        "id": "call_s1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    model.script({"tool_calls": [call]})
    body = {
        "model": "memchat",
        "messages": [user("Weather in Paris?")],
        "stream": True,
        "tools": [WEATHER_TOOL],
    }
    chunks = chunks_of((await api.post(URL, json=body, headers=auth)).text)
    calls = streamed_tool_calls(chunks)
    assert calls == [[{"index": 0, **call}]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_tool_results_must_answer_the_calls_after_the_last_user_message(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    cases = [
        [user("q"), {"role": "assistant", "content": None, "tool_calls": [call]}],
        [user("q"), {"role": "tool", "tool_call_id": "c1", "content": "x"}],
        [
            user("q"),
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "other", "content": "x"},
        ],
    ]
    for messages in cases:
        r = await api.post(URL, json={"model": "memchat", "messages": messages}, headers=auth)
        assert_openai_error(r, 400, "bad_request")
    assert model.calls == 0


# ------------------------------------------------------- search_memory


async def test_search_memory_is_opt_in_and_each_call_is_logged_in_the_turn(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    # An earlier conversation, in another session.
    await complete(
        api, auth, [user("My dentist is Dr. Moreau")], metadata={"session_id": str(uuid.uuid4())}
    )
    await complete(api, auth, [user("hello")], metadata={"session_id": str(uuid.uuid4())})
    names = [t["function"]["name"] for t in model.requests[-1]["tools"]]
    assert names == ["manage_long_term_memory"]  # not offered unless asked for

    model.script(search_call("dentist"), {"content": "Dr. Moreau."})
    answer = await complete(
        api, auth, [user("Who is my dentist?")], memchat={"search_memory": True}
    )
    first, second = model.requests[-2:]
    assert [t["function"]["name"] for t in first["tools"]] == [
        "manage_long_term_memory",
        "search_memory",
    ]
    tool_result = second["messages"][-1]
    assert tool_result["role"] == "tool" and tool_result["tool_call_id"] == "call_search"
    found = json.loads(tool_result["content"])
    assert found[0]["user"] == "My dentist is Dr. Moreau"
    (search,) = answer["memchat"]["search_memory"]
    assert answer["memchat"]["memory"]["search_memory"] == [search]
    assert search["query"] == "dentist" and search["status"] == "ok"
    assert search["message_ids"][0] == message_id_of(admin, user_id, "My dentist is Dr. Moreau")
    stored = stored_messages(admin, uuid.UUID(answer["memchat"]["session_id"]))
    assert stored[-1]["data"]["response_metadata"]["memchat"]["search_memory"] == [search]


async def test_the_setting_offers_search_memory_unless_a_request_declines(
    custom_api: Any, model: FakeOpenAI
) -> None:
    api = custom_api(search_memory_tool=True)
    _, auth = api.new_user()
    await complete(api, auth, [user("hi")])
    assert "search_memory" in json.dumps(model.requests[-1]["tools"])
    await complete(api, auth, [user("hi")], memchat={"search_memory": False})
    assert "search_memory" not in json.dumps(model.requests[-1]["tools"])


async def test_the_memory_block_is_memchats_own(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    """Notes reach the prompt as POST /chat sends them."""
    user_id, auth = api.new_user()
    seed_notes(admin, user_id, "- name: Ada")
    await complete(api, auth, [user("who am I?")])
    assert remembered(model.requests[-1]).notes == "- name: Ada"


async def test_with_memory_off_the_client_parts_still_reach_the_model_and_nothing_is_stored(
    custom_api: Any, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    api = custom_api(memory_enabled=False)
    user_id, auth = api.new_user()
    call = {
        "id": "call_off",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{}"},
    }
    model.script({"tool_calls": [call]})
    messages = [{"role": "system", "content": "Be brief."}, user("Weather?")]
    answer = await complete(api, auth, messages, tools=[WEATHER_TOOL])
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    assert answer["choices"][0]["message"]["tool_calls"] == [call]
    sent = model.requests[-1]
    assert system_texts(sent) == [SYSTEM_PROMPT, "Be brief."]
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather"]
    assert answer["memchat"]["memory"]["enabled"] is False
    assert snapshot(admin, user_id)["chat_sessions"] == []


async def test_chunks_reach_the_client_while_the_model_is_still_writing(
    api: ApiClient, model: FakeOpenAI
) -> None:
    """Over a real socket, each chunk arrives when the model sends its piece."""
    _, auth = api.new_user()
    model.script({"content": "one two three four", "chunk_delay": 0.3})
    body = {"model": "memchat", "messages": [user("count")], "stream": True}
    arrived: list[tuple[float, str]] = []
    async with (
        serve(api.app) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as client,
        client.stream("POST", URL, json=body, headers=auth) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                arrived.append((time.perf_counter(), line.removeprefix("data: ")))
    assert arrived[-1][1] == "[DONE]"
    pieces = [
        (at, json.loads(data)["choices"][0]["delta"].get("content"))
        for at, data in arrived[:-1]
        if json.loads(data)["choices"]
    ]
    words = [(at, text) for at, text in pieces if text]
    assert "".join(text for _, text in words) == "one two three four"
    # Four words 0.3 s apart: the first is in hand about 0.9 s before the last.
    assert words[-1][0] - words[0][0] > 0.6


async def test_recall_from_another_session_is_reported_in_headers_and_memchat(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    await complete(
        api,
        auth,
        [user("My sister Lena lives in Porto")],
        metadata={"session_id": str(uuid.uuid4())},
    )
    r = await api.post(
        URL,
        json={
            "model": "memchat",
            "messages": [user("Where does my sister Lena live?")],
            "metadata": {"session_id": str(uuid.uuid4())},
        },
        headers=auth,
    )
    assert r.status_code == 200, r.text
    memory = r.json()["memchat"]["memory"]
    assert memory["messages_in_context"] == 0  # a new session: nothing in its window
    assert [hit["message_id"] for hit in memory["recalled"]] != []
    assert r.headers["x-memchat-recalled"] == str(len(memory["recalled"]))
    assert int(r.headers["x-memchat-context-tokens"]) == memory["context_tokens"] > 0
    assert [e.question for e in remembered(model.requests[-1]).recalled] == [
        "My sister Lena lives in Porto"
    ]
