"""ModelClient.complete_streaming: the real `openai` client against the fake server.

A streamed answer must come out exactly as `complete` would return it (the
content, the tool calls assembled from their fragments, the model, the
usage of the last chunk), its text passed on chunk by chunk as it arrives,
made storable like the final content. Every way a stream can fail (an HTTP
error first, a timeout, a dropped connection, an error event, a chunk that
is not JSON or holds wrong types, a stream that just ends) is UpstreamError
or UpstreamTimeout, never another exception; an exception of the consumer's
callback is its own and propagates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from memchat.config import load_settings
from memchat.errors import UpstreamError, UpstreamTimeout
from memchat.model import offline
from memchat.model.client import Completion, ModelClient, ToolCall
from tests.conftest import JWT_SECRET, UNUSED_DATABASE
from tests.utils.fake_openai import FakeOpenAI, tool_call
from tests.utils.logs import assert_not_logged

LOGGER = "memchat.model.client"
LONE = "\ud800"  # a high surrogate with no low one after it
FFFD = "\ufffd"
PROMPT = [{"role": "user", "content": "hello big wide world"}]
SECRET = "my secret is teal"  # answer text that must never reach a log record


@pytest.fixture
def client(model: FakeOpenAI, model_client_for: Callable[..., ModelClient]) -> ModelClient:
    return model_client_for(model.url, openai_timeout_seconds=3)


class Deltas:
    """An on_delta callback that records each delta and when it arrived."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.times: list[float] = []
        self.first = asyncio.Event()

    async def __call__(self, text: str) -> None:
        self.texts.append(text)
        self.times.append(time.monotonic())
        self.first.set()


async def stream(client: ModelClient, **kwargs: Any) -> tuple[Completion, Deltas]:
    deltas = Deltas()
    completion = await client.complete_streaming(PROMPT, on_delta=deltas, **kwargs)
    return completion, deltas


def chunk(delta: dict[str, Any] | None = None, finish: Any = None, **top: Any) -> Any:
    """One chat.completion.chunk as OpenAI sends it."""
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [choice],
        "usage": None,
        **top,
    }


def sse(*payloads: Any, done: bool = True) -> str:
    """Server-Sent Events carrying `payloads` (strings as they are), then [DONE]."""
    lines = [p if isinstance(p, str) else f"data: {json.dumps(p)}\n\n" for p in payloads]
    return "".join(lines) + ("data: [DONE]\n\n" if done else "")


def usage_chunk(prompt: int = 3, completion: int = 4) -> Any:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": 7}
    return {**chunk(), "choices": [], "usage": usage}


# ------------------------------------------------------------ success


async def test_deltas_arrive_in_order_and_join_to_what_complete_returns(
    client: ModelClient, model: FakeOpenAI
) -> None:
    model.script({"content": "The quick brown fox jumps."})
    completion, deltas = await stream(client)
    assert deltas.texts == ["The ", "quick ", "brown ", "fox ", "jumps."]
    assert completion == Completion(
        "The quick brown fox jumps.",
        [],
        "fake-model",
        {"prompt_tokens": 11, "completion_tokens": 7},
    )
    # The same reply, not streamed, is the same Completion.
    model.script({"content": "The quick brown fox jumps."})
    assert await client.complete(PROMPT) == completion
    # One request each, counted as chat completions; the streamed one asked to stream.
    assert model.calls == 2
    streamed, plain = model.requests
    assert streamed["stream"] is True
    assert streamed["stream_options"] == {"include_usage": True}
    assert streamed["messages"] == PROMPT and streamed["model"] == "fake-model"
    assert "stream" not in plain


async def test_the_default_echo_is_streamed_in_several_chunks(
    client: ModelClient, model: FakeOpenAI
) -> None:
    completion, deltas = await stream(client)
    assert completion.content == "echo: hello big wide world"
    assert deltas.texts == ["echo: ", "hello ", "big ", "wide ", "world"]


async def test_without_on_delta_the_answer_is_still_returned(
    client: ModelClient, model: FakeOpenAI
) -> None:
    model.script({"content": "no callback here"})
    completion = await client.complete_streaming(PROMPT)
    assert completion.content == "no callback here"


async def test_each_delta_is_passed_on_while_later_chunks_are_still_delayed(
    client: ModelClient, model: FakeOpenAI
) -> None:
    # Five chunks 0.3 s apart: the stream takes >= 1.2 s after its first chunk.
    model.script({"chunks": ["a", "b", "c", "d", "e"], "chunk_delay": 0.3})
    deltas = Deltas()
    task = asyncio.create_task(client.complete_streaming(PROMPT, on_delta=deltas))
    await asyncio.wait_for(deltas.first.wait(), 2)
    assert deltas.texts == ["a"]
    assert not task.done()  # the first delta came while the rest was still to come
    completion = await task
    ended = time.monotonic()
    assert completion.content == "abcde" and deltas.texts == ["a", "b", "c", "d", "e"]
    # Each delta when its chunk came, not all at the end (generous bounds).
    gaps = [b - a for a, b in zip(deltas.times, deltas.times[1:], strict=False)]
    assert all(gap > 0.15 for gap in gaps), gaps
    assert ended - deltas.times[0] > 0.9


async def test_the_first_token_delay_is_before_the_first_delta(
    client: ModelClient, model: FakeOpenAI
) -> None:
    model.script({"content": "late start", "first_token_delay": 0.5})
    started = time.monotonic()
    _, deltas = await stream(client)
    assert deltas.times[0] - started >= 0.45
    assert deltas.texts == ["late ", "start"]


async def test_tool_calls_streamed_in_fragments_come_back_whole(
    client: ModelClient, model: FakeOpenAI
) -> None:
    # Two calls; the fake streams each one's arguments 8 characters at a time.
    first = tool_call("append", content="- likes green tea, not coffee")["tool_calls"][0]
    second = tool_call("read")["tool_calls"][0]
    reply = {"content": "Noting that.", "tool_calls": [first, second]}
    model.script(reply)
    completion, deltas = await stream(client, tools=[{"type": "function"}])
    assert deltas.texts == ["Noting ", "that."]
    assert completion.tool_calls == [
        ToolCall(first["id"], "manage_long_term_memory", first["function"]["arguments"]),
        ToolCall(second["id"], "manage_long_term_memory", second["function"]["arguments"]),
    ]
    assert completion.tool_calls[0].parsed() == {
        "operation": "append",
        "content": "- likes green tea, not coffee",
    }
    model.script(reply)
    assert await client.complete(PROMPT, [{"type": "function"}]) == completion
    assert model.requests[0]["tool_choice"] == "auto"


async def test_tool_calls_in_openais_own_fragments_interleaved_by_index(
    client: ModelClient, model: FakeOpenAI
) -> None:
    # As OpenAI streams parallel calls: id, type and name once, then argument
    # pieces tagged with the call's index (interleaved here), content null.
    def fragment(index: int, **fields: Any) -> Any:
        return chunk({"tool_calls": [{"index": index, **fields}]})

    def head(index: int, call_id: str) -> Any:
        function = {"name": "manage_long_term_memory", "arguments": ""}
        return fragment(index, id=call_id, type="function", function=function)

    def piece(index: int, text: str) -> Any:
        return fragment(index, function={"arguments": text})

    model.script(
        {
            "raw_stream": sse(
                chunk({"role": "assistant", "content": None}),
                head(0, "call_a"),
                piece(0, '{"operation"'),
                head(1, "call_b"),
                piece(1, '{"operation": "re'),
                piece(0, ': "append", "content": "- tea"}'),
                piece(1, 'ad"}'),
                chunk(finish="tool_calls"),
                usage_chunk(),
            )
        }
    )
    completion, deltas = await stream(client)
    assert deltas.texts == []
    assert completion == Completion(
        "",
        [
            ToolCall(
                "call_a",
                "manage_long_term_memory",
                '{"operation": "append", "content": "- tea"}',
            ),
            ToolCall("call_b", "manage_long_term_memory", '{"operation": "read"}'),
        ],
        "gpt-4o-mini-2024-07-18",
        {"prompt_tokens": 3, "completion_tokens": 4},
    )


async def test_tools_are_refused_with_allow_tools_false(
    client: ModelClient, model: FakeOpenAI
) -> None:
    await stream(client, tools=[{"type": "function"}], allow_tools=False)
    assert model.requests[-1]["tool_choice"] == "none"


async def test_usage_and_model_come_from_the_chunks(client: ModelClient, model: FakeOpenAI) -> None:
    model.script(
        {
            "raw_stream": sse(
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "hi"}),
                chunk(finish="stop"),
                usage_chunk(prompt=120, completion=1),
            )
        }
    )
    completion, _ = await stream(client)
    assert completion.model == "gpt-4o-mini-2024-07-18"
    assert completion.usage == {"prompt_tokens": 120, "completion_tokens": 1}

    # No usage chunk and no model: {} and the configured model.
    no_model = {**chunk({"content": "hi"}, finish="stop"), "model": None}
    model.script({"raw_stream": sse(no_model)})
    completion, _ = await stream(client)
    assert (completion.content, completion.model, completion.usage) == ("hi", "fake-model", {})


async def test_lone_surrogates_and_nul_are_made_storable_in_deltas_and_content(
    client: ModelClient, model: FakeOpenAI
) -> None:
    # A lone surrogate, a NUL, and a surrogate pair split between two chunks.
    pieces = [f"caf{LONE}é ", "\x00nul ", "tea \ud83d", "\ude00!", "\x00"]
    model.script({"chunks": pieces})
    completion, deltas = await stream(client)
    assert deltas.texts == [f"caf{FFFD}é ", "nul ", "tea ", "😀!"]
    assert completion.content == f"caf{FFFD}é nul tea 😀!" == "".join(deltas.texts)
    # What `complete` makes of the same text.
    model.script({"content": "".join(pieces)})
    assert (await client.complete(PROMPT)).content == completion.content


async def test_a_lone_high_surrogate_at_the_end_is_passed_on_replaced(
    client: ModelClient, model: FakeOpenAI
) -> None:
    model.script({"chunks": ["the end", "\ud83d"]})
    completion, deltas = await stream(client)
    assert deltas.texts == ["the end", FFFD]
    assert completion.content == f"the end{FFFD}"


async def test_surrogates_in_streamed_tool_calls_are_repaired_like_complete_does(
    client: ModelClient, model: FakeOpenAI
) -> None:
    arguments = json.dumps({"operation": "append", "content": f"- tea{LONE}"})
    call = {
        "id": f"call_{LONE}",
        "type": "function",
        "function": {"name": "manage_long_term_memory", "arguments": arguments},
    }
    model.script({"tool_calls": [call]})
    completion, _ = await stream(client)
    [streamed] = completion.tool_calls
    assert streamed.id == f"call_{FFFD}"
    assert streamed.parsed() == {"operation": "append", "content": f"- tea{FFFD}"}
    model.script({"tool_calls": [call]})
    assert (await client.complete(PROMPT)).tool_calls == completion.tool_calls


async def test_a_relaxed_but_valid_event_stream_is_read(
    client: ModelClient, model: FakeOpenAI
) -> None:
    # A byte order mark, CRLF line ends, keep-alive comments, an id field,
    # data split over two lines of one event, and writes cut anywhere (in a
    # CRLF, in the mark, in a UTF-8 character).
    body = (
        "\ufeff: keep-alive\r\n\r\n"
        + f"id: 1\r\ndata: {json.dumps(chunk({'content': 'thé '}), ensure_ascii=False)}\r\n\r\n"
        + 'data: {"choices": [{"index": 0,\r\ndata: "delta": {"content": "time"}}]}\r\n\r\n'
        + ": still there\r\n"
        + f"data: {json.dumps(chunk(finish='stop'))}\r\n\r\n"
        + "data: [DONE]\r\n\r\n"
    ).encode()
    cuts = [1, 2, 20, 21, 60, body.index("é".encode()) + 1, len(body) - 3, len(body) - 1]
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    model.script({"raw_stream": pieces, "chunk_delay": 0.01})
    completion, deltas = await stream(client)
    assert deltas.texts == ["thé ", "time"]
    assert completion.content == "thé time"


async def test_an_answer_that_ends_after_its_finish_reason_without_done_is_whole(
    client: ModelClient, model: FakeOpenAI
) -> None:
    # Some OpenAI-compatible servers never send [DONE]: the finish_reason
    # says the answer is whole.
    model.script({"raw_stream": sse(chunk({"content": "all here"}, finish="stop"), done=False)})
    completion, _ = await stream(client)
    assert completion.content == "all here"


async def test_a_server_that_ignores_stream_is_read_as_a_whole_answer(
    client: ModelClient, model: FakeOpenAI
) -> None:
    completion_body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "plain-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "whole"}}],
    }
    model.script({"raw": json.dumps(completion_body)})  # application/json
    completion, deltas = await stream(client)
    assert deltas.texts == ["whole"]
    assert (completion.content, completion.model) == ("whole", "plain-model")


# ------------------------------------------------------------ failures


async def test_an_http_error_before_the_stream_is_upstream_error(
    client: ModelClient, model: FakeOpenAI
) -> None:
    model.script({"status": 500})
    deltas = Deltas()
    with pytest.raises(UpstreamError, match="HTTP 500; nothing was stored"):
        await client.complete_streaming(PROMPT, on_delta=deltas)
    assert deltas.texts == [] and model.calls == 1  # openai_max_retries = 0


async def test_http_errors_are_retried_like_complete_does(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient]
) -> None:
    client = model_client_for(model.url, openai_max_retries=1)
    model.script({"status": 503}, {"content": "after a retry"})
    completion, _ = await stream(client)
    assert completion.content == "after a retry" and model.calls == 2


@pytest.mark.parametrize(
    "reply",
    [
        {"delay": 3, "content": "too late"},  # before the response starts
        {"first_token_delay": 3, "content": "too late"},  # headers, then nothing
    ],
    ids=["before-headers", "before-first-token"],
)
async def test_a_silent_server_is_upstream_timeout(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient], reply: dict[str, Any]
) -> None:
    client = model_client_for(model.url, openai_timeout_seconds=0.5)
    model.script(reply)
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout):
        await stream(client)
    assert time.monotonic() - started < 2


async def test_a_stream_that_stalls_midway_is_upstream_timeout_after_its_deltas(
    model: FakeOpenAI, model_client_for: Callable[..., ModelClient]
) -> None:
    client = model_client_for(model.url, openai_timeout_seconds=0.5)
    model.script({"chunks": ["one ", "two"], "chunk_delay": 3})
    deltas = Deltas()
    with pytest.raises(UpstreamTimeout):
        await client.complete_streaming(PROMPT, on_delta=deltas)
    assert deltas.texts == ["one "]


def raw(*payloads: Any, done: bool = True) -> dict[str, Any]:
    return {"raw_stream": sse(*payloads, done=done)}


HTML = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"

FAILURES: dict[str, tuple[dict[str, Any], str]] = {
    # The stream breaks off or reports an error.
    "dropped-mid-stream": ({"content": f"{SECRET} and more", "fail_after": 2}, "broke off"),
    "dropped-before-content": ({"content": SECRET, "fail_after": 0}, "broke off"),
    "error-event": ({"content": SECRET, "fail_after": 2, "error": "overloaded"}, "error"),
    "sse-error-event": (
        raw(chunk({"content": SECRET}), 'event: error\ndata: {"message": "overloaded"}\n\n'),
        "error",
    ),
    "ends-without-done-or-finish": (raw(chunk({"content": SECRET}), done=False), "broke off"),
    "empty-stream": ({"raw_stream": ""}, "broke off"),
    "only-comments": ({"raw_stream": ": keep-alive\n\n"}, "broke off"),
    "done-without-a-choice": (raw(usage_chunk()), "no answer"),
    "only-done": (raw(), "no answer"),
    # Not an event stream, or not JSON in it.
    "html": ({"raw_stream": HTML, "content_type": "text/html"}, "could not be read"),
    "html-labelled-json": ({"raw": HTML}, "could not be read"),
    "bare-json-lines": ({"raw_stream": json.dumps(chunk({"content": SECRET})) + "\n"}, "read"),
    "malformed-json": (
        {"raw_stream": 'data: {"choices": [{"delta": {"content": "my s\n\n'},
        "read",
    ),
    "data-not-json": ({"raw_stream": "data: hello\n\n"}, "could not be read"),
    "empty-data": ({"raw_stream": "data:\n\n"}, "could not be read"),
    "invalid-utf8": ({"raw_stream": b'data: {"model": "\xff\xfe"}\n\n'}, "could not be read"),
    "deeply-nested": ({"raw_stream": "data: " + "[" * 100_000 + "]" * 100_000 + "\n\n"}, "read"),
    "chunk-array": (raw([1, 2]), "could not be read"),
    # Wrong types in a chunk.
    "content-number": ({"chunks": [SECRET, 42]}, "could not be read"),
    "content-object": ({"chunks": [{"text": SECRET}]}, "could not be read"),
    "content-list": ({"content": [{"type": "text", "text": SECRET}]}, "could not be read"),
    "choices-string": ({"override": {"choices": "x"}}, "could not be read"),
    "choices-object": (raw({**chunk(), "choices": {"delta": {}}}), "could not be read"),
    "choice-string": (raw({**chunk(), "choices": ["x"]}), "could not be read"),
    "delta-string": (raw({**chunk(), "choices": [{"index": 0, "delta": "x"}]}), "read"),
    "finish-reason-number": (raw(chunk({"content": SECRET}, finish=1)), "could not be read"),
    "model-number": ({"override": {"model": 5}}, "could not be read"),
    "usage-string": ({"override": {"usage": "lots"}}, "could not be read"),
    "usage-tokens-negative": (raw(chunk({"content": SECRET}), {**usage_chunk(-1)}), "read"),
    "tool-calls-string": ({"tool_calls": "x"}, "could not be read"),
    "tool-call-string": ({"tool_calls": ["x"]}, "could not be read"),
    "tool-call-index-string": (raw(chunk({"tool_calls": [{"index": "0"}]})), "read"),
    "tool-call-index-negative": (raw(chunk({"tool_calls": [{"index": -1}]})), "read"),
    "tool-call-index-bool": (raw(chunk({"tool_calls": [{"index": True}]})), "read"),
    "tool-call-function-string": (raw(chunk({"tool_calls": [{"function": "f"}]})), "read"),
    "tool-call-id-number": (
        {"tool_calls": [{**tool_call("read")["tool_calls"][0], "id": 7}]},
        "read",
    ),
    "tool-call-id-missing": (
        {"tool_calls": [{**tool_call("read")["tool_calls"][0], "id": None}]},
        "could not be read",
    ),
    "tool-call-name-missing": (
        raw(chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"arguments": "{}"}}]})),
        "could not be read",
    ),
    "tool-call-arguments-object": (
        raw(chunk({"tool_calls": [{"index": 0, "function": {"arguments": {"a": 1}}}]})),
        "could not be read",
    ),
}


@pytest.mark.parametrize(("reply", "detail"), FAILURES.values(), ids=FAILURES.keys())
async def test_a_broken_stream_is_upstream_error(
    client: ModelClient,
    model: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
    reply: dict[str, Any],
    detail: str,
) -> None:
    model.script(reply)
    deltas = Deltas()
    with caplog.at_level(logging.DEBUG, logger=LOGGER), pytest.raises(UpstreamError) as raised:
        await client.complete_streaming(PROMPT, on_delta=deltas)
    assert detail in str(raised.value)
    assert "nothing was stored" in str(raised.value)
    assert model.calls == 1  # not retried
    # Deltas before the failure were passed on; nothing was made up.
    assert "".join(deltas.texts) in f"{SECRET} and more"
    # The answer's text never reaches a log record.
    assert_not_logged(caplog, SECRET)


async def test_a_dropped_stream_passes_on_what_came_before_the_drop(
    client: ModelClient, model: FakeOpenAI
) -> None:
    model.script({"content": "one two three four", "fail_after": 3})
    deltas = Deltas()
    with pytest.raises(UpstreamError, match="broke off"):
        await client.complete_streaming(PROMPT, on_delta=deltas)
    assert deltas.texts == ["one ", "two ", "three "]


# ------------------------------------------------------------ the consumer


class ConsumerGone(Exception):
    pass


async def test_an_exception_of_on_delta_propagates_and_the_stream_is_closed(
    client: ModelClient, model: FakeOpenAI
) -> None:
    # A long, slow stream: the exception must not wait for its end.
    model.script({"chunks": [f"{i} " for i in range(20)], "chunk_delay": 0.2})
    seen: list[str] = []

    async def on_delta(text: str) -> None:
        seen.append(text)
        if len(seen) == 2:
            raise ConsumerGone()

    started = time.monotonic()
    with pytest.raises(ConsumerGone):
        await client.complete_streaming(PROMPT, on_delta=on_delta)
    assert seen == ["0 ", "1 "]
    assert time.monotonic() - started < 2  # the stream would take about 4 s
    # The client is usable at once: the abandoned stream holds nothing up.
    model.script({"content": "next"})
    assert (await client.complete_streaming(PROMPT)).content == "next"
    assert (await client.complete(PROMPT)).content == "echo: hello big wide world"


async def test_a_cancelled_stream_is_cancelled(client: ModelClient, model: FakeOpenAI) -> None:
    model.script({"chunks": ["a", "b", "c"], "chunk_delay": 1})
    deltas = Deltas()
    task = asyncio.create_task(client.complete_streaming(PROMPT, on_delta=deltas))
    await asyncio.wait_for(deltas.first.wait(), 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deltas.texts == ["a"]


# ------------------------------------------------------------ offline responder


@pytest.fixture
async def offline_client() -> AsyncIterator[ModelClient]:
    settings = load_settings(
        database_url=UNUSED_DATABASE,
        supabase_jwt_secret=JWT_SECRET,
        openai_api_key=None,
        offline_model=True,
    )
    client = ModelClient.for_settings(settings)
    yield client
    await client.close()


async def test_the_offline_responder_streams_its_answer(offline_client: ModelClient) -> None:
    completion, deltas = await stream(offline_client)
    assert completion.content.startswith(offline.LABEL)
    assert 'You said: "hello big wide world".' in completion.content
    assert len(deltas.texts) > 5
    assert "".join(deltas.texts) == completion.content
    assert completion.model == "memchat-offline"
    assert completion.usage == {"prompt_tokens": 0, "completion_tokens": 0}
    # The same answer as without streaming.
    assert (await offline_client.complete(PROMPT)).content == completion.content


async def test_the_offline_responder_streams_tool_calls(offline_client: ModelClient) -> None:
    prompt = [{"role": "user", "content": "remember I like my tea with a lot of milk"}]
    deltas = Deltas()
    tools = [{"type": "function"}]
    completion = await offline_client.complete_streaming(prompt, tools, on_delta=deltas)
    assert deltas.texts == [] and completion.content == ""
    [call] = completion.tool_calls
    assert call.name == "manage_long_term_memory" and call.id.startswith("call_")
    assert call.parsed() == {"operation": "append", "content": "- I like my tea with a lot of milk"}
    [plain] = (await offline_client.complete(prompt, tools)).tool_calls
    assert (plain.name, plain.arguments) == (call.name, call.arguments)

    # With no tool rounds left, a text answer, streamed.
    completion = await offline_client.complete_streaming(
        prompt, tools, allow_tools=False, on_delta=deltas
    )
    assert completion.tool_calls == [] and "".join(deltas.texts) == completion.content
    assert "no tool rounds left" in completion.content
