"""OpenAI Chat Completions, served by memchat's own chat turn (usecases/chat.py).

A client that speaks the Chat Completions API sends its whole conversation
on every call; memchat keeps the conversation itself. The rule that keeps
the two apart (docs/api.md, "POST /v1/chat/completions"):

- the LAST `user` message is the turn's new message; it is stored, answered
  with memchat's memory (notes, recall, summary, the session's window)
  exactly as POST /chat answers it;
- the messages before it are the client's copy of the conversation: never
  stored again nor sent to the model as the client has them. They say
  which chat this is (`resolve`): with no session or chat id, the session
  that stored the last of their answers, and the window is those exchanges
  as memchat stored them (so two chats sharing a session never see each
  other's turns);
- `system` and `developer` messages are the client's instructions: sent to
  the model after memchat's system prompt, never stored;
- after the last user message, an `assistant` message calling the client's
  tools and the client's `tool` results continue the turn that call ended
  (only the results after the last assistant message are new and stored).

What reaches the model from the client is bounded (`TextBounds`): each
message memchat sends on (the instructions, the new user message, the
continuation's tool results) at MAX_MESSAGE_CHARS, and all of it, with the
tool schemas, at MAX_REQUEST_CHARS (413 naming the field, the model not
called). A continuation is checked against the call memchat stored
(usecases/chat.py): the call and the turn it ends reach the model as stored.

The sampling fields (`max_tokens` and `max_completion_tokens`, capped at
OPENAI_MAX_TOKENS, `temperature`, `top_p`, `stop`, `seed`, the penalties)
are sent to the model with every call of the turn. Fields that would
change the answer's shape if they were silently dropped (`n > 1`, a JSON
`response_format`, log probabilities, ...) are refused (400 naming the
field); routing hints (`user`, `store`, ...) are ignored. `model` names the agent:
`memchat` (the `default` agent) or `memchat:<agent_name>`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memchat import messages as stored_messages
from memchat import store
from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import BadRequest, InvalidInput, NotFound, PayloadTooLarge
from memchat.model import sampling
from memchat.model.sampling import Sampling
from memchat.usecases.chat import ChatRequest, one_session_id
from memchat.usecases.conversation import OWN_TOOLS

if TYPE_CHECKING:
    from memchat.config import Settings
    from memchat.store.db import Database
    from memchat.usecases.chat import ChatResult

MODEL_PREFIX = "memchat"
DEFAULT_AGENT = "default"
_AGENT = re.compile(AGENT_NAME_PATTERN)
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

# How the answer is sampled: sent to the model (`max_tokens` and
# `max_completion_tokens` within OPENAI_MAX_TOKENS).
SAMPLING = frozenset(
    {
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
    }
)
# Honoured (beside `messages`): read below.
HONOURED = (
    frozenset(
        {
            "model",
            "messages",
            "stream",
            "stream_options",
            "tools",
            "tool_choice",
            "metadata",
            "memchat",
        }
    )
    | SAMPLING
)
# Ignored: routing and accounting hints that are the provider's business;
# the answer is a whole answer to the same question.
IGNORED = frozenset({"user", "store", "service_tier", "prompt_cache_key", "safety_identifier"})
# Refused unless absent or at their default: each would change the answer.
# field -> (the values that are the default, why it is refused)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "n": ((None, 1), "memchat answers with one choice; send n: 1 or leave it out"),
    "logprobs": ((None, False), "log probabilities are not supported"),
    "top_logprobs": ((None, 0), "log probabilities are not supported"),
    "logit_bias": ((None, {}), "logit_bias is not supported"),
    "response_format": ((None, {"type": "text"}), "only text answers are supported"),
    "modalities": ((None, ["text"]), "only text answers are supported"),
    "audio": ((None,), "audio answers are not supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "reasoning_effort": ((None,), "the server's model settings apply"),
    "verbosity": ((None,), "the server's model settings apply"),
    "web_search_options": ((None,), "web search is not supported"),
    "parallel_tool_calls": ((None, True), "the model may always call several tools at once"),
    "functions": ((None, []), "send tools instead of the deprecated functions"),
    "function_call": ((None,), "send tool_choice instead of the deprecated function_call"),
}
_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class TextBounds:
    """How much client text one request may send to the model."""

    message_chars: int = 16_000  # MAX_MESSAGE_CHARS: each message sent on
    request_chars: int = 64_000  # MAX_REQUEST_CHARS: all of it, tool schemas included

    @classmethod
    def of(cls, settings: Settings) -> TextBounds:
        return cls(settings.max_message_chars, settings.max_request_chars)


@dataclass(frozen=True)
class CompletionRequest:
    """A Chat Completions request as memchat runs it."""

    turn: ChatRequest
    model: str  # as the client named it (echoed in the answer)
    stream: bool
    include_usage: bool
    # The client's earlier exchanges, (question, answer) oldest first: how a
    # chat that names no session is found (`resolve`).
    history: tuple[tuple[str | None, str], ...] = ()


# Header -> what it is: chat front ends' ids of a chat, each naming the
# session as X-Session-ID does (any id, not only a UUID: CHAT_IDS).
CHAT_ID_HEADERS = ("X-OpenWebUI-Chat-Id", "X-Conversation-Id")
# The session of a chat id that is not a UUID: uuid5 of the id in this namespace.
CHAT_IDS = uuid.UUID("6d656d63-6861-5463-8861-742d69647301")
_CHAT_ID = re.compile(r"[\x21-\x7e]{1,256}")
# The earlier exchanges a request's chat is matched with, at most.
HISTORY_EXCHANGES = 50


def agent_of(model: Any) -> str:
    """The agent a model id names: `memchat` -> default, `memchat:<agent>`."""
    if not isinstance(model, str) or not model:
        raise InvalidInput("model: required; use memchat or memchat:<agent_name> (GET /v1/models).")
    if model == MODEL_PREFIX:
        return DEFAULT_AGENT
    prefix, _, agent = model.partition(":")
    if prefix != MODEL_PREFIX or not _AGENT.fullmatch(agent):
        raise ModelNotFound(model)
    return agent


def model_id(agent_name: str) -> str:
    return MODEL_PREFIX if agent_name == DEFAULT_AGENT else f"{MODEL_PREFIX}:{agent_name}"


class ModelNotFound(NotFound):
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"model: {model[:80]!r} is not a memchat model; use memchat or"
            " memchat:<agent_name> (GET /v1/models lists yours)."
        )


async def list_models(db: Database, caller: store.Caller) -> list[str]:
    """The model ids the caller may use: the default agent's and every agent
    they have a session or notes with."""
    names = {DEFAULT_AGENT, *await store.agent_names(db, caller)}
    return sorted(model_id(name) for name in names)


def chat_session_id(header: str, value: str | None) -> uuid.UUID | None:
    """The session a chat id names: the id itself when it is a UUID, else a
    UUID made from it (sessions are per user: an id names only the
    caller's). 400 for one that is blank or not printable ASCII."""
    if value is None:
        return None
    value = value.strip()
    try:
        return uuid.UUID(value)
    except ValueError:
        pass
    if not _CHAT_ID.fullmatch(value):
        raise BadRequest(f"{header}: must be 1 to 256 printable ASCII characters.")
    return uuid.uuid5(CHAT_IDS, value)


def parse(
    body: Any,
    *,
    header_session_id: uuid.UUID | None,
    chat_ids: Sequence[tuple[str, str | None]] = (),
    bounds: TextBounds = TextBounds(),
) -> CompletionRequest:
    """The turn a Chat Completions body asks for (400 naming what is refused,
    413 for client text past `bounds`)."""
    if not isinstance(body, dict):
        raise InvalidInput("body: must be a JSON object.")
    _refuse_fields(body)
    agent_name = agent_of(body.get("model"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages: required, a non-empty list of messages.")
    checked = [_message(i, m) for i, m in enumerate(messages)]
    last_user = max((i for i, m in enumerate(checked) if m["role"] == "user"), default=None)
    if last_user is None:
        raise BadRequest("messages: there is no user message to answer.")
    continuation = tuple(checked[last_user + 1 :])
    _check_continuation(last_user, continuation)
    tools = _tools(body)
    _check_bounds(checked, last_user, tools, bounds)
    options = _options(body)
    stream = body.get("stream")
    if stream not in (None, True, False):
        raise InvalidInput("stream: must be true or false.")
    named = [("X-Session-ID", header_session_id), ("metadata.session_id", _metadata(body))]
    named += [(header, chat_session_id(header, value)) for header, value in chat_ids]
    turn = ChatRequest(
        message=str(checked[last_user]["content"]),
        session_id=one_session_id(named),
        agent_name=agent_name,
        instructions="\n\n".join(
            str(m["content"])
            for m in checked
            if m["role"] in ("system", "developer") and m["content"]
        ),
        tools=tools,
        search_memory=_flag(options, "search_memory"),
        suggest=_flag(options, "suggest"),
        client_message_id=_client_message_id(options),
        continuation=continuation,
        sampling=sampling_of(body),
    )
    return CompletionRequest(
        turn=turn,
        model=str(body["model"]),
        stream=stream is True,
        include_usage=_include_usage(body) if stream else False,
        history=_exchanges(checked[:last_user]),
    )


def _exchanges(earlier: list[dict[str, Any]]) -> tuple[tuple[str | None, str], ...]:
    """The client's earlier exchanges: each assistant message with text, and
    the user message before it (None when there is none since the last
    answer), the last HISTORY_EXCHANGES of them."""
    exchanges: list[tuple[str | None, str]] = []
    question: str | None = None
    for message in earlier:
        if message["role"] == "user":
            question = str(message["content"])
        elif message["role"] == "assistant" and message["content"]:
            exchanges.append((question, str(message["content"])))
            question = None
    return tuple(exchanges[-HISTORY_EXCHANGES:])


async def resolve(
    db: Database, caller: store.Caller, asked: CompletionRequest, window: int
) -> CompletionRequest:
    """The request with its chat's session, when it names none: a request
    that resends earlier exchanges goes on in the session that stored its
    last answer, with those exchanges as memchat stored them as its window
    (at most `window` of them); one whose chat memchat does not know starts
    a new session. A request with no earlier answer is left to the agent's
    active session."""
    if asked.turn.session_id is not None or not asked.history:
        return asked
    found = await store.chat_of_history(
        db, caller, asked.turn.agent_name, asked.history, limit=window
    )
    turn = dataclasses.replace(
        asked.turn,
        session_id=found.session_id or uuid.uuid4(),
        window=tuple(found.messages),
    )
    return dataclasses.replace(asked, turn=turn)


def _refuse_fields(body: dict[str, Any]) -> None:
    for name, value in body.items():
        if name in HONOURED or name in IGNORED:
            continue
        refused = REFUSED.get(name)
        if refused is None:
            raise InvalidInput(f"{name}: not a Chat Completions field memchat knows; leave it out.")
        defaults, why = refused
        if not any(value == default and type(value) is type(default) for default in defaults):
            raise BadRequest(f"{name}: not supported ({why}).")


def _message(index: int, value: Any) -> dict[str, Any]:
    """One message, its content as text (400 naming what is wrong)."""
    where = f"messages[{index}]"
    if not isinstance(value, dict):
        raise InvalidInput(f"{where}: must be an object.")
    role = value.get("role")
    if role not in _ROLES:
        raise InvalidInput(f"{where}.role: must be one of {', '.join(_ROLES)}.")
    message: dict[str, Any] = {"role": role, "content": _content(where, value.get("content"))}
    if role == "assistant" and value.get("tool_calls"):
        message["tool_calls"] = _calls(where, value["tool_calls"])
        message["content"] = message["content"] or None
    if role == "tool":
        call_id = value.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidInput(f"{where}.tool_call_id: required for a tool message.")
        message["tool_call_id"] = storable(f"{where}.tool_call_id", call_id)
    return message


def _content(where: str, content: Any) -> str:
    """A message's text: a string, or text parts (other parts are refused)."""
    if content is None or isinstance(content, str):
        return storable(f"{where}.content", content or "")
    if not isinstance(content, list):
        raise InvalidInput(f"{where}.content: must be a string or a list of text parts.")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise BadRequest(f"{where}.content[{j}]: only text parts are supported.")
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidInput(f"{where}.content[{j}].text: must be a string.")
        texts.append(storable(f"{where}.content[{j}].text", text))
    return "".join(texts)


def storable(where: str, text: str) -> str:
    """Text PostgreSQL can hold and JSON can carry: no NUL, no lone surrogate (422)."""
    storable_json(where, text)
    return text


def storable_json(where: str, value: Any) -> Any:
    """`storable` for any JSON value: its keys and strings (422 naming `where`)."""
    why = stored_messages.unstorable(value)
    if why is not None:
        raise InvalidInput(f"{where}: {why}.")
    return value


def _calls(where: str, calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise BadRequest(f"{where}.tool_calls: must be a list.")
    checked = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("id"), str)
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            raise InvalidInput(
                f"{where}.tool_calls[{j}]: must have an id and a function with a name"
                " and arguments."
            )
        at = f"{where}.tool_calls[{j}]"
        checked.append(
            {
                "id": storable(f"{at}.id", call["id"]),
                "type": "function",
                "function": {
                    "name": storable(f"{at}.function.name", function["name"]),
                    "arguments": storable(f"{at}.function.arguments", function["arguments"]),
                },
            }
        )
    return checked


def _check_continuation(last_user: int, continuation: tuple[dict[str, Any], ...]) -> None:
    """After the last user message: nothing, or rounds of an assistant's tool
    calls each followed by a result for every call."""
    expected: set[str] = set()
    for offset, message in enumerate(continuation):
        where = f"messages[{last_user + 1 + offset}]"
        if message["role"] == "assistant" and message.get("tool_calls") and not expected:
            expected = {call["id"] for call in message["tool_calls"]}
            continue
        if message["role"] == "tool" and message["tool_call_id"] in expected:
            expected.discard(message["tool_call_id"])
            continue
        raise BadRequest(
            f"{where}: after the last user message only an assistant's tool calls and"
            " the tool results for them may follow (the last user message is the one"
            " answered)."
        )
    if expected:
        raise BadRequest(
            f"messages: no tool result for the tool call {sorted(expected)[0]!r};"
            " send one tool message per call."
        )


def _check_bounds(
    checked: list[dict[str, Any]],
    last_user: int,
    tools: tuple[dict[str, Any], ...],
    bounds: TextBounds,
) -> None:
    """413 naming the field where the client text memchat sends the model
    passes a bound: the instructions, the new user message, the
    continuation's tool results, the tool schemas. The earlier turns the
    client resends are not sent (memchat sends its own window), and a
    continuation's assistant messages are replaced by the ones memchat stored."""
    sent: list[tuple[str, int]] = []
    for index, message in enumerate(checked):
        role = message["role"]
        if (
            role in ("system", "developer")
            or index == last_user
            or (role == "tool" and index > last_user)
        ):
            where = f"messages[{index}].content"
            length = len(message["content"] or "")
            if length > bounds.message_chars:
                raise PayloadTooLarge(
                    f"{where}: {length} characters; a message may have at most"
                    f" {bounds.message_chars} (MAX_MESSAGE_CHARS)."
                )
            sent.append((where, length))
    for index, tool in enumerate(tools):
        sent.append((f"tools[{index}]", len(json.dumps(tool, ensure_ascii=False))))
    total = 0
    for where, length in sent:
        total += length
        if total > bounds.request_chars:
            raise PayloadTooLarge(
                f"{where}: the text this request sends to the model reaches {total} characters"
                f" here; one request may send at most {bounds.request_chars}"
                " (MAX_REQUEST_CHARS)."
            )


def _tools(body: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The client's function tools, as sent to the model ("none": none)."""
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise BadRequest("tool_choice: only auto and none are supported.")
    given = body.get("tools")
    if given is None or choice == "none":
        return ()
    if not isinstance(given, list):
        raise InvalidInput("tools: must be a list.")
    checked: list[dict[str, Any]] = []
    for i, tool in enumerate(given):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise BadRequest(f"tools[{i}].type: only function tools are supported.")
        if not isinstance(function, dict):
            raise InvalidInput(f"tools[{i}].function: required.")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise InvalidInput(f"tools[{i}].function.name: 1-64 letters, digits, _ or -.")
        if name in OWN_TOOLS:
            raise BadRequest(f"tools[{i}].function.name: {name} is memchat's own tool.")
        if any(t["function"]["name"] == name for t in checked):
            raise BadRequest(f"tools[{i}].function.name: {name} is given twice.")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise InvalidInput(f"tools[{i}].function.parameters: must be a JSON Schema object.")
        sent: dict[str, Any] = {
            "name": name,
            "parameters": storable_json(f"tools[{i}].function.parameters", parameters),
        }
        if isinstance(function.get("description"), str):
            description = function["description"]
            sent["description"] = storable(f"tools[{i}].function.description", description)
        if isinstance(function.get("strict"), bool):
            sent["strict"] = function["strict"]
        checked.append({"type": "function", "function": sent})
    return tuple(checked)


def sampling_of(body: dict[str, Any]) -> Sampling:
    """The request's sampling fields (422 naming one out of its range)."""
    lengths = [
        _integer(body, name, 1, 2**31 - 1) for name in ("max_tokens", "max_completion_tokens")
    ]
    given = [length for length in lengths if length is not None]
    return Sampling(
        max_tokens=min(given) if given else None,
        temperature=_number(body, "temperature", *sampling.TEMPERATURE),
        top_p=_number(body, "top_p", *sampling.TOP_P),
        stop=_stop(body.get("stop")),
        seed=_integer(body, "seed", *sampling.SEED),
        presence_penalty=_number(body, "presence_penalty", *sampling.PENALTY),
        frequency_penalty=_number(body, "frequency_penalty", *sampling.PENALTY),
    )


def _number(body: dict[str, Any], name: str, least: float, most: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not least <= value <= most:
        raise InvalidInput(f"{name}: must be a number from {least:g} to {most:g}.")
    return float(value)


def _integer(body: dict[str, Any], name: str, least: int, most: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise InvalidInput(f"{name}: must be an integer from {least} to {most}.")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    try:
        stop = sampling.stop_sequences(value)
    except ValueError as exc:
        raise InvalidInput(f"stop: {exc}.") from None
    return tuple(storable(f"stop[{i}]", item) for i, item in enumerate(stop))


def _metadata(body: dict[str, Any]) -> uuid.UUID | None:
    metadata = body.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise InvalidInput("metadata: must be an object of strings.")
    value = metadata.get("session_id")
    if value is None:
        return None
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise BadRequest("metadata.session_id: must be a session's UUID.") from None


def _options(body: dict[str, Any]) -> dict[str, Any]:
    """memchat's own options (`"memchat": {...}`, the SDKs' extra_body)."""
    options = body.get("memchat")
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise InvalidInput("memchat: must be an object.")
    unknown = sorted(set(options) - {"search_memory", "client_message_id", "suggest"})
    if unknown:
        raise InvalidInput(
            f"memchat.{unknown[0]}: not an option; use search_memory, client_message_id or suggest."
        )
    return options


def _flag(options: dict[str, Any], name: str) -> bool | None:
    """A boolean option (None: not given, the server's setting applies)."""
    value = options.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidInput(f"memchat.{name}: must be true or false.")
    return value


def _client_message_id(options: dict[str, Any]) -> str | None:
    value = options.get("client_message_id")
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        raise InvalidInput("memchat.client_message_id: 1 to 128 characters.")
    return value


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise InvalidInput("stream_options: must be an object.")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise InvalidInput("stream_options.include_usage: must be true or false.")
    return include


# ----------------------------------------------------------- the answer


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(result: ChatResult) -> dict[str, int]:
    prompt, completion = result.usage["prompt_tokens"], result.usage["completion_tokens"]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def tool_calls(result: ChatResult) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in result.tool_calls
    ]


def finish_reason(result: ChatResult) -> str:
    return "tool_calls" if result.tool_calls else "stop"


def memchat_info(result: ChatResult) -> dict[str, Any]:
    """The answer's top-level `memchat` object (SDKs ignore it): what memory did."""
    return {
        "session_id": str(result.session_id),
        "agent_name": result.agent_name,
        "model": result.model,
        "message_id": result.message_id,
        "user_message_id": result.user_message_id,
        "replayed": result.replayed,
        "memory": result.memory,
        "search_memory": result.memory["search_memory"],
        "suggestions": result.suggestions,
    }


def completion(result: ChatResult, request: CompletionRequest) -> dict[str, Any]:
    """The `chat.completion` body of a turn."""
    message: dict[str, Any] = {"role": "assistant", "content": result.answer, "refusal": None}
    if result.tool_calls:
        message["content"] = result.answer or None
        message["tool_calls"] = tool_calls(result)
    return {
        "id": new_id(),
        "object": "chat.completion",
        "created": now(),
        "model": request.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(result),
            }
        ],
        "usage": usage(result),
        "memchat": memchat_info(result),
    }


def memory_headers(session_id: str, memory: dict[str, Any]) -> dict[str, str]:
    """What memory did, as response headers (known once the memory is loaded)."""
    return {
        "X-Memchat-Session-ID": session_id,
        "X-Session-ID": session_id,
        "X-Memchat-Context-Tokens": str(memory.get("context_tokens", 0)),
        "X-Memchat-Recalled": str(len(memory.get("recalled") or [])),
    }
