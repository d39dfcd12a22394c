"""The official `openai` SDK and LangChain's ChatOpenAI against `memchat dev`.

Each client is pointed at memchat (`base_url` .../v1, the user's JWT as the
API key) and used as its documentation shows; the model behind memchat is
the fake OpenAI server (`dev_model`), so what reached the model is known.
Memory across calls is the point: every client asks in one call what only
an earlier call told, sending no history of its own, and the later prompt
is shown to carry the earlier exchange.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import openai
import pytest

from tests.utils.chat_api import conversation
from tests.utils.dev_server import DevServer
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.openai_api import WEATHER_TOOL


def weather_call(call_id: str, city: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }


def client_for(dev: DevServer, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{dev.url}/v1", api_key=dev.token(), max_retries=0, **options)


def saw_earlier_turn(request: dict[str, Any], question: str, answer: str) -> bool:
    """Whether a model request carried an earlier exchange (memchat's memory)."""
    turns = conversation(request)
    return ("user", question) in turns and ("assistant", answer) in turns


# ---------------------------------------------------------- openai (Python)


def test_sdk_sync_remembers_across_calls(dev: DevServer, dev_model: FakeOpenAI) -> None:
    client = client_for(dev)
    dev_model.script({"content": "Nice to meet you, Ada."})
    first = client.chat.completions.create(
        model="memchat", messages=[{"role": "user", "content": "My name is Ada."}]
    )
    assert first.choices[0].message.content == "Nice to meet you, Ada."
    assert first.choices[0].finish_reason == "stop"
    assert first.usage is not None and first.usage.total_tokens == 18
    session_id = (first.model_extra or {})["memchat"]["session_id"]

    dev_model.script({"content": "You are Ada."})
    raw = client.chat.completions.with_raw_response.create(
        model="memchat", messages=[{"role": "user", "content": "What is my name?"}]
    )
    second = raw.parse()
    assert second.choices[0].message.content == "You are Ada."
    assert raw.headers["x-memchat-session-id"] == session_id
    assert int(raw.headers["x-memchat-context-tokens"]) > 0
    assert saw_earlier_turn(dev_model.requests[-1], "My name is Ada.", "Nice to meet you, Ada.")
    # Never the messages or answers in the server's logs.
    assert "My name is" not in dev.output() and "Nice to meet you" not in dev.output()


async def test_sdk_async_remembers_across_calls(dev: DevServer, dev_model: FakeOpenAI) -> None:
    client = openai.AsyncOpenAI(base_url=f"{dev.url}/v1", api_key=dev.token(), max_retries=0)
    try:
        await client.chat.completions.create(
            model="memchat", messages=[{"role": "user", "content": "I live in Lyon."}]
        )
        dev_model.script({"content": "In Lyon."})
        answer = await client.chat.completions.create(
            model="memchat", messages=[{"role": "user", "content": "Where do I live?"}]
        )
    finally:
        await client.close()
    assert answer.choices[0].message.content == "In Lyon."
    assert saw_earlier_turn(dev_model.requests[-1], "I live in Lyon.", "echo: I live in Lyon.")


def test_sdk_streaming_with_usage(dev: DevServer, dev_model: FakeOpenAI) -> None:
    client = client_for(dev)
    client.chat.completions.create(
        model="memchat", messages=[{"role": "user", "content": "My cat is Miso."}]
    )
    dev_model.script({"content": "Your cat is Miso."})
    stream = client.chat.completions.create(
        model="memchat",
        messages=[{"role": "user", "content": "What is my cat called?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == "Your cat is Miso."
    assert finish == "stop"
    assert usage is not None and usage.prompt_tokens == 11 and usage.completion_tokens == 7
    assert saw_earlier_turn(dev_model.requests[-1], "My cat is Miso.", "echo: My cat is Miso.")


def test_sdk_tool_calls_round_trip(dev: DevServer, dev_model: FakeOpenAI) -> None:
    client = client_for(dev)
    dev_model.script({"tool_calls": [weather_call("call_1", "Oslo")]})
    messages: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    first = client.chat.completions.create(model="memchat", messages=messages, tools=[WEATHER_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.id == "call_1" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}

    dev_model.script({"content": "Snow in Oslo."})
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "snow, -3C"},
    ]
    second = client.chat.completions.create(
        model="memchat", messages=messages, tools=[WEATHER_TOOL]
    )
    assert second.choices[0].message.content == "Snow in Oslo."
    assert dev_model.requests[-1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "snow, -3C",
    }

    # The exchange is memory now: a new conversation's question sees it.
    client.chat.completions.create(
        model="memchat", messages=[{"role": "user", "content": "What was the weather?"}]
    )
    assert saw_earlier_turn(dev_model.requests[-1], "Weather in Oslo?", "Snow in Oslo.")


def test_sdk_errors_map_to_its_exceptions(dev: DevServer, dev_model: FakeOpenAI) -> None:
    hello = [{"role": "user", "content": "hi"}]
    bad_key = openai.OpenAI(base_url=f"{dev.url}/v1", api_key="not-a-jwt", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as denied:
        bad_key.chat.completions.create(model="memchat", messages=hello)
    assert denied.value.status_code == 401 and denied.value.code == "unauthorized"

    client = client_for(dev)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="memchat", messages=hello, n=2)
    assert refused.value.param == "n" and refused.value.code == "bad_request"
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-4o", messages=hello)
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="memchat", messages=[])
    dev_model.script({"status": 500})
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="memchat", messages=hello)
    assert failed.value.status_code == 502 and failed.value.code == "model_upstream_error"

    models = client.models.list()
    assert "memchat" in [m.id for m in models.data]


# ------------------------------------------------------ LangChain ChatOpenAI


def test_langchain_chat_openai_remembers_streams_and_calls_tools(
    dev: DevServer, dev_model: FakeOpenAI
) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="memchat", base_url=f"{dev.url}/v1", api_key=dev.token(), max_retries=0)
    dev_model.script({"content": "Got it: you prefer tea."})
    assert llm.invoke("I prefer tea to coffee.").content == "Got it: you prefer tea."

    dev_model.script({"content": "Tea."})
    pieces = [chunk.content for chunk in llm.stream("Tea or coffee for me?")]
    assert "".join(str(p) for p in pieces) == "Tea."
    assert saw_earlier_turn(
        dev_model.requests[-1], "I prefer tea to coffee.", "Got it: you prefer tea."
    )

    with_tools = llm.bind_tools([WEATHER_TOOL])
    dev_model.script({"tool_calls": [weather_call("call_lc", "Rome")]})
    question = HumanMessage("Weather in Rome?")
    called = with_tools.invoke([question])
    assert [(c["name"], c["args"], c["id"]) for c in called.tool_calls] == [
        ("get_weather", {"city": "Rome"}, "call_lc")
    ]
    dev_model.script({"content": "Sunny in Rome."})
    done = with_tools.invoke([question, called, ToolMessage("sunny", tool_call_id="call_lc")])
    assert done.content == "Sunny in Rome."


async def test_langchain_async(dev: DevServer, dev_model: FakeOpenAI) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="memchat", base_url=f"{dev.url}/v1", api_key=dev.token(), max_retries=0)
    await llm.ainvoke("My bike is red.")
    dev_model.script({"content": "Red."})
    answer = await llm.ainvoke("What colour is my bike?")
    assert answer.content == "Red."
    assert saw_earlier_turn(dev_model.requests[-1], "My bike is red.", "echo: My bike is red.")


# ------------------------------------------------- chat front ends' calls


def chat_of(request: dict[str, Any]) -> set[str]:
    """Which chats ("alpha", "beta") the user and assistant messages of a
    model request come from (the memory block left out)."""
    return {text.split(":")[1].strip() if text.startswith("echo:") else text.split(":")[0]
            for _, text in conversation(request)}  # fmt: skip


async def test_two_chats_at_once_each_keep_their_own_session(
    dev: DevServer, dev_model: FakeOpenAI
) -> None:
    """As Open WebUI calls with forwarded user info headers: each chat sends
    its id and its whole history on every call, with max_tokens and a
    temperature. Two chats of one user, at once, never share a window."""
    client = openai.AsyncOpenAI(base_url=f"{dev.url}/v1", api_key=dev.token(), max_retries=0)
    chats = {"alpha": str(uuid.uuid4()), "beta": str(uuid.uuid4())}

    async def talk(name: str) -> set[str]:
        history: list[dict[str, str]] = []
        sessions = set()
        for turn in range(3):
            history.append({"role": "user", "content": f"{name}: message {turn}"})
            raw = await client.chat.completions.with_raw_response.create(
                model="memchat",
                messages=history,  # type: ignore[arg-type]
                max_tokens=64,
                temperature=0.3,
                extra_headers={"X-OpenWebUI-Chat-Id": chats[name]},
            )
            answer = raw.parse().choices[0].message.content or ""
            history.append({"role": "assistant", "content": answer})
            sessions.add(raw.headers["x-memchat-session-id"])
        return sessions

    try:
        alpha, beta = await asyncio.gather(talk("alpha"), talk("beta"))
    finally:
        await client.close()
    assert alpha == {chats["alpha"]} and beta == {chats["beta"]}
    assert len(dev_model.requests) == 6
    for request in dev_model.requests:
        assert len(chat_of(request)) == 1, conversation(request)
        assert (request["max_tokens"], request["temperature"]) == (64, 0.3)


def test_a_chat_that_names_no_id_is_found_by_its_history(
    dev: DevServer, dev_model: FakeOpenAI
) -> None:
    """A client that resends its history and names no chat (LibreChat
    without its conversation header, Continue): the chat goes on in the
    session that stored its last answer, and its window is its own
    exchanges as memchat stored them, never another chat's."""
    client = client_for(dev)
    histories: dict[str, list[dict[str, str]]] = {"alpha": [], "beta": []}

    def say(name: str, text: str) -> str:
        history = histories[name]
        history.append({"role": "user", "content": f"{name}: {text}"})
        raw = client.chat.completions.with_raw_response.create(model="memchat", messages=history)  # type: ignore[arg-type]
        history.append(
            {"role": "assistant", "content": raw.parse().choices[0].message.content or ""}
        )
        return str(raw.headers["x-memchat-session-id"])

    say("alpha", "one")
    say("alpha", "two")
    say("beta", "one")  # no history: the agent's active session, as any such call
    say("beta", "two")
    assert chat_of(dev_model.requests[-1]) == {"beta"}
    say("alpha", "three")
    assert chat_of(dev_model.requests[-1]) == {"alpha"}
    assert ("user", "alpha: two") in conversation(dev_model.requests[-1])


def test_sdk_follow_ups_whole_and_streamed(dev: DevServer, dev_model: FakeOpenAI) -> None:
    client = client_for(dev)
    question = [{"role": "user", "content": "Tell me about tea"}]
    whole = client.chat.completions.create(
        model="memchat",
        messages=question,
        extra_body={"memchat": {"suggest": True}},  # type: ignore[arg-type]
    )
    offered = (whole.model_extra or {})["memchat"]["suggestions"]
    assert offered == [f"{w} about Tell me about tea?" for w in ("Why", "How", "When")]
    stream = client.chat.completions.create(
        model="memchat",
        messages=question,  # type: ignore[arg-type]
        stream=True,
        extra_body={"memchat": {"suggest": True}},
    )
    found = [(chunk.model_extra or {}).get("memchat", {}).get("suggestions") for chunk in stream]
    assert [f for f in found if f] == [offered]
