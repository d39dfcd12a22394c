"""Stored message shape (memchat.messages): LangChain's message_to_dict."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, messages_from_dict, messages_to_dict

from memchat import messages


def test_human_is_langchains_shape() -> None:
    assert messages.human("hi") == {
        "type": "human",
        "data": {
            "content": "hi",
            "additional_kwargs": {},
            "response_metadata": {},
            "type": "human",
            "name": None,
            "id": None,
        },
    }


def test_ai_with_tool_calls_usage_and_model() -> None:
    message = messages.ai(
        "",
        tool_calls=[{"id": "c1", "name": "manage_long_term_memory", "args": {"operation": "read"}}],
        model="gpt-x",
        usage={"prompt_tokens": 3, "completion_tokens": 4},
    )
    data = message["data"]
    assert message["type"] == data["type"] == "ai"
    assert data["tool_calls"] == [
        {
            "name": "manage_long_term_memory",
            "args": {"operation": "read"},
            "id": "c1",
            "type": "tool_call",
        }
    ]
    assert data["invalid_tool_calls"] == []
    assert data["usage_metadata"] == {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    # Where LangChain's ChatOpenAI keeps them: the provider's counts.
    assert data["response_metadata"] == {
        "model_name": "gpt-x",
        "token_usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }


def test_plain_ai_has_no_usage_or_model() -> None:
    data = messages.ai("hello")["data"]
    assert data["tool_calls"] == [] and data["usage_metadata"] is None
    assert data["response_metadata"] == {}


def test_tool_result() -> None:
    data = messages.tool("ok", tool_call_id="c1", name="manage_long_term_memory")["data"]
    assert data["tool_call_id"] == "c1" and data["status"] == "success"
    assert data["name"] == "manage_long_term_memory" and data["content"] == "ok"


def test_langchain_reads_and_writes_the_same_dicts() -> None:
    ours = [
        messages.human("hi"),
        messages.ai(
            "",
            tool_calls=[{"id": "c1", "name": "t", "args": {"a": 1}}],
            model="m",
            usage={"prompt_tokens": 1, "completion_tokens": 2},
        ),
        messages.tool("done", tool_call_id="c1", name="t"),
        messages.ai("bye"),
    ]
    loaded = messages_from_dict(ours)
    assert [m.type for m in loaded] == ["human", "ai", "tool", "ai"]
    assert isinstance(loaded[1], AIMessage)
    assert loaded[1].tool_calls == [
        {"name": "t", "args": {"a": 1}, "id": "c1", "type": "tool_call"}
    ]
    assert loaded[3].content == "bye"
    # Written back by LangChain, read by us: the same text and roles.
    again = messages_to_dict(loaded)
    assert [messages.to_openai(m) for m in again] == [messages.to_openai(m) for m in ours]


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("plain", "plain"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "ab"),
        (["a", {"type": "text", "text": "b"}], "ab"),
        ([{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "t"}], "t"),
        ([], ""),
        (None, ""),
    ],
)
def test_text_of_keeps_only_the_text(content: Any, text: str) -> None:
    assert messages.text_of({"type": "human", "data": {"content": content}}) == text


def test_to_openai_maps_roles_and_skips_tool_results() -> None:
    assert messages.to_openai(messages.human("q")) == {"role": "user", "content": "q"}
    assert messages.to_openai(messages.ai("a")) == {"role": "assistant", "content": "a"}
    system = {"type": "system", "data": {"content": "s"}}
    assert messages.to_openai(system) == {"role": "system", "content": "s"}
    assert messages.to_openai(messages.tool("r", tool_call_id="c", name="t")) is None
    assert messages.to_openai({"type": "function", "data": {"content": "x"}}) is None
    assert messages.to_openai({}) is None
