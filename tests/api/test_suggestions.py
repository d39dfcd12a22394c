"""Suggested follow-ups (SUGGESTIONS, `suggest`, /v1 `memchat.suggest`): up to
three questions with the answer, made without delaying it, never stored.

The fake model answers a suggestions request itself (its own script and
log: `suggestion_requests`), so a turn's scripted replies are its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from memchat.prompts import suggestions
from memchat.usecases import suggestions as suggestions_usecase
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat
from tests.utils.fake_openai import FakeOpenAI, tool_call
from tests.utils.openai_api import WEATHER_TOOL
from tests.utils.sse import names, parse
from tests.utils.store_data import contents

Build = Callable[..., ApiClient]
STREAM = {"Accept": "text/event-stream"}


def quoted(request: dict[str, Any]) -> list[tuple[str, str]]:
    """The conversation a suggestions request quoted."""
    return suggestions.conversation_of(request["messages"][-1]["content"])


async def test_asked_for_the_answer_carries_follow_ups_never_stored(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    plain = await chat(api, auth, "I like oolong")
    assert plain["suggestions"] is None and model.suggestion_requests == []
    model.script({"content": "Oolong is a partly oxidised tea."})
    body = await chat(api, auth, "What is oolong?", suggest=True, session_id=plain["session_id"])
    assert body["answer"] == "Oolong is a partly oxidised tea."
    assert body["suggestions"] == [
        "Why about What is oolong??",
        "How about What is oolong??",
        "When about What is oolong??",
    ]
    (asked,) = model.suggestion_requests
    assert asked["messages"][0]["content"] == suggestions.INSTRUCTIONS
    assert asked["max_tokens"] == suggestions.MAX_TOKENS
    # Made beside the answer: from the conversation and the question.
    assert quoted(asked) == [
        ("user", "I like oolong"),
        ("assistant", "echo: I like oolong"),
        ("user", "What is oolong?"),
    ]
    stored = contents(admin, uuid.UUID(body["session_id"]))
    assert len(stored) == 4 and not any("Why about" in text for _, text in stored)


async def test_the_setting_asks_unless_a_request_declines(
    custom_api: Build, model: FakeOpenAI
) -> None:
    api = custom_api(suggestions=True)
    _, auth = api.new_user()
    assert len((await chat(api, auth, "hello there"))["suggestions"]) == 3
    assert (await chat(api, auth, "again", suggest=False))["suggestions"] is None
    assert len(model.suggestion_requests) == 1


async def test_a_failed_or_slow_suggestion_never_fails_or_delays_the_answer(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    model.script_suggestions({"status": 500})
    failed = await chat(api, auth, "first", suggest=True)
    assert failed["answer"] == "echo: first" and failed["suggestions"] == []
    # Not ready soon after the turn is stored: the answer does not wait for it.
    model.script_suggestions({"delay": suggestions_usecase.WAIT_SECONDS + 2})
    slow = await chat(api, auth, "second", suggest=True)
    assert slow["answer"] == "echo: second" and slow["suggestions"] == []
    model.script_suggestions({"content": "not json at all"})
    unreadable = await chat(api, auth, "third", suggest=True)
    assert unreadable["suggestions"] == ["not json at all"]  # one question a line


async def test_a_streamed_answer_sends_its_follow_ups_after_done(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    model.script({"content": "Steep it for three minutes."})
    response = await api.post(
        "/chat", json={"message": "How do I brew it?", "suggest": True}, headers={**auth, **STREAM}
    )
    events = parse(response.text)
    kinds = [k for k in names(events) if k != "comment"]
    assert kinds[0] == "start" and kinds[-2:] == ["done", "suggestions"], kinds
    done = events[names(events).index("done")].data
    assert done["suggestions"] is None  # they come after it
    assert events[-1].data == {
        "suggestions": [
            "Why about How do I brew it??",
            "How about How do I brew it??",
            "When about How do I brew it??",
        ]
    }
    # Made once the answer was written: from the answer too.
    (asked,) = model.suggestion_requests
    assert quoted(asked)[-2:] == [
        ("user", "How do I brew it?"),
        ("assistant", "Steep it for three minutes."),
    ]
    # A failure: an empty list, the stream still ends.
    model.script_suggestions({"status": 500})
    response = await api.post(
        "/chat", json={"message": "and then?", "suggest": True}, headers={**auth, **STREAM}
    )
    assert parse(response.text)[-1].data == {"suggestions": []}


async def test_v1_follow_ups_whole_and_streamed(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    body = {
        "model": "memchat",
        "messages": [{"role": "user", "content": "Tell me about Lisbon"}],
        "memchat": {"suggest": True},
    }
    whole = (await api.post("/v1/chat/completions", json=body, headers=auth)).json()
    assert len(whole["memchat"]["suggestions"]) == 3
    plain = {**body, "memchat": {}}
    assert (await api.post("/v1/chat/completions", json=plain, headers=auth)).json()["memchat"][
        "suggestions"
    ] is None
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    text = (await api.post("/v1/chat/completions", json=streamed, headers=auth)).text
    assert text.endswith("data: [DONE]\n\n")
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert "suggestions" in chunks[-2]["memchat"] and chunks[-2]["choices"] == []
    assert len(chunks[-2]["memchat"]["suggestions"]) == 3
    assert chunks[-1]["usage"] is not None and chunks[-1]["choices"] == []  # usage last


async def test_a_turn_that_ends_with_a_client_tool_call_has_none(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    model.script({"tool_calls": [call]})
    body = {
        "model": "memchat",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER_TOOL],
        "memchat": {"suggest": True},
    }
    answer = (await api.post("/v1/chat/completions", json=body, headers=auth)).json()
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    assert answer["memchat"]["suggestions"] == []


async def test_own_tool_rounds_keep_their_follow_ups(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    model.script(tool_call("append", content="- likes tea"), {"content": "Noted."})
    body = await chat(api, auth, "remember I like tea", suggest=True)
    assert body["answer"] == "Noted." and len(body["suggestions"]) == 3
